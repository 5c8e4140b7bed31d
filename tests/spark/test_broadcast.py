"""BroadcastModel on real local Spark: once-per-worker builds and correct predictions."""

from __future__ import annotations

import os
import pickle

import keras
import numpy as np
import pytest
from pyspark.ml.linalg import SparseVector, Vectors

import spark_keras as sk
from tests import models
from tests.conftest import builds_by_worker, worker_cache_infos

N_ROWS = 400
PARTITIONS = 20


@pytest.fixture(scope="module")
def mlp_case(spark):
    model = models.mlp(n_features=8, hidden=16, outputs=1)
    x = np.random.default_rng(0).standard_normal((N_ROWS, 8)).astype("float32")
    rows = [(i, x[i].tolist(), *map(float, x[i])) for i in range(N_ROWS)]
    scalar_cols = [f"f{j}" for j in range(8)]
    df = spark.createDataFrame(
        rows, "id long, features array<float>, " + ", ".join(f"{c} double" for c in scalar_cols)
    ).repartition(PARTITIONS).cache()
    df.count()
    expected = np.asarray(model(x)).reshape(-1)
    return model, df, x, expected, scalar_cols


def by_id(pdf, col="prediction"):
    return pdf.sort_values("id")[col].to_numpy()


# local[2] runs at most 2 Python workers per pool (SQL/Arrow and RDD) at a time; PySpark
# now and then replaces a worker between jobs, so allow 4 builders per pool. Per-task
# builds in fresh processes (worker reuse off) would give one builder per task (>= 8 here).
MAX_BUILDERS = 4


def assert_built_once_per_worker(build_log, key, max_builders: int = MAX_BUILDERS):
    builds = builds_by_worker(build_log, key)
    assert builds, f"no worker built {key}"
    assert all(n == 1 for n in builds.values()), builds
    assert len(builds) <= max_builders, f"{len(builds)} worker processes built {key}: {builds}"


def test_map_partitions_value_20_partitions_3_actions(spark, build_log, mlp_case):
    model, df, x, expected, _ = mlp_case
    bm = sk.BroadcastModel(spark, model)
    rdd = df.select("id", "features").rdd

    def score(rows):
        rows = list(rows)
        if not rows:
            return []
        feats = np.array([r.features for r in rows], dtype="float32")
        preds = np.asarray(bm.value(feats, training=False)).reshape(-1)
        return [(r.id, float(p), os.getpid()) for r, p in zip(rows, preds)]

    for _ in range(3):
        out = sorted(rdd.mapPartitions(score).collect())
        assert len(out) == N_ROWS
        np.testing.assert_allclose([p for _, p, _ in out], expected, atol=1e-5)
    assert_built_once_per_worker(build_log, bm.key)
    infos = worker_cache_infos(spark, sql=False)
    assert any(bm.key in i["builds_by_key"] for i in infos.values())  # we reached them
    for info in infos.values():
        assert info["builds_by_key"].get(bm.key, 0) <= 1


def test_predict_udf_20_partitions_3_actions(spark, build_log, mlp_case):
    model, df, x, expected, scalar_cols = mlp_case
    bm = sk.BroadcastModel(spark, model)
    udf = bm.predict_udf(batch_size=64)
    for _ in range(3):
        out = df.select("id", udf("features").alias("prediction")).toPandas()
        assert len(out) == N_ROWS
        np.testing.assert_allclose(by_id(out), expected, atol=1e-5)
    # scalar columns stacked as features, same model, same cache entry
    out = df.select("id", udf(*scalar_cols).alias("prediction")).toPandas()
    np.testing.assert_allclose(by_id(out), expected, atol=1e-5)
    assert_built_once_per_worker(build_log, bm.key)


