"""``buckets`` on Spark: variable-length rows padded into a few lengths by ``transform``,
``predict_udf``, ``predict_partition``, ``KeyedModels``, ``KerasTransformer`` and the score
job, each row's prediction the model's on that row alone (a masked GRU, a
Transformer-style model); refused on the driver, before any task, for a model that would
not ignore the padding."""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.errors import ArgumentError
from spark_keras.ml import KerasTransformer
from tests import models
from tests.conftest import run_score_job
from tests.inference.test_buckets import alone, max_pooled, rows_of, two_sequences_model

pytestmark = pytest.mark.timeout(600)

# (2 steps at least: predict_partition takes a row [[a, b, c]] for a 1-tuple of [a, b, c])
LENGTHS = np.random.default_rng(11).integers(2, 30, 80)
UNMASKED = r"buckets=4: input 'sequence' feeds GRU, and no Masking layer"


@pytest.fixture(scope="module")
def gru():
    """The masked GRU, its rows (a null one among them) and each row's own prediction."""
    model = models.sequence_model(masking=True)
    rows = rows_of(LENGTHS, 11)
    return model, rows, np.array(alone(model, rows))


def sequence_frame(spark, rows, column: str = "sequence", null_at: int | None = None,
                   ids: bool = False):
    """``id long`` and one row of ``rows`` each (floats, or token ids with ``ids``), the row
    ``null_at`` null, in 3 partitions."""
    values = [None if i == null_at else r.tolist() for i, r in enumerate(rows)]
    kind = "array<int>" if ids else "array<array<float>>"
    return spark.createDataFrame(list(enumerate(values)), f"id long, {column} {kind}").repartition(3)


def by_id(rows, field: str = "prediction") -> list:
    return [getattr(r, field) for r in sorted(rows, key=lambda r: r.id)]


def assert_each_rows_own(got: list, want: np.ndarray, null_at: int | None = None) -> None:
    if null_at is not None:
        assert got[null_at] is None
        got, want = got[:null_at] + got[null_at + 1:], np.delete(want, null_at, axis=0)
    np.testing.assert_allclose(np.array(got, dtype="float32"), want, atol=1e-5)


def test_transform_and_predict_udf_give_each_row_its_own_prediction(spark, gru):
    model, rows, want = gru
    df = sequence_frame(spark, rows, null_at=9)
    bm = sk.BroadcastModel(spark, model)
    try:
        got = by_id(bm.transform(df, "sequence", on_invalid="null", buckets=4).collect())
        assert_each_rows_own(got, want, null_at=9)
        udf = bm.predict_udf(on_invalid="null", buckets=[4, 8, 16])  # longer rows: one more bucket
        got = by_id(df.select("id", udf("sequence").alias("prediction")).collect())
        assert_each_rows_own(got, want, null_at=9)
    finally:
        bm.destroy()


def _ids_and_predictions(rows, score):
    """A partition's ids, each with its row's prediction by ``score``."""
    rows = list(rows)
    return zip([r.id for r in rows], score(iter(rows)))


def test_predict_partition_gives_each_row_its_own_prediction(spark, gru):
    model, rows, want = gru
    bm = sk.BroadcastModel(spark, model)
    try:
        score = functools.partial(bm.predict_partition, on_invalid="null", id_col="id", buckets=3)
        pairs = sequence_frame(spark, rows, null_at=9).rdd.mapPartitions(
            functools.partial(_ids_and_predictions, score=score))
        got = [None if p is None else list(p) for _, p in sorted(pairs.collect())]
        assert_each_rows_own(got, want, null_at=9)
    finally:
        bm.destroy()


def test_a_transformer_style_model_with_bucket_lengths(spark):
    model = models.attention_model()
    rows = rows_of(LENGTHS, 12, ids=30)
    want = np.array(alone(model, rows))
    bm = sk.BroadcastModel(spark, model)
    try:
        got = by_id(bm.transform(sequence_frame(spark, rows, "tokens", ids=True), "tokens",
                                 buckets=(8, 16)).collect())
        assert_each_rows_own(got, want)
    finally:
        bm.destroy()


