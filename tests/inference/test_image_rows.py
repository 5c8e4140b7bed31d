"""Spark image rows scored call by call (real Keras models, no Spark): a batch's images
are converted (BGR to RGB, cast) when a model call takes them, not all at once, and the
next call's rows are made while the model computes (issue 47, item 3); the predictions
are bit-identical to the model on the converted arrays, and a bad image is still an
invalid row with its reason that costs no other row."""

from __future__ import annotations

import threading
import time
import tracemalloc
import types

import keras
import numpy as np
import pyarrow as pa
import pytest
from keras import layers

from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.images import ImageRows
from spark_keras.inference.predictor import Predictor
from spark_keras.inference.specs import TensorSpec
from spark_keras.inference.walk import read_column
from tests import oom_models

IMAGE_TYPE = pa.struct([("origin", pa.string()), ("height", pa.int32()), ("width", pa.int32()),
                        ("nChannels", pa.int32()), ("mode", pa.int32()), ("data", pa.binary())])
MODES = {1: 0, 3: 16, 4: 24}  # channels -> OpenCV type


def image_column(pixels: np.ndarray, damaged=(), null=()) -> pa.Array:
    """Spark image rows of ``pixels`` (n, H, W, C) as stored (BGR(A) bytes); rows in
    ``damaged`` lose a byte, rows in ``null`` are null."""
    n, h, w, c = pixels.shape
    rows = []
    for i in range(n):
        data = pixels[i].tobytes()
        rows.append(None if i in null else {"origin": f"file:/{i}.png", "height": h, "width": w,
                                            "nChannels": c, "mode": MODES[c],
                                            "data": data[:-1] if i in damaged else data})
    return pa.array(rows, IMAGE_TYPE)


def as_rgb(stored: np.ndarray) -> np.ndarray:
    """BGR(A) as RGB(A) float32, the way keras.utils.load_img + img_to_array give them."""
    c = stored.shape[-1]
    order = {1: [0], 3: [2, 1, 0], 4: [2, 1, 0, 3]}[c]
    return stored[..., order].astype("float32")


def cnn(size: int, channels: int) -> keras.Model:
    keras.utils.set_random_seed(3)
    inp = keras.Input((size, size, channels), name="image")
    x = layers.Conv2D(4, 3, activation="relu")(layers.Rescaling(1 / 255)(inp))
    return keras.Model(inp, layers.Dense(3)(layers.GlobalAveragePooling2D()(x)))


def handle(model):
    return types.SimpleNamespace(predictor=Predictor(model), preprocess=None)


def test_image_rows_are_converted_call_by_call_with_bit_identical_predictions():
    """300 images of 32 x 32 x 3 in one batch, calls of 16: the converted rows alive at
    once are a few calls' (numpy's allocations, traced), not the batch's 3.5 MB of
    float32 (before: the batch converted whole, plus two uint8 copies); the damaged and
    the null image are invalid rows with their reasons; every other prediction equals
    the model's on the converted arrays in the same calls, bit for bit."""
    n, size, batch = 300, 32, 16
    stored = np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    col = image_column(stored, damaged={7}, null={150})
    model = cnn(size, 3)
    h = handle(model)
    score(h, from_arrow(["image"], [col.slice(0, 4)]), batch_size=batch)  # traced before measuring
    tracemalloc.start()
    try:
        out = score(h, from_arrow(["image"], [col]), batch_size=batch, on_invalid="null", reasons=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.flatnonzero(out.invalid).tolist() == [7, 150]
    assert "has 3071 data bytes for 32 x 32 x 3" in out.reasons[7] and "null image" in out.reasons[150]
    keep = ~out.invalid
    want = h.predictor([as_rgb(stored[keep])], batch)[0]
    np.testing.assert_array_equal(out.outputs[0], want)
    whole = int(keep.sum()) * size * size * 3 * 4
    assert peak < whole / 3, (peak, whole)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_image_rows_slice_as_the_converted_array(channels):
    stored = np.random.default_rng(channels).integers(0, 256, (9, 5, 4, channels), dtype=np.uint8)
    read = read_column("image", image_column(stored, damaged={2}), TensorSpec("image", (5, 4, channels),
                                                                            "float32"))
    keep = ~read.invalid
    rows = read.values(keep)
    want = as_rgb(stored[keep])
    assert isinstance(rows, ImageRows) and rows.shape == want.shape and len(rows) == 8
    np.testing.assert_array_equal(np.asarray(rows), want)
    np.testing.assert_array_equal(rows[1:6], want[1:6])
    np.testing.assert_array_equal(rows[3], want[3])
    np.testing.assert_array_equal(rows[np.array([5, 0, 5])], want[[5, 0, 5]])
    np.testing.assert_array_equal(rows[np.arange(8) % 3 == 0], want[np.arange(8) % 3 == 0])
    assert rows[4:4].shape == (0, 5, 4, channels) and rows.dtype == np.float32


class Recorded:
    """Rows made when sliced (``rows_on_demand``, as :class:`ImageRows`), recording for
    each slice its first row, the thread that made it and when it started."""

    rows_on_demand = True

    def __init__(self, x: np.ndarray) -> None:
        self.x, self.shape, self.dtype, self.made = x, x.shape, x.dtype, []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index):
        start = index.start if isinstance(index, slice) else None
        self.made.append((start, threading.current_thread().name, time.monotonic()))
        return self.x[index]