def test_transform_20_partitions_3_actions(spark, build_log, mlp_case):
    model, df, x, expected, _ = mlp_case
    bm = sk.BroadcastModel(spark, model)
    for _ in range(3):
        out = bm.transform(df, "features", batch_size=50).toPandas()
        assert len(out) == N_ROWS
        assert set(df.columns) < set(out.columns)  # inputs kept
        np.testing.assert_allclose(by_id(out), expected, atol=1e-5)
    assert_built_once_per_worker(build_log, bm.key)


def test_closure_captured_handle_builds_once(spark, build_log, mlp_case):
    model, df, x, expected, _ = mlp_case
    bm = sk.BroadcastModel(spark, model)
    rdd = df.select("id", "features").rdd

    def one(row):  # the handle travels inside the closure, unpickled for every task
        return row.id, float(np.asarray(bm.value(np.array([row.features], "float32"))).item())

    for _ in range(3):
        out = sorted(rdd.map(one).collect())
        np.testing.assert_allclose([p for _, p in out], expected, atol=1e-5)
    assert_built_once_per_worker(build_log, bm.key)


def test_predict_partition_helper_keeps_order(spark, mlp_case):
    model, df, x, expected, _ = mlp_case
    bm = sk.BroadcastModel(spark, model)
    ordered = df.orderBy("id").select("features").rdd
    preds = ordered.mapPartitions(lambda rows: bm.predict_partition(rows, batch_size=7)).collect()
    assert len(preds) == N_ROWS
    np.testing.assert_allclose(preds, expected, atol=1e-5)


def test_multi_input_multi_output_udf_and_transform(spark, build_log):
    model = models.multi_io()
    rng = np.random.default_rng(3)
    a = rng.standard_normal((60, 4)).astype("float32")
    b = rng.standard_normal((60, 3, 2)).astype("float32")
    df = spark.createDataFrame([(i, a[i].tolist(), b[i].tolist()) for i in range(60)],
                               "id long, a array<float>, b array<array<float>>").repartition(6)
    expected = model({"a": a, "b": b})
    bm = sk.BroadcastModel(spark, model)
    transformed = bm.transform(df, ["a", "b"]).toPandas().sort_values("id")
    selected = df.select("id", bm.predict_udf()("a", "b").alias("prediction")).toPandas().sort_values("id")
    for out in (transformed, selected):
        structs = out["prediction"].tolist()
        score = np.array([s["score"] for s in structs])
        probs = np.array([list(s["probs"]) for s in structs])
        np.testing.assert_allclose(score, np.asarray(expected["score"]).reshape(-1), atol=1e-5)
        np.testing.assert_allclose(probs, np.asarray(expected["probs"]), atol=1e-5)
    assert_built_once_per_worker(build_log, bm.key)


def constant_model(value: float) -> keras.Model:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.layers[0].set_weights([np.zeros((2, 1), "float32"), np.full((1,), value, "float32")])
    return model


def test_two_broadcast_models_in_one_job_stay_apart(spark):
    one, two = sk.BroadcastModel(spark, constant_model(1.0)), sk.BroadcastModel(spark, constant_model(2.0))
    df = spark.createDataFrame([(i, [0.5, 0.5]) for i in range(40)], "id long, f array<float>").repartition(8)
    out = df.select(one.predict_udf()("f").alias("p1"), two.predict_udf()("f").alias("p2")).toPandas()
    assert set(out["p1"]) == {1.0} and set(out["p2"]) == {2.0}

    def both(rows):
        x = np.array([[0.5, 0.5]], "float32")
        for _ in rows:
            yield float(np.asarray(one.value(x)).item()), float(np.asarray(two.value(x)).item())

    assert set(df.rdd.mapPartitions(both).collect()) == {(1.0, 2.0)}


