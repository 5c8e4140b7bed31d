"""RGBA and grayscale images from Spark's image data source: the pixel values the engine
gives are the ones ``keras.utils.load_img`` decodes from the same PNG bytes, on the
driver (the engine on collected rows) and in the workers (a model returning its input)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import model_inputs
from spark_keras.inference.signature import Signature, TensorSpec

pytestmark = pytest.mark.timeout(600)

SHAPE = (4, 5)  # height, width: not square, so a transposed image cannot pass
CASES = {"alpha": (4, "rgba"), "gray": (1, "grayscale")}  # file: (channels, keras color mode)
IMAGE_ROW = pa.struct([("origin", pa.string()), ("height", pa.int32()), ("width", pa.int32()),
                       ("nChannels", pa.int32()), ("mode", pa.int32()), ("data", pa.binary())])


@pytest.fixture(scope="module")
def pngs(tmp_path_factory):
    """A folder of one RGBA and one grayscale PNG; the arrays keras decodes from each
    file's bytes, by file name."""
    import keras
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(11)
    loaded = {}
    for name, (channels, mode) in CASES.items():
        shape = (*SHAPE, channels) if channels > 1 else SHAPE
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(buffer, format="PNG")
        (folder / f"{name}.png").write_bytes(buffer.getvalue())
        image = keras.utils.load_img(io.BytesIO(buffer.getvalue()), color_mode=mode)
        loaded[f"{name}.png"] = keras.utils.img_to_array(image)
    return folder, loaded


def _name(origin: str) -> str:
    return origin.rsplit("/", 1)[-1]


def test_rgba_and_grayscale_image_rows_as_the_engine_reads_them(spark, pngs):
    folder, loaded = pngs
    rows = [r.image.asDict() for r in spark.read.format("image").load(str(folder)).collect()]
    assert sorted((_name(r["origin"]), r["nChannels"], r["mode"]) for r in rows) == \
        [("alpha.png", 4, 24), ("gray.png", 1, 0)]  # CV_8UC4 (BGRA), CV_8UC1
    column = pa.array([{**r, "data": bytes(r["data"])} for r in rows], IMAGE_ROW)
    for channels, _ in CASES.values():
        sig = Signature((TensorSpec("img", (*SHAPE, channels), "float32"),),
                        (TensorSpec("prediction", (1,), "float32"),), None, None)
        (x,), invalid = model_inputs(from_arrow(["image"], [column]), sig, "null")
        [kept] = [r for r, bad in zip(rows, invalid) if not bad]
        want = loaded[_name(kept["origin"])]
        assert want.shape == (*SHAPE, channels) and x.dtype == np.float32
        np.testing.assert_array_equal(x[0], want)


def test_rgba_and_grayscale_pixels_through_the_workers(spark, pngs):
    import keras

    folder, loaded = pngs
    df = spark.read.format("image").load(str(folder))
    for channels, _ in CASES.values():
        echo = keras.Sequential([keras.Input((*SHAPE, channels)), keras.layers.Flatten()])
        bm = sk.BroadcastModel(spark, echo)
        try:
            out = bm.transform(df, "image", on_invalid="null").select("image.origin",
                                                                       "prediction").collect()
        finally:
            bm.destroy()
        got = {_name(r.origin): r.prediction for r in out}
        [(name, pixels)] = [(n, p) for n, p in got.items() if p is not None]
        assert loaded[name].shape[-1] == channels, name
        np.testing.assert_array_equal(np.array(pixels, np.float32), loaded[name].reshape(-1))
