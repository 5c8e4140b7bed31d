"""A model call that runs out of memory is never a row's fault (real Keras, TensorFlow's
own ``ResourceExhaustedError``, see tests/oom_models.py): the rows are called again in
smaller calls, the size that worked is kept for the predictor's life (the failed calls
paid once, not per batch), logged once and reported by ``cache_info()``; only a row that
runs out of memory alone is invalid. Both ``on_invalid`` modes, the engine and Spark."""

from __future__ import annotations

import logging
import types

import numpy as np
import pyarrow as pa
import pyspark
import pytest

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.errors import ModelCallError
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.predictor import Predictor

from . import oom_models

LIMIT = 50  # the most rows a call of hungry_mlp takes
HUNGRY = 100.0  # a row whose first value is this or more runs out of memory alone


def features(n: int, seed: int, hungry_rows: tuple[int, ...] = ()) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(0, 5, (n, 4)).astype("float32")
    x[list(hungry_rows), 0] = 1000.0
    return x


def column(x: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1])


def alone(model, x: np.ndarray, rows: int) -> np.ndarray:
    """The model on ``x`` in calls of ``rows`` rows (its own call, not spark_keras's)."""
    return np.concatenate([model(x[i:i + rows], training=False).numpy()
                           for i in range(0, len(x), rows)])


