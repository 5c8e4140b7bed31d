"""KeyedModels on real local Spark: twelve models, each row scored by the model of its key,
under the workers' default cache of 4 models; unknown keys, updates of one key, URIs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for

from . import models
from .conftest import builds_by_worker
from .test_spark_streaming import executor_state

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
    with pytest.raises(sk.ArgumentError, match="model of key 'b' does not fit the model of key 'a'"):
        sk.KeyedModels(spark, {"a": twelve["k0"], "b": models.mlp(n_features=5, hidden=8)})
    with pytest.raises(sk.ArgumentTypeError, match="all strings or all integers"):
        sk.KeyedModels(spark, {"a": twelve["k0"], 2: twelve["k1"]})
    km = sk.KeyedModels(spark, {1: twelve["k0"], 2: twelve["k1"]})
    try:
        with pytest.raises(sk.ModelInputError, match="key column 'key' has type string, and the keys are integers"):
            km.transform(_frame(spark, _rows(["1"])), "features", key="key")
        ints = spark.createDataFrame([(i, i % 3, [float(i)] * 4) for i in range(9)],
                                     "id long, key int, features array<float>")
        out = km.transform(ints, "features", key="key", on_invalid="null").toPandas()
        assert out[out.key == 0].prediction.isna().all() and out[out.key > 0].prediction.notna().all()
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
