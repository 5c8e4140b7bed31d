"""KeyedModels on real local Spark: twelve models, each row scored by the model of its key,
under the workers' default cache of 4 models; unknown keys, updates of one key, URIs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for
from tests import models
from tests.conftest import builds_by_worker
from tests.spark.test_streaming import executor_state

KEYS = [f"k{i}" for i in range(12)]
ROWS_PER_KEY = 25


@pytest.fixture(scope="module")
def twelve():
    return {k: models.mlp(n_features=4, hidden=8, name=f"model_{k}") for k in KEYS}


def _rows(keys, seed=0):
    """``(id, key, features)`` rows, ROWS_PER_KEY per key, in a shuffled order."""
    rng = np.random.default_rng(seed)
    rows = [(k, rng.standard_normal(4, dtype=np.float32)) for k in keys for _ in range(ROWS_PER_KEY)]
    order = rng.permutation(len(rows))
    return [(i, rows[j][0], rows[j][1].tolist()) for i, j in enumerate(order)]


def _frame(spark, rows):
    return spark.createDataFrame(rows, "id long, key string, features array<float>")


def _expected(model, features) -> np.ndarray:
    return predictor_for(model)([np.array(features, np.float32)], 1024)[0].reshape(-1)


def _assert_exact(out: pd.DataFrame, by_key) -> None:
    for key, model in by_key.items():
        rows = out[out.key == key]
        assert len(rows), key
        np.testing.assert_allclose(rows.prediction.to_numpy(np.float32),
                                   _expected(model, rows.features.tolist()), rtol=0, atol=1e-6)


def test_each_row_is_scored_by_its_keys_model_and_unknown_keys_are_null(spark, twelve):
    km = sk.KeyedModels(spark, twelve)
    try:
        rows = _rows(KEYS) + [(10_000, "nope", [0.0] * 4), (10_001, None, [0.0] * 4)]
        out = km.transform(_frame(spark, rows).repartition(3), "features", key="key",
                           on_invalid="null", error_col="error",
                           version_col="model_version").toPandas().sort_values("id")
        assert len(out) == len(rows) and out.id.tolist() == sorted(r[0] for r in rows)
        known = out[out.key.isin(KEYS)]
        assert known.error.isna().all() and set(known.model_version) == {"1"}
        _assert_exact(known, twelve)
        unknown = out.set_index("id").loc[[10_000, 10_001]]
        assert unknown.prediction.isna().all() and unknown.model_version.isna().all()
        assert unknown.error.tolist() == ["key: no model for key 'nope'", "key: the key is null"]
        with pytest.raises(Exception, match="no model for key 'nope'"):
            km.transform(_frame(spark, rows), "features", key="key").collect()
        # a null key under on_invalid="error" says so and names its row (not "key None")
        with pytest.raises(Exception, match=r"the key is null \(row id=10001\)"):
            km.transform(_frame(spark, rows[-1:]), "features", key="key",
                         id_col="id").collect()
    finally:
        km.destroy()


def test_clustered_keys_build_each_model_once_per_worker(spark, build_log, twelve):
    """Rows clustered by key (repartition + sortWithinPartitions): a worker meets each
    key's rows together, so each model is built once per worker that meets it, with 12
    models and a cache of 4."""
    km = sk.KeyedModels(spark, twelve)
    try:
        df = _frame(spark, _rows(KEYS, seed=1)).repartition(4, "key").sortWithinPartitions("key")
        out = km.transform(df, "features", key="key", batch_size=16).toPandas()
        _assert_exact(out, twelve)
        for key in KEYS:
            builds = builds_by_worker(build_log, km[key].key)
            assert builds and set(builds.values()) == {1}, (key, builds)
        predicted = df.select("key", "features", km.predict_udf()("key", "features")
                              .alias("prediction")).toPandas()
        _assert_exact(predicted, twelve)
    finally:
        km.destroy()


def test_update_of_one_key_changes_that_key_alone(spark, twelve):
    km = sk.KeyedModels(spark, dict(list(twelve.items())[:3]))
    try:
        df = _frame(spark, _rows(KEYS[:3], seed=2))
        scored = km.transform(df, "features", key="key", version_col="v")
        retrained = models.mlp(n_features=4, hidden=8, name="retrained")
        assert km.update("k1", retrained) == "2"
        out = scored.toPandas()  # a plan made before the update
        assert dict(out.groupby("key").v.first()) == {"k0": "1", "k1": "2", "k2": "1"}
        _assert_exact(out, {"k0": twelve["k0"], "k1": retrained, "k2": twelve["k2"]})
        with pytest.raises(sk.ArgumentError, match="no model for key 'k9'"):
            km.update("k9", retrained)
    finally:
        km.destroy()


def test_models_that_differ_or_keys_of_another_type_are_refused_on_the_driver(spark, twelve):
    with pytest.raises(sk.ArgumentError, match="model of key 'b' does not fit the model of key 'a'") as refused:
        sk.KeyedModels(spark, {"a": twelve["k0"], "b": models.mlp(n_features=5, hidden=8)})
    # about the keys' models, not a BroadcastModel's update
    assert "key 'a''s [((4,)" in str(refused.value), refused.value
    assert "new version" not in str(refused.value) and "update" not in str(refused.value)
    with pytest.raises(sk.ArgumentTypeError, match="all strings or all integers"):
        sk.KeyedModels(spark, {"a": twelve["k0"], 2: twelve["k1"]})
    km = sk.KeyedModels(spark, {1: twelve["k0"], 2: twelve["k1"]})
    try:
        with pytest.raises(sk.ModelInputError, match="key column 'key' has type string, and the keys are integers"):
            km.transform(_frame(spark, _rows(["1"])), "features", key="key")
    finally:
        km.destroy()


def _keyed_frame(spark, key_type: str, keys, seed: int = 5):
    """``(id, key, features)`` rows of ``keys`` and of key 0 (no model), shuffled."""
    return spark.createDataFrame(_rows([*keys, 0], seed=seed),
                                 f"id long, key {key_type}, features array<float>")


@pytest.mark.parametrize("key_type, keys", [
    ("int", [1, 2, 3]), ("bigint", [1, 2, 3]), ("string", ["1", "2", "3"]),
])
def test_each_row_gets_its_own_keys_model_for_int_long_and_string_keys(spark, twelve, key_type, keys):
    """Each row's prediction is its own key's model's (not merely some prediction): keys
    mapped to the wrong models would fail here."""
    by_key = dict(zip(keys, [twelve["k0"], twelve["k1"], twelve["k2"]]))
    km = sk.KeyedModels(spark, by_key)
    try:
        nobody = "0" if key_type == "string" else 0  # a key without a model
        df = spark.createDataFrame(_rows([*keys, nobody], seed=5),
                                   f"id long, key {key_type}, features array<float>")
        out = km.transform(df.repartition(2), "features", key="key", on_invalid="null",
                           error_col="error").toPandas()
        _assert_exact(out[out.key.isin(keys)], by_key)
        unknown = out[~out.key.isin(keys)]
        assert len(unknown) == ROWS_PER_KEY and unknown.prediction.isna().all()
        assert set(unknown.error) == {f"key: no model for key {nobody!r}"}
    finally:
        km.destroy()


@pytest.mark.parametrize("key_type", ["tinyint", "smallint", "int"])
def test_a_key_the_column_type_cannot_hold_is_never_met(spark, twelve, key_type, caplog):
    """Key 3_000_000_000 cannot occur in an int (or smaller) column: the other keys' rows
    are scored by their own models (before, every row was "no model for key 1"), and the
    driver says which keys the column cannot hold."""
    by_key = {1: twelve["k0"], 2: twelve["k1"], 3_000_000_000: twelve["k2"], -200: twelve["k3"]}
    km = sk.KeyedModels(spark, by_key)
    try:
        df = _keyed_frame(spark, key_type, [1, 2])
        with caplog.at_level("WARNING", logger="spark_keras"):
            scored = km.transform(df.where("key != 0"), "features", key="key")  # error: no row unknown
        cannot = "-200, 3000000000" if key_type == "tinyint" else "3000000000"
        assert f"key column 'key' of type {key_type} cannot hold the keys [{cannot}]" in caplog.text
        _assert_exact(scored.toPandas(), {1: twelve["k0"], 2: twelve["k1"]})
        out = km.transform(df, "features", key="key", on_invalid="null", error_col="error").toPandas()
        _assert_exact(out[out.key > 0], {1: twelve["k0"], 2: twelve["k1"]})
        assert set(out[out.key == 0].error) == {"key: no model for key 0"}
    finally:
        km.destroy()


def test_a_long_column_holds_a_long_key_and_a_column_that_holds_no_key_is_refused(spark, twelve):
    wide = sk.KeyedModels(spark, {3_000_000_000: twelve["k2"], 1: twelve["k0"]})
    try:
        longs = _keyed_frame(spark, "bigint", [3_000_000_000, 1])
        out = wide.transform(longs, "features", key="key", on_invalid="null").toPandas()
        _assert_exact(out[out.key > 0], {3_000_000_000: twelve["k2"], 1: twelve["k0"]})
    finally:
        wide.destroy()
    only = sk.KeyedModels(spark, {3_000_000_000: twelve["k2"], -200: twelve["k0"]})
    try:
        with pytest.raises(sk.ModelInputError, match=r"key column 'key' has type tinyint, which "
                                                     r"holds none of the keys \[-200, 3000000000\]"):
            only.transform(_keyed_frame(spark, "tinyint", [1]), "features", key="key")
    finally:
        only.destroy()


def test_reasons_name_the_rows_position_in_the_batch_as_transform_does(spark, twelve):
    """A key's rows are scored apart from the others', but errors and reasons number a row
    by its place in the batch, as BroadcastModel.transform does for the same rows."""
    nan = [float("nan")] * 4
    keys = ["a", "b", "a", "b", "a", "a", "b", "b"]
    bad = {4, 6, 7}  # NaN rows: a's third, b's third and fourth
    rows = [(i, k, nan if i in bad else [0.5] * 4) for i, k in enumerate(keys)]
    df = _frame(spark, rows).coalesce(1)  # one partition, one batch, in this order
    km = sk.KeyedModels(spark, {"a": twelve["k0"], "b": twelve["k0"]})
    bm = sk.BroadcastModel(spark, twelve["k0"])
    try:
        keyed = km.transform(df, "features", key="key", on_invalid="null", error_col="error")
        plain = bm.transform(df, "features", on_invalid="null", error_col="error")
        got = keyed.toPandas().sort_values("id").error.tolist()
        want = plain.toPandas().sort_values("id").error.tolist()
        assert [e is not None for e in got] == [i in bad for i in range(len(rows))]
        assert "row 4 of this batch" in got[4] and "row 7 of this batch" in got[7], got
        assert got == want
        with pytest.raises(Exception, match="row 4 of this batch"):
            km.transform(df, "features", key="key").collect()
    finally:
        km.destroy()
        bm.destroy()


def test_unknown_keys_are_counted_and_quoted_by_max_invalid(spark, twelve):
    """Rows of a key without a model are invalid rows with their reason: max_invalid counts
    them with the batch's other invalid rows and quotes the first reasons in row order."""
    km = sk.KeyedModels(spark, {"a": twelve["k0"]})
    try:
        rows = [(i, "zz" if i % 2 else "a", [float("nan") if i == 0 else 0.5] * 4) for i in range(6)]
        df = _frame(spark, rows).coalesce(1)  # one batch
        with pytest.raises(Exception, match=r"max_invalid=1 passed: 4 of 6 rows .* the first: "
                                            r"column 'features': NaN .* at row 0 of this batch; .*"
                                            r"; key: no model for key 'zz'; key: no model for key 'zz'"):
            km.transform(df, "features", key="key", on_invalid="null", max_invalid=1).collect()
        out = km.transform(df, "features", key="key", on_invalid="null", max_invalid=4).toPandas()
        assert out.sort_values("id").prediction.isna().tolist() == [True, True, False, True, False, True]
    finally:
        km.destroy()


