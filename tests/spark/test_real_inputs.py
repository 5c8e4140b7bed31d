"""Text, bytes and string outputs through the one engine: Spark ``transform``,
``predict_udf`` and ``predict_partition``, ``pool_predict`` and ``predict_dask``; the
model called directly on the same data is the reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

import spark_keras as sk
from spark_keras.multiprocessing import pool_predict
from tests import models
from tests.conftest import build_records, builds_by_worker, text_frame

pytestmark = pytest.mark.timeout(600)

TEXTS = models.SENTENCES + ["an unknown sentence", "", "cat"]


def direct(model, values, shape=(1,)):
    got = model(tf.constant(np.array(values, object).reshape((-1, *shape))), training=False)
    return {k: v.numpy() for k, v in got.items()} if isinstance(got, dict) else got.numpy()


@pytest.fixture(scope="module")
def text_model():
    return models.text_classifier()


@pytest.fixture(scope="module")
def text_bm(spark, text_model):
    handle = sk.BroadcastModel(spark, text_model)
    yield handle
    handle.destroy()


def test_a_string_column_feeds_a_text_model_everywhere(spark, text_bm, text_model, build_log):
    want = direct(text_model, TEXTS)
    df = text_frame(spark, TEXTS).repartition(2)
    got = [r.prediction for r in text_bm.transform(df, "text").orderBy("id").collect()]
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    got = [r.p for r in df.select("id", text_bm.predict_udf()("text").alias("p")).orderBy("id").collect()]
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    rows = text_frame(spark, TEXTS).orderBy("id").select("text").rdd.mapPartitions(
        text_bm.predict_partition).collect()
    np.testing.assert_allclose(np.array(rows), want, atol=1e-5)
    # built once per worker, on the executor's shared payload file (TextVectorization's
    # vocabulary travels in the payload)
    assert builds_by_worker(build_log, text_bm.key) and \
        set(builds_by_worker(build_log, text_bm.key).values()) == {1}
    records = build_records(build_log, text_bm.key)
    assert records and all(r["shared"] for r in records), records


def test_null_and_wrongly_typed_text(spark, text_bm, text_model):
    texts = ["the cat sat on the mat", None, "birds sing at dawn"]
    df = text_frame(spark, texts).coalesce(1)
    pattern = r"column 'text': null value\(s\), first at row 1 of this batch"
    with pytest.raises(Exception, match=pattern):
        text_bm.transform(df, "text").collect()
    with pytest.raises(Exception, match=pattern):
        df.select(text_bm.predict_udf()("text")).collect()
    want = direct(text_model, [texts[0], texts[2]])
    transformed = text_bm.transform(df, "text", on_invalid="null").orderBy("id")
    selected = df.orderBy("id").select(text_bm.predict_udf(on_invalid="null")("text").alias("p"))
    for got in ([r.prediction for r in transformed.collect()], [r.p for r in selected.collect()]):
        assert got[1] is None
        np.testing.assert_allclose(np.array([got[0], got[2]]), want, atol=1e-5)
    numbers = spark.createDataFrame([(0, 1.5)], "id long, text double")
    with pytest.raises(Exception, match=r"column 'text' has type double; the model input 'text' "
                                        r"expects strings or bytes \(string of shape \(1,\) per row\)"):
        text_bm.transform(numbers, "text", on_invalid="null").collect()
    mlp = sk.BroadcastModel(spark, models.mlp(1, 4, 1))
    try:
        with pytest.raises(Exception, match=r"column 'text' has type string; the model input .* "
                                            r"expects numbers \(float32 of shape \(1,\) per row\)"):
            mlp.transform(text_frame(spark, TEXTS), "text").collect()
    finally:
        mlp.destroy()


def test_string_outputs_are_string_columns(spark):
    model = models.text_labeller()
    words = ["cat", "dog", None, "fox", "zebra"]
    want = direct(model, [w for w in words if w is not None])
    labels = [x.decode() for x in want["label"]]
    bm = sk.BroadcastModel(spark, model)
    try:
        df = spark.createDataFrame([(i, w) for i, w in enumerate(words)], "id long, word string")
        out = bm.transform(df, "word", on_invalid="null")
        assert out.schema["prediction"].dataType.simpleString() == \
            "struct<label:string,logits:array<float>>"
        rows = [r.prediction for r in out.orderBy("id").collect()]
        assert rows[2] is None
        assert [r.label for r in rows if r is not None] == labels
        np.testing.assert_allclose([r.logits for r in rows if r is not None], want["logits"], atol=1e-5)
        udf = bm.predict_udf(on_invalid="null")
        udf_rows = [r.p for r in df.orderBy("id").select(udf("word").alias("p")).collect()]
        assert [r.label if r else None for r in udf_rows] == labels[:2] + [None] + labels[2:]
    finally:
        bm.destroy()
    got = pool_predict(model, pd.DataFrame({"word": words}), processes=1, on_invalid="null")
    assert list(got["label"]) == labels[:2] + [None] + labels[2:]


def test_binary_columns_feed_an_image_model(spark, tmp_path):
    model = models.image_bytes_model()
    images = models.png_bytes(6)
    want = direct(model, images, shape=())
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, data in enumerate(images):
        (folder / f"{i}.png").write_bytes(data)
    bm = sk.BroadcastModel(spark, model)
    try:
        files = spark.read.format("binaryFile").load(str(folder))
        got = {r.path.rsplit("/", 1)[-1]: r.prediction for r in bm.transform(files, "content").collect()}
        np.testing.assert_allclose([got[f"{i}.png"] for i in range(6)], want, atol=1e-5)
        path = str(tmp_path / "images.parquet")
        spark.createDataFrame([(i, bytearray(b)) for i, b in enumerate(images)],
                              "id long, png binary").write.parquet(path)
        table = spark.read.parquet(path)
        got = [r.p for r in table.select("id", bm.predict_udf()("png").alias("p")).orderBy("id").collect()]
        np.testing.assert_allclose(got, want, atol=1e-5)
    finally:
        bm.destroy()
    np.testing.assert_allclose(pool_predict(model, np.array(images, object), processes=1), want,
                               atol=1e-5)


@pytest.mark.slow  # 9 s of make test's 15 min
def test_text_and_preprocess_through_dask(text_model):
    pytest.importorskip("distributed")
    import dask
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    from spark_keras.dask import predict_dask, ship

    pdf = pd.DataFrame({"text": TEXTS[:4] + [None] + TEXTS[4:]})
    want = direct(text_model, [t for t in pdf["text"] if t is not None])
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client, \
            ship(client, text_model) as handle:
        with dask.config.set({"dataframe.convert-string": False}):
            frame = dd.from_pandas(pdf, npartitions=2)
        got = predict_dask(handle, frame, on_invalid="null").compute().to_numpy()
        mlp = models.mlp(3, 4, 2)
        x = np.arange(9, dtype="float32").reshape(3, 3)
        csv = dd.from_pandas(pd.DataFrame({"csv": [",".join(map(str, r)) for r in x.tolist()],
                                           "other": [1, 2, 3]}), npartitions=2)
        with ship(client, mlp, preprocess=_decode_csv) as parsing:
            parsed = predict_dask(parsing, csv, columns=["csv"]).compute().to_numpy()
    assert np.isnan(got[4]).all()
    np.testing.assert_allclose(np.delete(got, 4, axis=0), want, atol=1e-5)
    np.testing.assert_allclose(parsed, mlp(x, training=False).numpy(), atol=1e-5)


def _sequences(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(int(k), 3)).astype("float32") for k in rng.integers(1, 9, n)]


@pytest.mark.parametrize("masking", [False, True], ids=["plain", "masked"])
def test_sequences_of_any_length(spark, masking):
    model = models.sequence_model(masking)
    seqs = _sequences(12)
    seqs[3][-2:] = 0.0  # trailing zeros: masked steps in the masked model
    want = np.array([model(s[None], training=False).numpy()[0] for s in seqs])
    bm = sk.BroadcastModel(spark, model)
    try:
        rows = [(i, s.tolist()) for i, s in enumerate(seqs)] + [(99, None)]
        df = spark.createDataFrame(rows, "id long, seq array<array<float>>").repartition(2)
        got = [r.prediction for r in bm.transform(df, "seq", batch_size=4, on_invalid="null")
               .orderBy("id").collect()]
        assert got[-1] is None
        np.testing.assert_allclose(np.array(got[:-1]), want, atol=1e-5)
        got = [r.p for r in df.select("id", bm.predict_udf(on_invalid="null")("seq").alias("p"))
               .orderBy("id").collect()]
        np.testing.assert_allclose(np.array(got[:-1]), want, atol=1e-5)
        with pytest.raises(Exception, match=r"column 'seq': null value\(s\)"):
            bm.transform(df, "seq").collect()
    finally:
        bm.destroy()
    flat = pd.DataFrame({"seq": [s.reshape(-1) for s in seqs]})
    np.testing.assert_allclose(pool_predict(model, flat, processes=1), want, atol=1e-5)


def test_images_of_any_size_through_a_fully_convolutional_model(spark):
    model = models.fully_convolutional()
    rng = np.random.default_rng(5)
    images = [rng.random((h, w, 3), dtype=np.float32) for h, w in [(4, 5), (6, 6), (4, 5), (3, 8)]]
    want = [model(i[None], training=False) for i in images]
    bm = sk.BroadcastModel(spark, model)
    try:
        df = spark.createDataFrame([(k, i.tolist()) for k, i in enumerate(images)],
                                   "id long, image array<array<array<float>>>")
        out = bm.transform(df, "image")
        assert out.schema["prediction"].dataType.simpleString() == \
            "struct<pixels:array<array<array<float>>>,pooled:float>"
        for row, w in zip(out.orderBy("id").collect(), want):
            np.testing.assert_allclose(np.array(row.prediction.pixels), w["pixels"].numpy()[0], atol=1e-5)
            np.testing.assert_allclose(row.prediction.pooled, w["pooled"].numpy()[0, 0], atol=1e-5)
    finally:
        bm.destroy()


def _image_files(folder) -> dict[str, str]:
    """PNG files of several sizes and channel counts; the color mode keras.utils.load_img
    needs for each."""
    from PIL import Image

    rng = np.random.default_rng(6)
    made = {}
    for name, shape, mode in [("a", (8, 8, 3), "rgb"), ("b", (8, 8, 3), "rgb"),
                              ("wide", (8, 12, 3), "rgb"), ("gray", (8, 8), "grayscale"),
                              ("alpha", (8, 8, 4), "rgba")]:
        path = str(folder / f"{name}.png")
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)
        made[path] = mode
    return made


def test_spark_image_rows_are_rgb_arrays_as_keras_loads_them(spark, tmp_path):
    import keras

    files = _image_files(tmp_path)
    # every file as an RGB model takes it: gray and RGBA converted as load_img converts them
    loaded = {p: keras.utils.img_to_array(keras.utils.load_img(p, color_mode="rgb")) for p in files}
    df = spark.read.format("image").load(str(tmp_path))
    fixed = models.mlp(8 * 8 * 3, 4, 2)
    cnn = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), fixed])
    fcn = models.fully_convolutional()
    for model, fits in [(cnn, lambda a: a.shape == (8, 8, 3)), (fcn, lambda a: a.shape[-1] == 3)]:
        bm = sk.BroadcastModel(spark, model)
        try:
            out = bm.transform(df, "image", on_invalid="null").select("image.origin", "prediction").collect()
            udf = df.select("image.origin", bm.predict_udf(on_invalid="null")("image").alias("p")).collect()
            by_udf = {r.origin: r.p for r in udf}
            assert len(out) == len(files)
            for row in out:
                array = loaded[row.origin.replace("file://", "")]
                if not fits(array):
                    assert row.prediction is None and by_udf[row.origin] is None, row.origin
                    continue
                want = model(array[None], training=False)
                if isinstance(want, dict):
                    got, want = row.prediction.pooled, want["pooled"].numpy()[0, 0]
                    np.testing.assert_allclose(by_udf[row.origin].pooled, want, atol=1e-5)
                else:
                    got, want = row.prediction, want.numpy()[0]
                    np.testing.assert_allclose(by_udf[row.origin], want, rtol=1e-5, atol=1e-5)
                # outputs up to ~200 from a batch of other images: float32 rounding
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            if model is cnn:
                with pytest.raises(Exception, match=r"column 'image': the image at row \d+ of this "
                                                    r"batch \(file:.*\.png\) is 8 x 12 x 3; the model "
                                                    r"input takes 8 x 8 x 3"):
                    bm.transform(df.where("image.width = 12"), "image").collect()
        finally:
            bm.destroy()


def _decode_csv(batch: pd.DataFrame) -> np.ndarray:
    """A preprocess function: a string column of comma-separated numbers to features."""
    return np.stack([np.array(t.split(","), "float32") if t is not None else np.full(3, np.nan, "float32")
                     for t in batch["csv"]])


def _fails(batch: pd.DataFrame) -> np.ndarray:
    raise ValueError("cannot parse this")


@pytest.mark.slow  # 16 s of make test's 15 min
def test_preprocess_runs_in_the_workers_before_the_model(spark):
    model = models.mlp(3, 4, 2)
    x = np.arange(12, dtype="float32").reshape(4, 3)
    texts = [",".join(map(str, r)) for r in x.tolist()]
    texts[2] = None  # preprocess gives NaN: an invalid row under the engine's checks
    want = model(x, training=False).numpy()
    df = spark.createDataFrame(list(enumerate(texts)), "id long, csv string").coalesce(1)
    bm = sk.BroadcastModel(spark, model, preprocess=_decode_csv)
    try:
        got = [r.prediction for r in bm.transform(df, "csv", on_invalid="null").orderBy("id").collect()]
        assert got[2] is None
        np.testing.assert_allclose(np.array(got[:2] + got[3:]), want[[0, 1, 3]], atol=1e-5)
        got = [r.p for r in df.orderBy("id").select(bm.predict_udf(on_invalid="null")("csv").alias("p")).collect()]
        np.testing.assert_allclose(np.array(got[:2] + got[3:]), want[[0, 1, 3]], atol=1e-5)
        rows = df.orderBy("id").select("csv").rdd.mapPartitions(
            lambda part: bm.predict_partition(part, on_invalid="null")).collect()
        assert rows[2] is None
        with pytest.raises(Exception, match=r"NaN or infinite value\(s\), first at row 2 of this batch"):
            bm.transform(df, "csv").collect()
    finally:
        bm.destroy()
    from spark_keras.ml import KerasTransformer

    stage = KerasTransformer(model=model, inputCol="csv", preprocess=_decode_csv, onInvalid="null")
    got = [r.prediction for r in stage.transform(df).orderBy("id").collect()]
    assert got[2] is None
    np.testing.assert_allclose(np.array(got[:2] + got[3:]), want[[0, 1, 3]], atol=1e-5)
    failing = sk.BroadcastModel(spark, model, preprocess=_fails)
    try:
        with pytest.raises(Exception, match=r"the preprocess function tests.spark.test_real_inputs."
                                            r"_fails raised on row 0 of this batch \(column 'csv'\): "
                                            r"ValueError: cannot parse this"):
            failing.transform(df, "csv").collect()
    finally:
        failing.destroy()
    assert bm is not None and df.count() == 4  # the workers survive
    got = pool_predict(model, pd.DataFrame({"csv": texts}), processes=1, preprocess=_decode_csv,
                       on_invalid="null")
    assert np.isnan(got[2]).all()
    np.testing.assert_allclose(got[[0, 1, 3]], want[[0, 1, 3]], atol=1e-5)
    with pytest.raises(sk.PreprocessError, match=r"_fails raised on row 0 of this input \(column 'csv'\)"):
        pool_predict(model, pd.DataFrame({"csv": texts}), processes=1, preprocess=_fails)
