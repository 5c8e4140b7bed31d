"""KeyedModels on rows in mixed key order (issue 55 item 10): a task's consecutive Arrow
batches are put together until each key has about a model call's rows, and the outputs cut
back into the input's batches. Counted with a real model whose second output is the number
of rows of the call that scored the row (tests.models.CallRows)."""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for
from spark_keras.inference.keyed_batches import gathered
from tests import models

KEYS = [f"k{i}" for i in range(8)]
PER_KEY = 60
ARROW_BATCH = 40  # rows per Arrow batch: 12 batches, about 5 rows of each key in each
BAD = [7, 45, 46, 130, 301]  # NaN rows (ids, and their places in the single partition)
UNKNOWN = [88, 200]  # rows of a key without a model


@pytest.fixture(scope="module")
def eight():
    return {k: models.call_rows_mlp(seed=i, name=f"calls_{k}") for i, k in enumerate(KEYS)}


def _frame(spark):
    """One partition of ``(id, key, features)`` rows in random key order, id = place."""
    rng = np.random.default_rng(3)
    keys = rng.permutation(np.repeat(KEYS, PER_KEY)).tolist()
    rows = []
    for i, key in enumerate(keys):
        x = rng.standard_normal(4).astype(np.float32).tolist()
        rows.append((i, "zz" if i in UNKNOWN else key, [float("nan")] * 4 if i in BAD else x))
    return spark.createDataFrame(rows, "id long, key string, features array<float>").coalesce(1)


@contextlib.contextmanager
def _small_arrow_batches(spark):
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(conf)
    spark.conf.set(conf, str(ARROW_BATCH))
    try:
        yield
    finally:
        spark.conf.set(conf, before)


def _calls(out: pd.DataFrame) -> dict[str, float]:
    """Model calls per key: each call of m rows gives each of its rows m."""
    scored = out[out.prediction.notna()]
    return {k: round(sum(1.0 / p[1] for p in rows.prediction), 3) for k, rows in scored.groupby("key")}


def _first(out: pd.DataFrame) -> dict[int, float]:
    return {int(i): (None if p is None else np.float32(p[0]))
            for i, p in zip(out.id, out.prediction)}


def test_mixed_key_order_scores_each_key_in_few_calls_as_clustered_rows_are(spark, eight):
    """12 Arrow batches of 40 rows holding the 8 keys (5 rows of each): put together (up to
    2 calls x 8 keys x 32 rows), each key's rows reach its model in 2 calls, not 12; every
    prediction bit-identical to the same rows sorted by key and to the model's own; the NaN rows and the unknown key's
    null with their reasons, naming each row by its place in its own Arrow batch (or its
    id); the budget quotes the first of them."""
    km = sk.KeyedModels(spark, eight)
    df = _frame(spark)
    run = dict(key="key", batch_size=32, on_invalid="null", error_col="error")
    try:
        with _small_arrow_batches(spark):
            mixed = km.transform(df, "features", **run).toPandas()
            clustered = km.transform(df.sortWithinPartitions("key", "id"), "features",
                                     **run).toPandas()
            named = km.transform(df, "features", id_col="id", **run).toPandas()
            by_udf = df.select("id", "key", km.predict_udf(batch_size=32, on_invalid="null")(
                "key", "features").alias("prediction")).toPandas()
            with pytest.raises(Exception, match=r"max_invalid=6 passed: 7 of .* the first: "
                                                r"column 'features': NaN .* at row 7 of this batch"):
                km.transform(df, "features", key="key", batch_size=32, on_invalid="null",
                             max_invalid=6).collect()
        assert mixed.id.tolist() == list(range(len(KEYS) * PER_KEY))  # in the input's order
        calls = _calls(mixed)
        assert set(calls) == set(KEYS) and max(calls.values()) <= 2, calls  # 12 without
        assert max(_calls(by_udf).values()) <= 2, _calls(by_udf)
        first = _first(mixed)
        assert first == _first(clustered) == _first(by_udf.sort_values("id"))
        for key, model in eight.items():  # the model's own predictions, bit for bit
            rows = mixed[(mixed.key == key) & mixed.prediction.notna()]
            want = predictor_for(model)([np.array(rows.features.tolist(), np.float32)], 1024)[0]
            assert [first[i] for i in rows.id] == want[:, 0].tolist(), key
        invalid = mixed[mixed.prediction.isna()]
        assert invalid.id.tolist() == sorted(BAD + UNKNOWN)
        for i, error, name in zip(invalid.id, invalid.error, named.set_index("id").loc[invalid.id].error):
            assert error.startswith("key: no model for key 'zz'" if i in UNKNOWN else
                                    "column 'features'"), error
            if i in BAD:
                assert f"row {i % ARROW_BATCH} of this batch" in error, (i, error)
                assert f"row id={i}" in name, (i, name)
        assert mixed[mixed.prediction.notna()].error.isna().all()
    finally:
        km.destroy()


def _batch(keys: list, start: int = 0) -> list[pa.Array]:
    return [pa.array(keys, pa.string()), pa.array(np.arange(start, start + len(keys), dtype=np.float32))]


def test_gathered_batches_come_back_one_per_input_batch_within_the_bounds():
    """No Spark: mixed-key batches held together up to 2 calls x keys x batch_size rows, a
    batch of one key alone, each gathered one's rows cut back into the input's batches in
    order."""
    mixed = [_batch(["a", "b"] * 5, 10 * i) for i in range(5)]  # 10 rows of 2 keys each
    got = list(gathered(iter(mixed), batch_size=7))  # 2 calls x 2 keys x 7: 28 rows or more
    assert [g.lengths for g in got] == [[10, 10, 10], [10, 10]]
    back = [part for g in got for part in g.split(g.arrays)]
    assert [b[1].to_pylist() for b in back] == [m[1].to_pylist() for m in mixed]
    assert got[0].local(np.array([0, 13, 29])).tolist() == [0, 3, 9]
    assert got[0].local(None).tolist() == list(range(10)) * 3
    one = [_batch(["a"] * 10), _batch(["a"] * 10)]
    alone = list(gathered(iter(one), batch_size=1024))
    assert [g.lengths for g in alone] == [[10], [10]] and alone[0].local(None) is None
    empty = list(gathered(iter([_batch(["a", "b"]), _batch([])]), batch_size=1024))
    assert [g.lengths for g in empty] == [[2, 0]]
    assert [len(p[0]) for g in empty for p in g.split(g.arrays)] == [2, 0]


def test_gathering_stops_at_the_rows_and_bytes_bounds(monkeypatch):
    from spark_keras.inference import keyed_batches

    many = [_batch(["a", "b"] * 50) for _ in range(10)]  # 100 rows of 2 keys each
    monkeypatch.setattr(keyed_batches, "MOST_ROWS", 250)
    assert [g.lengths for g in gathered(iter(many), batch_size=1024)] == [[100] * 3] * 3 + [[100]]
    monkeypatch.setattr(keyed_batches, "MOST_BYTES", 1000)  # 100 rows: 900+ bytes
    assert [len(g.lengths) for g in gathered(iter(many), batch_size=1024)] == [2] * 5
