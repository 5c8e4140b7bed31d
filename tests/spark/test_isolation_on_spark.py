"""One bad row must not kill the job (real Spark, real models): rows that make the model
or the preprocess function raise are isolated by every Spark front-end under
``on_invalid="null"``, named under ``"error"``, and bounded by ``max_invalid``."""

from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from tests import models
from tests.conftest import make_spark


def _no_negatives(batch: pd.DataFrame) -> np.ndarray:
    """A preprocess function that raises on a batch holding a negative value."""
    v = batch["v"].to_numpy(dtype="float64")
    if (v < 0).any():
        raise ValueError(f"cannot take a negative value ({int((v < 0).sum())} in this batch)")
    return np.stack([v, 2 * v, v ** 2], axis=1).astype("float32")


class Case:
    """A model, a frame's rows (``id`` first), the ids the model (or ``preprocess``)
    raises on, what the reason says, and each good row's expected prediction."""

    def __init__(self, name, model, schema, rows, bad, says, expected, preprocess=None):
        self.name, self.model, self.schema, self.rows = name, model, schema, rows
        self.bad, self.says, self.expected, self.preprocess = bad, says, expected, preprocess


def _cases() -> list[Case]:
    rng = np.random.default_rng(7)
    png = models.image_bytes_model()
    images = models.png_bytes(60)
    bad_png = [3, 17, 44]
    content = [b"\x89PNG broken" if i in bad_png else b for i, b in enumerate(images)]

    asserting = models.asserting_mlp(limit=10.0)
    x = rng.uniform(0, 5, (80, 4)).astype("float32")
    bad_assert = [0, 41, 79]
    x[bad_assert, 3] = 77.0

    positional = models.positional_model(max_length=16)
    lengths = rng.integers(2, 17, 50)
    bad_long = [5, 30]
    lengths[bad_long] = [17, 33]
    tokens = [rng.integers(1, 9, n).astype("int32") for n in lengths]

    mlp = models.mlp(n_features=3)
    v = rng.uniform(0, 1, 1000)
    bad_v = [123, 876]
    v[bad_v] = -1.0

    def one(model, row):
        return model(row[None], training=False).numpy()[0]

    return [
        Case("png", png, "id long, content binary", list(enumerate(content)), bad_png,
             "model: InvalidArgumentError: ",
             {i: one(png, np.array([b], dtype=object)) for i, b in enumerate(content)
              if i not in bad_png}),
        Case("assert", asserting, "id long, features array<float>",
             [(i, r.tolist()) for i, r in enumerate(x)], bad_assert, "value over the limit",
             {i: one(asserting, r) for i, r in enumerate(x) if i not in bad_assert}),
        Case("gather", positional, "id long, tokens array<int>",
             [(i, t.tolist()) for i, t in enumerate(tokens)], bad_long, "is not in [0, 16)",
             {i: one(positional, t) for i, t in enumerate(tokens) if i not in bad_long}),
        Case("preprocess", mlp, "id long, v double", [(i, float(a)) for i, a in enumerate(v)],
             bad_v, "preprocess: ValueError: cannot take a negative value",
             {i: one(mlp, np.array([a, 2 * a, a * a], "float32")) for i, a in enumerate(v)
              if i not in bad_v}, preprocess=_no_negatives),
    ]


CASES = _cases()


@pytest.fixture(scope="module")
def handles(spark):
    made = {c.name: sk.BroadcastModel(spark, c.model, preprocess=c.preprocess) for c in CASES}
    yield made
    for bm in made.values():
        bm.destroy()


def _frame(spark, case, partitions=3):
    return spark.createDataFrame(case.rows, case.schema).repartition(partitions)


def _check(case, rows, prediction="prediction", error="error"):
    """Row count unchanged, exactly the bad rows null with a reason naming the cause,
    every other row the model's on that row alone (within 1e-5)."""
    assert sorted(r.id for r in rows) == list(range(len(case.rows)))
    null = sorted(r.id for r in rows if r[prediction] is None)
    assert null == case.bad, (case.name, null)
    for r in rows:
        if r.id in case.bad:
            if error:
                assert case.says in r[error], (case.name, r[error])
        else:
            np.testing.assert_allclose(np.ravel(r[prediction]), np.ravel(case.expected[r.id]),
                                       atol=1e-5, err_msg=case.name)
            assert not error or r[error] is None


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_transform_isolates_the_rows_that_raise(spark, handles, case):
    bm = handles[case.name]
    col = case.schema.split(", ")[1].split()[0]
    rows = bm.transform(_frame(spark, case), col, on_invalid="null", error_col="error").collect()
    _check(case, rows)


@pytest.mark.slow  # 14 s of make test's 15 min
def test_predict_udf_and_predict_partition_isolate_too(spark, handles):
    case = CASES[0]  # the corrupt PNGs
    bm = handles[case.name]
    df = _frame(spark, case)
    rows = df.select("id", bm.predict_udf(on_invalid="null")("content").alias("prediction")).collect()
    _check(case, rows, error=None)
    got = df.select("id", "content").rdd.mapPartitions(
        lambda part: ((r.id, p) for r, p in zip(*_tee_rows(part, bm)))).collect()
    _check(case, [_Row(id=i, prediction=p) for i, p in got], error=None)