def test_models_at_uris_are_read_by_the_executors_that_meet_their_keys(spark, twelve, tmp_path):
    paths = {}
    for key in KEYS[:4]:
        sk.save(twelve[key], tmp_path / f"{key}.skp")
        paths[key] = (tmp_path / f"{key}.skp").as_uri()
    km = sk.KeyedModels(spark, paths)
    try:
        assert {type(km[k]._transport).__name__ for k in km.keys()} == {"StorageTransport"}
        out = km.transform(_frame(spark, _rows(KEYS[:4], seed=3)), "features", key="key").toPandas()
        _assert_exact(out, {k: twelve[k] for k in KEYS[:4]})
    finally:
        km.destroy()


def test_an_executor_fetches_only_the_models_of_the_keys_it_meets(spark, twelve):
    """The models travel from the driver when a worker first needs them (``ship="driver"``):
    no broadcast that every task would fetch; the executor's folder holds the two models
    its rows used, not twelve."""
    km = sk.KeyedModels(spark, twelve)
    try:
        assert {type(km[k]._transport).__name__ for k in km.keys()} == {"ServedTransport"}
        out = km.transform(_frame(spark, _rows(["k3", "k7"], seed=4)), "features", key="key").toPandas()
        _assert_exact(out, {"k3": twelve["k3"], "k7": twelve["k7"]})
        files = {f for s in executor_state(spark).values() for f in s["files"]}
        landed = {k for k in KEYS if f"{km[k].key}.skp" in files}
        assert landed == {"k3", "k7"}, files
    finally:
        km.destroy()