def test_a_model_that_would_not_ignore_the_padding_is_refused_on_the_driver(spark, gru):
    _, rows, _ = gru
    df = sequence_frame(spark, rows)
    bm = sk.BroadcastModel(spark, models.sequence_model(masking=False))
    mlp = sk.BroadcastModel(spark, models.mlp(3, 4, 1))
    pooled = sk.BroadcastModel(spark, max_pooled())  # the mask dropped by GlobalMaxPooling1D
    try:
        with pytest.raises(ArgumentError, match=UNMASKED):
            bm.transform(df, "sequence", buckets=4)  # no action: refused before any task
        with pytest.raises(ArgumentError, match=r"^buckets=4: input 'sequence' is masked, but "
                                                r"GlobalMaxPooling1D 'global_max_pooling1d\w*' after it "
                                                r"does not support masking"):
            pooled.transform(df, "sequence", buckets=4)
        with pytest.raises(ArgumentError, match=UNMASKED):
            bm.predict_udf(buckets=4)
        with pytest.raises(ArgumentError, match=r"buckets must be None, a count"):
            bm.transform(df, "sequence", buckets=[8, 4])
        with pytest.raises(ArgumentError, match=r"has no variable-length input"):
            mlp.predict_udf(buckets=4)
        # no driver there: the task refuses it
        score = functools.partial(bm.predict_partition, id_col="id", buckets=4)
        with pytest.raises(Exception, match=UNMASKED):
            df.rdd.mapPartitions(score).collect()
    finally:
        bm.destroy()
        mlp.destroy()
        pooled.destroy()


def test_two_sequences_of_their_own_lengths_come_back_cut_to_each(spark):
    model = two_sequences_model()
    rng = np.random.default_rng(14)
    first, second = rng.integers(2, 8, 16), rng.integers(2, 14, 16)
    rows_a, rows_b = rows_of(first, 14), rows_of(second, 15)
    df = spark.createDataFrame([(i, a.tolist(), b.tolist()) for i, (a, b) in enumerate(zip(rows_a, rows_b))],
                               "id long, first array<array<float>>, second array<array<float>>").repartition(2)
    bm = sk.BroadcastModel(spark, model)
    try:
        got = by_id(bm.transform(df, ["first", "second"], buckets=2).collect())
    finally:
        bm.destroy()
    for k, want in enumerate(alone(model, rows_a, rows_b)):
        for name in ("first_steps", "second_steps", "cross"):  # (rows of their own input's length)
            np.testing.assert_allclose(np.array(got[k][name], "float32"), want[name], atol=1e-5)


def test_a_row_the_model_raises_on_costs_only_itself(spark):
    model = models.asserting_sequence_model(limit=10.0)
    rows = rows_of(LENGTHS[:30], 13)
    rows[4][0, 0] = 50.0  # raises in the graph
    want = np.array(alone(model, np.delete(rows, 4)))
    bm = sk.BroadcastModel(spark, model)
    try:
        out = bm.transform(sequence_frame(spark, rows), "sequence", on_invalid="null",
                           error_col="error", buckets=3).collect()
        errors = by_id(out, "error")
        assert errors[4].startswith("model: InvalidArgumentError") and errors.count(None) == 29
        got = by_id(out)
        assert got[4] is None
        np.testing.assert_allclose(np.array(got[:4] + got[5:], "float32"), want, atol=1e-5)
    finally:
        bm.destroy()


