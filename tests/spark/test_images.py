"""Images from Spark's image data source read as ``keras.utils.load_img`` +
``img_to_array`` read the same PNG bytes: every channel count converted to the model
input's (``color_mode``), and with ``resize=`` every size resized to the input's
(``target_size``, ``interpolation``); on the driver (the engine on collected rows) and in
the workers (a model returning its input)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import model_inputs
from spark_keras.inference.signature import Signature, TensorSpec
from tests import models

pytestmark = pytest.mark.timeout(600)

SHAPE = (4, 5)  # height, width: not square, so a transposed image cannot pass
FILES = {"alpha": 4, "color": 3, "gray": 1}  # file: its channels
COLOR_MODES = {1: "grayscale", 3: "rgb", 4: "rgba"}  # the model's channels: keras's mode
IMAGE_ROW = pa.struct([("origin", pa.string()), ("height", pa.int32()), ("width", pa.int32()),
                       ("nChannels", pa.int32()), ("mode", pa.int32()), ("data", pa.binary())])


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """A folder of one RGBA, one RGB and one grayscale PNG, and each file's bytes."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(11)
    data = {}
    for name, channels in FILES.items():
        shape = (*SHAPE, channels) if channels > 1 else SHAPE
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(buffer, format="PNG")
        (folder / f"{name}.png").write_bytes(buffer.getvalue())
        data[f"{name}.png"] = buffer.getvalue()
    return folder, data


def _keras(data: bytes, channels: int, size=None, interpolation="nearest") -> np.ndarray:
    import keras

    image = keras.utils.load_img(io.BytesIO(data), color_mode=COLOR_MODES[channels],
                                 target_size=size, interpolation=interpolation)
    return keras.utils.img_to_array(image)


def _name(origin: str) -> str:
    return origin.rsplit("/", 1)[-1]


def _signature(shape) -> Signature:
    return Signature((TensorSpec("img", tuple(shape), "float32"),),
                     (TensorSpec("prediction", (1,), "float32"),), None, None)


@pytest.fixture(scope="module")
def rows(spark, pngs):
    folder, _ = pngs
    found = [r.image.asDict() for r in spark.read.format("image").load(str(folder)).collect()]
    assert sorted((_name(r["origin"]), r["nChannels"], r["mode"]) for r in found) == \
        [("alpha.png", 4, 24), ("color.png", 3, 16), ("gray.png", 1, 0)]  # BGRA, BGR, gray
    return sorted(found, key=lambda r: r["origin"])


def _column(rows) -> pa.Array:
    return pa.array([{**r, "data": bytes(r["data"])} for r in rows], IMAGE_ROW)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_every_channel_count_converted_as_load_img(rows, pngs, channels):
    _, data = pngs
    (x,), invalid = model_inputs(from_arrow(["image"], [_column(rows)]),
                                 _signature((*SHAPE, channels)), "null")
    assert invalid is None and x.shape == (3, *SHAPE, channels) and x.dtype == np.float32
    for got, row in zip(x, rows):
        np.testing.assert_array_equal(got, _keras(data[_name(row["origin"])], channels),
                                      err_msg=f"{row['origin']} as {channels} channel(s)")


@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("size", [(7, 9), (3, 2)])  # up and down
def test_resize_equals_load_img_target_size(rows, pngs, interpolation, size):
    _, data = pngs
    for channels in (1, 3, 4):
        (x,), invalid = model_inputs(from_arrow(["image"], [_column(rows)]),
                                     _signature((*size, channels)), "null",
                                     resize=interpolation)
        assert invalid is None
        for got, row in zip(x, rows):
            want = _keras(data[_name(row["origin"])], channels, size, interpolation)
            np.testing.assert_array_equal(got, want, err_msg=f"{row['origin']} {channels}")


def test_another_size_is_invalid_without_resize(spark, rows):
    with pytest.raises(sk.ModelInputError, match=r"is 4 x 5 x \d; the model input takes 8 x 8 "
                                                 r"x 3 \(resize='bilinear' resizes"):
        model_inputs(from_arrow(["image"], [_column(rows)]), _signature((8, 8, 3)))
    with pytest.raises(sk.ArgumentError, match="resize must be None or one of"):
        sk.BroadcastModel(spark, models.mlp(), resize="smooth")  # before anything ships


def test_converted_and_resized_pixels_through_the_workers(spark, pngs):
    folder, data = pngs
    echoed_as_load_img(spark, spark.read.format("image").load(str(folder)), "image", "image.origin", data)


def echoed_as_load_img(spark, df, column: str, origin: str, data: dict[str, bytes]) -> None:
    """A model returning its input, given ``column`` of ``df`` (the files of ``data``, named
    by ``origin``), returns what ``load_img`` + ``img_to_array`` give, converted and resized."""
    import keras

    for shape, resize in (((*SHAPE, 3), None), ((6, 3, 1), "bilinear")):
        echo = keras.Sequential([keras.Input(shape), keras.layers.Flatten()])
        bm = sk.BroadcastModel(spark, echo, resize=resize)
        try:
            out = bm.transform(df, column).select(df[origin].alias("origin"), "prediction").collect()
        finally:
            bm.destroy()
        assert len(out) == len(data)
        for r in out:  # every file, whatever its channels
            want = _keras(data[_name(r.origin)], shape[-1], shape[:2] if resize else None,
                          resize or "nearest")
            np.testing.assert_array_equal(np.array(r.prediction, np.float32), want.reshape(-1))