@pytest.mark.parametrize("on_invalid", ["null", "error"])
def test_calls_that_run_out_of_memory_are_made_smaller_once_per_predictor(on_invalid, caplog):
    model = oom_models.hungry_mlp(LIMIT, HUNGRY)
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    caplog.set_level(logging.WARNING, logger="spark_keras")
    failed_after, scored = [], []
    for batch in range(3):
        x = features(1000, seed=batch)
        out = score(handle, from_arrow(["features"], [column(x)]), batch_size=1024,
                    on_invalid=on_invalid, reasons=True)
        assert out.invalid is None or not out.invalid.any(), out.reasons[out.invalid][:3]
        failed_after.append(oom_models.counts(model)[1])
        scored.append((x, out.outputs[0]))
    # 1000 rows, then two calls of each of 500, 250, 125 and 63 rows: in the first batch only
    assert failed_after == [9, 9, 9], failed_after
    assert handle.predictor.call_sizes.info() == {"(4,)": 32}
    for x, got in scored:  # every row exactly what the model gives in calls of the size kept
        np.testing.assert_array_equal(got, alone(model, x, 32))
    warned = [r for r in caplog.records if "ran out of memory" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "1000 rows" in warned[0].getMessage() and "at most 32 rows" in warned[0].getMessage()
    assert "ResourceExhaustedError" in warned[0].getMessage()


@pytest.mark.parametrize("on_invalid", ["null", "error"])
def test_once_a_size_is_kept_a_row_that_runs_out_alone_is_searched_for(on_invalid):
    """After the size is kept, calls of that size that run out of memory depend on their
    rows (searched, not halved again): a row that runs out alone is invalid, the others
    scored; the size kept does not shrink for it."""
    model = oom_models.hungry_mlp(LIMIT, HUNGRY)
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    x = features(300, seed=5)
    score(handle, from_arrow(["features"], [column(x)]), batch_size=1024, on_invalid=on_invalid)
    assert handle.predictor.call_sizes.info() == {"(4,)": 38}  # 300 -> 150 -> 75 ran out
    failed = oom_models.counts(model)[1]
    bad = features(300, seed=6, hungry_rows=(7, 250))
    if on_invalid == "error":
        with pytest.raises(ModelCallError, match=r"row 7 of this batch.*ResourceExhaustedError"):
            score(handle, from_arrow(["features"], [column(bad)]), batch_size=1024,
                  on_invalid="error")
        return
    out = score(handle, from_arrow(["features"], [column(bad)]), batch_size=1024,
                on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [7, 250]
    for row in (7, 250):
        assert out.reasons[row].startswith("model: ResourceExhaustedError: OOM when allocating"), \
            out.reasons[row]
    good = np.delete(bad, [7, 250], axis=0)
    np.testing.assert_allclose(out.outputs[0], alone(model, good, LIMIT), rtol=1e-6, atol=1e-6)
    assert handle.predictor.call_sizes.info() == {"(4,)": 38}
    # per row: the call of 38 rows holding it, then the search's halves down to it alone
    # (8 here), never the halving from 1,024 again
    assert oom_models.counts(model)[1] - failed <= 2 * 7


@pytest.mark.parametrize("on_invalid", ["null", "error"])
def test_rows_that_run_out_of_memory_alone_are_blamed_and_nothing_is_kept(on_invalid):
    """Limit 0: every call runs out, however small; each row is invalid with the
    allocator's reason (under "error": the first row named), and no size is kept."""
    model = oom_models.hungry_mlp(0, HUNGRY)
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    x = features(20, seed=3)
    if on_invalid == "error":
        with pytest.raises(ModelCallError, match=r"row 0 of this batch.*ResourceExhaustedError"):
            score(handle, from_arrow(["features"], [column(x)]), batch_size=16,
                  on_invalid="error")
    else:
        out = score(handle, from_arrow(["features"], [column(x)]), batch_size=16,
                    on_invalid="null", reasons=True)
        assert out.invalid.all() and len(out.outputs[0]) == 0
        assert all(r.startswith("model: ResourceExhaustedError: OOM when allocating")
                   for r in out.reasons), out.reasons
    assert handle.predictor.call_sizes.info() == {}


def test_a_row_that_runs_out_alone_among_calls_too_large():
    """Calls too large and a row that runs out alone in one batch: the row is invalid,
    the size kept is the one too large calls need, not the one that rules the row out."""
    model = oom_models.hungry_mlp(LIMIT, HUNGRY)
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    x = features(1000, seed=8, hungry_rows=(7, 420))
    out = score(handle, from_arrow(["features"], [column(x)]), batch_size=1024,
                on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [7, 420]
    assert out.reasons[7].startswith("model: ResourceExhaustedError: ")
    assert handle.predictor.call_sizes.info() == {"(4,)": 32}
    np.testing.assert_allclose(out.outputs[0], alone(model, np.delete(x, [7, 420], 0), LIMIT),
                               rtol=1e-6, atol=1e-6)


def test_cache_info_and_the_build_log_report_the_size_kept(tmp_path, monkeypatch):
    """A worker's cached model: cache_info()["call_rows_by_key"] and the build log's
    call-rows records name its key, the shape and the size kept."""
    from spark_keras.cache import model_cache
    from spark_keras.inference.predictor import predictor_for

    monkeypatch.setenv("SPARK_KERAS_BUILD_LOG", str(tmp_path))
    model = oom_models.hungry_mlp(LIMIT, HUNGRY)
    key = f"oom-test-{id(model)}"
    try:
        cached = model_cache.get_or_build(key, lambda: (model, 1)).value
        handle = types.SimpleNamespace(predictor=predictor_for(cached), preprocess=None)
        score(handle, from_arrow(["features"], [column(features(200, seed=1))]),
              batch_size=128, on_invalid="error")
        assert sk.cache_info()["call_rows_by_key"][key] == {"(4,)": 32}  # 128 -> 64 ran out
        [record] = [r for r in read_build_log(str(tmp_path), "call-rows") if r["key"] == key]
        assert (record["shape"], record["rows"], record["tried"]) == ("(4,)", 32, 128)
        assert record["reason"].startswith("ResourceExhaustedError: OOM when allocating")
        assert [r["key"] for r in read_build_log(str(tmp_path))] == [key]  # builds apart
    finally:
        model_cache.drop(key)


# --- the byte bound on model calls (Spark's, README "Settings that matter") -------------

ARROW_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"


@pytest.mark.skipif(not pyspark.__version__.startswith("4"),
                    reason="Spark 3.5 bounds Arrow batches by rows only")
def test_arrow_batches_bound_the_bytes_of_a_model_call(spark):
    """A call never spans two Arrow batches, and Spark 4 closes one at
    maxBytesPerBatch (64 MiB unless set): rows of 100 KiB under a 1 MiB bound reach the
    model in calls of at most 10 rows, whatever batch_size says."""
    assert spark._jsparkSession.sessionState().conf().arrowMaxBytesPerBatch() == 64 * 2**20
    model = oom_models.call_rows_model(25_600)  # float32: 100 KiB a row
    df = spark.range(60, numPartitions=1).selectExpr(
        "id", "array_repeat(cast(id as float), 25600) as features")
    bm = sk.BroadcastModel(spark, model)
    spark.conf.set(ARROW_BYTES, str(2**20))
    try:
        rows = bm.transform(df, "features", batch_size=1024).collect()
    finally:
        spark.conf.unset(ARROW_BYTES)
        bm.destroy()
    calls = [r.prediction for r in sorted(rows, key=lambda r: r.id)]
    assert len(calls) == 60 and max(calls) == 10, calls


def test_transform_scores_every_row_when_calls_run_out_of_memory(spark, build_log):
    """Through Spark (the shared session's workers), under on_invalid="error": no task
    fails, every row is the model's own; the worker's build log says the size it kept."""
    model = oom_models.hungry_mlp(LIMIT, HUNGRY)
    x = features(300, seed=4)
    df = spark.createDataFrame([(i, r.tolist()) for i, r in enumerate(x)],
                               "id long, features array<float>").coalesce(1)
    bm = sk.BroadcastModel(spark, model)
    try:
        rows = bm.transform(df, "features", on_invalid="error").collect()
        assert sorted(r.id for r in rows) == list(range(300))
        got = np.array([r.prediction for r in sorted(rows, key=lambda r: r.id)])
        np.testing.assert_allclose(got, alone(model, x, 38), rtol=1e-6, atol=1e-6)
        kept = [(r["shape"], r["rows"], r["tried"]) for r in read_build_log(build_log, "call-rows")
                if r["key"] == bm.key]
        assert kept == [("(4,)", 38, 300)], kept  # 300 -> 150 -> 75 ran out
    finally:
        bm.destroy()