def test_the_next_calls_rows_are_made_while_the_model_computes():
    """A model whose every call takes 0.2 s (a sleep in its graph, recording when each
    call's compute ended): the rows of call k + 1 are made in the background, before
    call k's compute ended; the predictions are the model's on the same calls."""
    import tensorflow as tf

    ended = []

    def slow(x):
        time.sleep(0.2)
        ended.append((len(x), time.monotonic()))
        return x

    keras.utils.set_random_seed(4)
    inp = keras.Input((4,), name="x")
    waited = layers.Lambda(lambda t: tf.reshape(tf.numpy_function(slow, [t], tf.float32), tf.shape(t)))(inp)
    model = keras.Model(inp, layers.Dense(2)(waited))
    predictor = Predictor(model)
    x = np.random.default_rng(5).standard_normal((40, 4)).astype("float32")
    predictor([x[:10]], 10)  # traced
    ended.clear()
    rows = Recorded(x)
    out = predictor([rows], 10)[0]
    np.testing.assert_array_equal(out, predictor([x], 10)[0])
    assert [start for start, _, _ in rows.made] == [0, 10, 20, 30]
    assert [n for n, _ in ended[:4]] == [10, 10, 10, 10]
    for k in range(1, 4):
        _, thread, started = rows.made[k]
        assert thread.startswith("spark_keras_ahead"), rows.made
        assert started < ended[k - 1][1], (k, rows.made, ended)


@pytest.mark.parametrize("on_invalid", ["null", "error"])
def test_image_calls_that_run_out_of_memory_still_score_every_row_exactly(on_invalid):
    """A model whose calls of more than 20 rows run out of memory, on 100 image rows in
    calls of 64: the rows prepared for the next call of 64 are not the ones asked for
    after the failed call; every row scored as the model scores its converted image
    alone (not as spark_keras's own predictor does: it would share a bug)."""
    keras.utils.set_random_seed(12)
    inp = keras.Input((6, 6, 3), name="image")
    flat = oom_models.OutOfMemoryAbove(20, 1e9, name="oom")(layers.Flatten()(inp))
    model = keras.Model(inp, layers.Dense(2)(flat))
    stored = np.random.default_rng(6).integers(0, 256, (100, 6, 6, 3), dtype=np.uint8)
    h = handle(model)
    out = score(h, from_arrow(["image"], [image_column(stored)]), batch_size=64,
                on_invalid=on_invalid)
    assert out.invalid is None or not out.invalid.any()
    assert h.predictor.call_sizes.info() == {"(6, 6, 3)": 16}  # 64 and 32 ran out
    rgb = as_rgb(stored)
    want = np.concatenate([model(rgb[i:i + 1], training=False).numpy() for i in range(100)])
    np.testing.assert_allclose(out.outputs[0], want, rtol=1e-6, atol=1e-5)