def test_vector_columns_dense_and_sparse(spark):
    model = models.mlp(n_features=5, hidden=4, outputs=2)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 5))
    x[::3, 1:4] = 0.0
    vectors = [Vectors.dense(r) if i % 2 else SparseVector(5, {j: v for j, v in enumerate(r) if v})
               for i, r in enumerate(x)]
    df = spark.createDataFrame([(i, v) for i, v in enumerate(vectors)], ["id", "features"]).repartition(3)
    bm = sk.BroadcastModel(spark, model)
    expected = np.asarray(model(x.astype("float32")))
    out = bm.transform(df, "features").toPandas().sort_values("id")
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), expected, atol=1e-5)
    out = df.select("id", bm.predict_udf()("features").alias("prediction")).toPandas().sort_values("id")
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), expected, atol=1e-5)


def test_bad_input_names_the_column(spark):
    bm = sk.BroadcastModel(spark, models.mlp(n_features=3))
    wrong_length = spark.createDataFrame([(1, [1.0, 2.0, 3.0]), (2, [1.0, 2.0])],
                                         "id long, feats array<float>").coalesce(1)
    with pytest.raises(Exception, match="column 'feats'.*row 1.*expects"):
        bm.transform(wrong_length, "feats").collect()
    with_null = spark.createDataFrame([(1, [1.0, 2.0, 3.0]), (2, None)],
                                      "id long, feats array<float>").coalesce(1)
    with pytest.raises(Exception, match="column 'feats'.*null.*row 1"):
        with_null.select(bm.predict_udf()("feats")).collect()
    strings = spark.createDataFrame([("a", "b", "c")], "x string, y string, z string")
    with pytest.raises(Exception, match="column 'x' has type string"):
        bm.transform(strings, ["x", "y", "z"]).collect()
    with pytest.raises(sk.ModelInputError, match="not in the DataFrame"):
        bm.transform(strings, ["nope"])


def test_handle_from_keras_file_and_payload_file(spark, tmp_path):
    model = models.mlp(n_features=4)
    keras_path, payload_path = tmp_path / "m.keras", tmp_path / "m.skp"
    model.save(keras_path)
    sk.save(model, payload_path)
    x = np.ones((6, 4), "float32")
    df = spark.createDataFrame([(i, [1.0] * 4) for i in range(6)], "id long, f array<float>")
    for path in (keras_path, payload_path):
        bm = sk.BroadcastModel(spark, str(path))
        out = bm.transform(df, "f").toPandas()
        np.testing.assert_allclose(out["prediction"], np.asarray(model(x)).reshape(-1), atol=1e-6)
    with pytest.raises(sk.PayloadError, match="neither"):
        (tmp_path / "junk.bin").write_bytes(b"junk" * 10)
        sk.BroadcastModel(spark, str(tmp_path / "junk.bin"))


def test_handle_inside_a_broadcast_structure_and_pickling(spark):
    model = constant_model(3.0)
    bm = sk.BroadcastModel(spark, model)
    data = pickle.dumps(bm)
    # a reference, never the Keras object: small but for the keys the driver released
    # before (up to 256 of them, however many handles this process destroyed)
    released = len(pickle.dumps(bm.__getstate__()["_stale"]))
    assert b"keras.src" not in data and len(data) - released < 4096, (len(data), released)
    holder = spark.sparkContext.broadcast({"model": bm, "note": "nested"})

    def use(rows):
        m = holder.value["model"].value
        return [float(np.asarray(m(np.zeros((1, 2), "float32"))).item()) for _ in rows]

    assert set(spark.sparkContext.parallelize(range(8), 4).mapPartitions(use).collect()) == {3.0}


def test_destroy_releases_the_broadcast(spark):
    bm = sk.BroadcastModel(spark, constant_model(4.0))
    df = spark.createDataFrame([(i, [0.0, 0.0]) for i in range(8)], "id long, f array<float>").repartition(4)
    assert set(bm.transform(df, "f").toPandas()["prediction"]) == {4.0}
    key = bm.key
    assert any(key in i["keys"] for i in worker_cache_infos(spark).values())  # cached in workers
    bm.destroy()
    with pytest.raises(sk.SparkKerasError, match="destroyed"):
        _ = bm.value
    with pytest.raises(sk.SparkKerasError, match="destroyed"):
        pickle.dumps(bm)
    # any later handle tells the workers to drop the destroyed model from their caches
    other = sk.BroadcastModel(spark, constant_model(5.0))
    assert set(other.transform(df, "f").toPandas()["prediction"]) == {5.0}
    infos = worker_cache_infos(spark, other)
    assert any(other.key in i["keys"] for i in infos.values())
    for info in infos.values():
        assert key not in info["keys"]