def test_keyed_models_and_the_ml_stage_take_buckets(spark, gru, tmp_path):
    model, rows, want = gru
    other = models.asserting_sequence_model(limit=100.0)  # another masked GRU
    df = sequence_frame(spark, rows)
    from pyspark.sql import functions as F

    keyed_df = df.withColumn("key", F.when(F.col("id") % 2 == 0, "a").otherwise("b"))
    km = sk.KeyedModels(spark, {"a": model, "b": other})
    try:
        got = by_id(km.transform(keyed_df, "sequence", key="key", buckets=4).collect())
        want_b = np.array(alone(other, rows))
        np.testing.assert_allclose(np.array(got, "float32"),
                                   np.where((np.arange(len(rows)) % 2 == 0)[:, None], want, want_b),
                                   atol=1e-5)
    finally:
        km.destroy()
    unmasked = sk.KeyedModels(spark, {"a": model, "b": models.sequence_model(masking=False)})
    try:
        with pytest.raises(ArgumentError, match=UNMASKED):
            unmasked.transform(keyed_df, "sequence", key="key", buckets=4)
    finally:
        unmasked.destroy()

    stage = KerasTransformer(model=model, inputCol="sequence", buckets=4)
    assert stage.getBuckets() == 4 and KerasTransformer(buckets=(4, 8)).getBuckets() == [4, 8]
    assert_each_rows_own(by_id(stage.transform(df).collect()), want)
    stage.setBuckets([4, 16]).write().save(str(tmp_path / "stage"))  # a Param saved with the stage
    assert KerasTransformer.load(str(tmp_path / "stage")).getBuckets() == [4, 16]
    with pytest.raises(ArgumentError, match=r"^buckets must be None, a count"):
        KerasTransformer(model=model, inputCol="sequence", buckets=0)
    refused = KerasTransformer(model=models.sequence_model(masking=False), inputCol="sequence",
                               buckets=4)
    with pytest.raises(ArgumentError, match=UNMASKED):
        refused.transform(df)


def _write_sequences(path, rows) -> None:
    pq.write_table(pa.table({"id": pa.array(np.arange(len(rows)), pa.int64()),
                             "sequence": pa.array([r.tolist() for r in rows],
                                                  pa.list_(pa.list_(pa.float32())))}), path)


def test_the_score_job_refuses_bad_buckets_before_starting_spark(tmp_path):
    proc = run_score_job("--model", str(tmp_path / "m.keras"), "--input", str(tmp_path / "in"),
                         "--output", str(tmp_path / "out"), "--features", "sequence",
                         "--buckets", "8,4", "--master", "local[1]")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (
        "score.py: error: --buckets must be None, a count of lengths (an int >= 1) or bucket "
        "lengths (strictly increasing positive ints), not (8, 4)")


def test_the_score_job_pads_into_buckets_or_says_why_not(spark, tmp_path, gru):
    """The job's ``--buckets`` through its Python entry point (its options parsed as the
    command line's, on this module's session: test_score_job runs the command itself)."""
    from spark_keras.jobs.score.errors import outcome
    from spark_keras.jobs.score.files import HadoopPaths
    from spark_keras.jobs.score.main import parse_args
    from spark_keras.jobs.score.run import score

    model, rows, want = gru
    _write_sequences(tmp_path / "in.parquet", rows)
    model.save(tmp_path / "masked.keras")

    def job(name: str) -> dict:
        return score(spark, HadoopPaths(spark), parse_args([
            "--model", str(tmp_path / f"{name}.keras"), "--input", str(tmp_path / "in.parquet"),
            "--output", str(tmp_path / f"{name}.parquet"), "--features", "sequence",
            "--buckets", "4"]))

    assert job("masked")["rows"] == len(rows)
    import pandas as pd

    scored = pd.read_parquet(tmp_path / "masked.parquet").sort_values("id")
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), want, atol=1e-5)
    models.sequence_model(masking=False).save(tmp_path / "plain.keras")
    with pytest.raises(Exception) as refused:
        job("plain")
    line, status = outcome(refused.value)  # what main() prints, and its exit status
    assert status == 2 and "--buckets 4: input 'sequence' feeds GRU, and no Masking layer" in line
    assert not (tmp_path / "plain.parquet").exists()
