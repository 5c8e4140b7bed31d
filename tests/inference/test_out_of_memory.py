"""A model call that runs out of memory is never a row's fault (real Keras, TensorFlow's
own ``ResourceExhaustedError``, see tests/oom_models.py): the rows are called again in
smaller calls, the size that worked is kept for the predictor's life (the failed calls
paid once, not per batch), logged once and reported by ``cache_info()``; only a row that
runs out of memory alone is invalid. Both ``on_invalid`` modes, the engine and Spark."""

from __future__ import annotations

import logging
import types

import keras
import numpy as np
import pyarrow as pa
import pyspark
import pytest
from keras import layers

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.errors import ModelCallError, ModelError
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.isolation import RowFailure
from spark_keras.inference.predictor import Predictor
from tests import oom_models

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
        assert out.reasons[row].startswith("model: ResourceExhaustedError: MemoryError: Unable to allocate"), \
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
        assert all(r.startswith("model: ResourceExhaustedError: MemoryError: Unable to allocate")
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


# --- the call after one set aside (issue 51, item 9) ----------------------------------
# calls above 2 rows run out of memory, batch_size 4: the first call [0, 4) is set aside
# and the batch's last call fails otherwise (rows: first value 1000 runs out alone, -1 is
# refused by an assertion): the rows set aside are scored all the same
LAST_CALL_FAILS = {
    "runs out alone": (5, {4: 1000.0}),  # [4, 5): a 1-row call that runs out
    "raises otherwise": (8, {1: 1000.0, 6: -1.0}),  # [4, 8): InvalidArgumentError
}


@pytest.mark.parametrize("case,on_invalid", [("runs out alone", "null"),
                                             ("raises otherwise", "null"),
                                             ("raises otherwise", "error")])
def test_rows_set_aside_are_scored_whatever_the_last_call_does(case, on_invalid):
    """Before: the loop ended with the last call, the rows set aside never scored (5 rows
    in, 1 out; 8 in, 4 out with row 1, which runs out alone, never reported; under
    "error" row 6 was named though row 1 comes first)."""
    model = oom_models.hungry_mlp(2, HUNGRY, refuse_negative=True)
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    n, bad = LAST_CALL_FAILS[case]
    x = features(n, seed=9)
    for row, value in bad.items():
        x[row, 0] = value
    batch = from_arrow(["features"], [column(x)])
    if on_invalid == "error":
        with pytest.raises(ModelCallError, match=r"row 1 of this batch.*ResourceExhaustedError"):
            score(handle, batch, batch_size=4, on_invalid="error")
        return
    out = score(handle, batch, batch_size=4, on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == sorted(bad)
    for row, value in bad.items():
        why = ("model: ResourceExhaustedError: MemoryError: Unable to allocate" if value > 0 else
               "model: InvalidArgumentError: assertion failed: [a negative first value")
        assert out.reasons[row].startswith(why), out.reasons[row]
    good = np.delete(x, sorted(bad), axis=0)
    np.testing.assert_allclose(out.outputs[0], alone(model, good, 1), rtol=1e-6, atol=1e-6)


def sequence_model() -> keras.Model:
    """Sequences of any length of 4 values -> 2 values; a call of more than 2 rows, or
    holding a row whose first step's values reach HUNGRY, runs out of memory."""
    keras.utils.set_random_seed(11)
    inp = keras.Input((None, 4), name="steps")
    x = layers.GlobalAveragePooling1D()(oom_models.OutOfMemoryAbove(2, HUNGRY, name="oom")(inp))
    return keras.Model(inp, layers.Dense(2)(layers.Dense(8, activation="relu")(x)))


def test_sequences_never_get_another_rows_result():
    """Variable-length rows: 5 of 3 steps (the last runs out alone) and 2 of 2 steps.
    Before: the group of 5 came back as the 1-row result of its last call, broadcast to
    all 5 (rows 0-3 valid, each [0, 0], the failed row's placeholder)."""
    model = sequence_model()
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    rng = np.random.default_rng(2)
    rows = [rng.uniform(0, 5, (3 if i < 5 else 2, 4)).astype("float32") for i in range(7)]
    rows[4][0, 0] = 1000.0
    col = pa.array([r.tolist() for r in rows], pa.list_(pa.list_(pa.float32(), 4)))
    out = score(handle, from_arrow(["steps"], [col]), batch_size=4, on_invalid="null",
                reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [4]
    assert out.reasons[4].startswith("model: ResourceExhaustedError: MemoryError: Unable to allocate")
    want = np.concatenate([model(r[None], training=False).numpy() for i, r in enumerate(rows)
                           if i != 4])
    np.testing.assert_allclose(out.outputs[0], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("on_invalid", ["null", "error"])
def test_a_model_giving_other_than_a_row_per_row_is_refused(on_invalid):
    """A model whose output is one row per call (a mean over the batch): refused with a
    ModelError naming the counts, in both modes (before: 3 rows of output for 10)."""
    keras.utils.set_random_seed(1)
    inp = keras.Input((4,), name="features")
    pooled = layers.Lambda(lambda t: keras.ops.mean(t, axis=0, keepdims=True))(inp)
    model = keras.Model(inp, layers.Dense(2)(pooled))
    handle = types.SimpleNamespace(predictor=Predictor(model), preprocess=None)
    with pytest.raises(ModelError, match="returned 1 rows of an output for a call of 4 rows"):
        score(handle, from_arrow(["features"], [column(features(10, seed=1))]), batch_size=4,
              on_invalid=on_invalid)


# --- image rows whose conversion runs out of memory (issue 51, item 11) ---------------

@pytest.mark.parametrize("failures", [{}, None])
def test_image_rows_whose_conversion_runs_out_of_memory_are_backed_off(failures):
    """Image rows made when a call takes them (:class:`ImageRows`, the next call's in the
    background): converting more than 20 at once, or row 70 at all, raises numpy's
    MemoryError. Calls shrink as for the model's own (64 -> 32 -> 16, kept); row 70 alone
    is the failure (recorded, or raised as the RowFailure of row 70); every other row is
    the model's on its converted image alone. Before: the MemoryError failed the batch."""
    keras.utils.set_random_seed(12)
    inp = keras.Input((6, 6, 3), name="image")
    model = keras.Model(inp, layers.Dense(2)(layers.Flatten()(inp)))
    stored = np.random.default_rng(6).integers(0, 256, (100, 6, 6, 3), dtype=np.uint8)
    predictor = Predictor(model)
    images = oom_models.HungryImageRows(stored, 20, hungry=(70,))
    if failures is None:
        with pytest.raises(RowFailure) as raised:
            predictor([images], 64)
        assert raised.value.row == 70 and isinstance(raised.value.cause, MemoryError)
        return
    got = predictor([images], 64, failures)[0]
    assert list(failures) == [70] and isinstance(failures[70], MemoryError)
    assert predictor.call_sizes.info() == {"(6, 6, 3)": 16}
    rgb = stored[..., ::-1].astype("float32")
    keep = np.arange(100) != 70
    np.testing.assert_allclose(got[keep], alone(model, rgb[keep], 1), rtol=1e-6, atol=1e-5)


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
        assert record["reason"].startswith("ResourceExhaustedError: MemoryError: Unable to allocate")
        assert [r["key"] for r in read_build_log(str(tmp_path))] == [key]  # builds apart
    finally:
        model_cache.drop(key)


# --- the byte bound on model calls (Spark's, docs "Settings that matter") ---------------

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