def test_workers_keep_one_copy_of_the_weights(spark, mlp_case):
    """After the build, a worker drops the unpickled payload (PySpark can reload it from
    its file), so it holds the weights once, in the model's variables."""
    model, df, _, _, _ = mlp_case
    bm = sk.BroadcastModel(spark, model)

    def probe(rows):
        list(rows)
        assert bm.value is not None
        broadcast = bm._transport._broadcast
        yield "_value" in broadcast.__dict__, broadcast._path is not None

    seen = set(df.rdd.mapPartitions(probe).collect())
    assert seen == {(False, True)}, seen


def test_a_worker_freezes_its_heap_after_a_build(spark):
    """PySpark's daemon runs a full garbage collection after every task of a reused
    worker; with TensorFlow's ~400,000 objects tracked that was 0.2 s of CPU per task.
    After a build the worker's collector no longer walks them (spark_keras.heap)."""
    import gc

    bm = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8, outputs=1))

    def probe(_):
        gc.unfreeze()  # as a worker of the stock daemon, which froze nothing
        tracked_before = len(gc.get_objects())
        _ = bm.value  # builds the model through the cache
        yield tracked_before, len(gc.get_objects()), gc.get_freeze_count()

    found = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    for tracked_before, tracked_after, frozen in found:
        assert tracked_before > 100_000  # TensorFlow and Keras, unfrozen
        assert frozen > 100_000 and tracked_after < 20_000, found


def test_transform_sends_only_the_model_inputs_to_python(spark):
    """On PySpark >= 4.1 transform is an arrow_udf over its input columns: the other
    columns stay in the JVM (an interval column, which no Arrow batch can carry, is kept
    as it is) and only the new columns come back from Python."""
    import pyspark.sql.pandas.functions as pandas_functions

    if not hasattr(pandas_functions, "arrow_udf"):
        pytest.skip("PySpark < 4.1: transform goes through mapInArrow")
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    model = models.mlp(n_features=4, hidden=8, outputs=1)
    bm = sk.BroadcastModel(spark, model)
    features = F.when(F.col("id") == 3, F.lit(None)).otherwise(
        F.array(*[(F.col("id") / (j + 1)).cast("float") for j in range(4)]))
    df = spark.range(12, numPartitions=3).select(
        "id", F.expr("make_interval(0, 0, 0, cast(id as int))").alias("waited"),
        features.alias("features"))
    observation = Observation("only-inputs")
    out = bm.transform(df, "features", on_invalid="null", error_col="error", observe=observation)
    plan = out._jdf.queryExecution().executedPlan().toString()
    assert "ArrowEvalPython" in plan and "MapInArrow" not in plan, plan
    assert out.columns == ["id", "waited", "features", "prediction", "error"]
    rows = sorted(out.select("*", F.expr("extract(DAY FROM waited)").alias("days"))
                  .drop("waited").collect(), key=lambda r: r.id)
    x = np.array([[i / (j + 1) for j in range(4)] for i in range(12)], dtype="float32")
    expected = np.asarray(model(x)).reshape(-1)
    for r in rows:
        assert r.days == r.id  # untouched by Python
        if r.id == 3:
            assert r.prediction is None and "null" in r.error
        else:
            assert r.error is None
            np.testing.assert_allclose(r.prediction, expected[r.id], atol=1e-5)
    assert observation.get["rows"] == 12 and observation.get["invalid_rows"] == 1