def _tee_rows(part, bm):
    rows = list(part)
    return rows, list(bm.predict_partition([r.content for r in rows], on_invalid="null"))


class _Row(dict):
    __getattr__ = dict.__getitem__


def test_keras_transformer_isolates_and_counts_them_in_observe(spark, handles):
    from pyspark.sql import Observation

    from spark_keras.ml import KerasTransformer

    case = CASES[1]  # the tf assert
    stage = KerasTransformer(model=case.model, inputCol="features", onInvalid="null",
                             errorCol="error")
    _check(case, stage.transform(_frame(spark, case)).collect())
    seen = Observation("isolated")
    handles[case.name].transform(_frame(spark, case), "features", on_invalid="null",
                                 observe=seen).collect()
    assert seen.get["invalid_rows"] == len(case.bad) and seen.get["rows"] == len(case.rows)
    assert seen.get["invalid_by_reason"] == {"model: InvalidArgumentError": len(case.bad)}


def test_on_invalid_error_names_the_row_column_and_message(spark, handles):
    case = CASES[0]
    df = spark.createDataFrame(case.rows, case.schema).coalesce(1)
    with pytest.raises(Exception) as info:
        handles[case.name].transform(df, "content").collect()
    text = str(info.value)
    assert "ModelCallError: the model raised on row 3 of this batch (column 'content'): " \
           "InvalidArgumentError: " in text, text[:3000]


@pytest.mark.slow  # 16 s of make test's 15 min
def test_max_invalid_both_ways(spark, handles):
    case = CASES[3]  # 2 of 1000 rows raise in preprocess
    bm = handles[case.name]
    df = spark.createDataFrame(case.rows, case.schema).coalesce(1)
    rows = bm.transform(df, "v", on_invalid="null", max_invalid=2).collect()
    assert sum(r.prediction is None for r in rows) == 2
    assert len(bm.transform(df, "v", on_invalid="null", max_invalid=0.01).collect()) == 1000
    with pytest.raises(Exception) as info:
        bm.transform(df, "v", on_invalid="null", max_invalid=1).collect()
    text = str(info.value)
    assert "InvalidRowsError: max_invalid=1 passed: 2 of " in text, text[:3000]
    assert "preprocess: ValueError: cannot take a negative value" in text
    with pytest.raises(Exception, match=r"max_invalid=0.001 passed: 2 of 1000 rows"):
        bm.transform(df, "v", on_invalid="null", max_invalid=0.001).collect()
    with pytest.raises(Exception, match="max_invalid=1 passed"):
        df.select(bm.predict_udf(on_invalid="null", max_invalid=1)("v")).collect()
    with pytest.raises(sk.ArgumentError, match="max_invalid"):
        bm.transform(df, "v", on_invalid="null", max_invalid=-1)
    with pytest.raises(sk.ArgumentError, match="max_invalid.*on_invalid='null'"):
        bm.transform(df, "v", max_invalid=5)


@pytest.mark.slow  # a streaming query of four micro-batches
def test_a_stream_that_meets_bad_rows_keeps_running(spark, handles, tmp_path):
    case = CASES[1]  # the tf assert
    source = tmp_path / "in"
    source.mkdir()
    bm = handles[case.name]
    stream = spark.readStream.schema(case.schema).option("maxFilesPerTrigger", 1) \
        .parquet(str(source))
    query = (bm.transform(stream, "features", on_invalid="null", error_col="error")
             .writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        for i, part in enumerate(np.array_split(np.arange(len(case.rows)), 4)):
            # bad rows in the first and the last file
            table = pa.table({"id": pa.array(part, pa.int64()),
                              "features": pa.array([case.rows[j][1] for j in part],
                                                   pa.list_(pa.float32()))})
            pq.write_table(table, tmp_path / f"part-{i}.parquet")
            os.rename(tmp_path / f"part-{i}.parquet", source / f"part-{i}.parquet")
            query.processAllAvailable()
            assert query.isActive and query.exception() is None
        assert query.lastProgress["batchId"] >= 3
    finally:
        query.stop()
    _check(case, spark.read.parquet(str(tmp_path / "out")).collect())


@pytest.mark.slow  # its own local-cluster session: about a minute
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_isolation_across_executors_on_local_cluster(tmp_path):
    session = make_spark("local-cluster[2,1,1024]", str(tmp_path), **{
        "spark.task.maxFailures": "4"})
    try:
        for case in CASES:
            bm = sk.BroadcastModel(session, case.model, preprocess=case.preprocess)
            col = case.schema.split(", ")[1].split()[0]
            started = time.perf_counter()
            rows = bm.transform(_frame(session, case, partitions=4), col, on_invalid="null",
                                error_col="error").collect()
            _check(case, rows)
            assert time.perf_counter() - started < 300
            bm.destroy()
    finally:
        session.stop()
