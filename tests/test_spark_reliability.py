"""Bad rows, evictions, dropped broadcasts, version mismatches and memory bounds, on real
local Spark."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import spark_keras as sk

from . import models
from .conftest import builds_by_worker, make_spark, worker_cache_infos
from .test_payload_integrity import rewrite_header

CACHE_LIMIT = 3


@pytest.fixture(scope="module")
def spark(build_log):
    session = make_spark("local[2]", build_log,
                         **{"spark.executorEnv.SPARK_KERAS_CACHE_MAX_ENTRIES": str(CACHE_LIMIT)})
    yield session
    session.stop()


def test_null_policy_keeps_every_row(spark):
    model = models.mlp(n_features=3, outputs=1)
    bm = sk.BroadcastModel(spark, model)
    rows = [(0, [1.0, 2.0, 3.0]), (1, None), (2, [1.0, 2.0]), (3, [1.0, float("nan"), 2.0]),
            (4, [4.0, 5.0, 6.0])]
    df = spark.createDataFrame(rows, "id long, f array<double>").coalesce(1)
    expected = np.asarray(model(np.array([[1, 2, 3], [4, 5, 6]], "float32"))).reshape(-1)
    for out in (bm.transform(df, "f", on_invalid="null").toPandas(),
                df.select("id", bm.predict_udf(on_invalid="null")("f").alias("prediction")).toPandas()):
        out = out.sort_values("id")
        assert len(out) == 5
        assert out["prediction"].isna().tolist() == [False, True, True, True, False]
        np.testing.assert_allclose(out["prediction"].dropna(), expected, atol=1e-6)
    preds = df.orderBy("id").select("f").rdd.mapPartitions(
        lambda it: bm.predict_partition(it, on_invalid="null")).collect()
    assert [p is None for p in preds] == [False, True, True, True, False]
    with pytest.raises(Exception, match="column 'f'.*null.*row 1"):
        bm.transform(df, "f").collect()


def test_cache_limit_holds_over_ten_models(spark, build_log):
    df = spark.createDataFrame([(i, [0.1 * i] * 4) for i in range(16)], "id long, f array<float>").repartition(4)
    handles = []
    for k in range(10):
        model = models.mlp(n_features=4, hidden=8, outputs=1, name=f"m{k}")
        bm = sk.BroadcastModel(spark, model)
        out = bm.transform(df, "f").toPandas().sort_values("id")
        x = np.array([[0.1 * i] * 4 for i in range(16)], "float32")
        np.testing.assert_allclose(out["prediction"], np.asarray(model(x)).reshape(-1), atol=1e-6)
        handles.append(bm)
    infos = worker_cache_infos(spark)
    assert all(i["entries"] <= CACHE_LIMIT and i["max_entries"] == CACHE_LIMIT for i in infos.values())
    assert sum(i["evictions"] for i in infos.values()) > 0, (infos, builds_by_worker(build_log, handles[-1].key))
    # an evicted model is rebuilt transparently when it is used again
    first = handles[0]
    out = first.transform(df, "f").toPandas()
    assert len(out) == 16 and out["prediction"].notna().all()
    assert max(builds_by_worker(build_log, first.key).values()) >= 1


def test_dropped_broadcast_value_rebuilds_transparently(spark, build_log):
    """An unrelated task in between makes PySpark drop the broadcast from the worker; the
    model cache still serves the model, and after unpersist it is rebuilt."""
    model = models.mlp(n_features=4, outputs=1)
    bm = sk.BroadcastModel(spark, model)
    df = spark.createDataFrame([(i, [1.0] * 4) for i in range(8)], "id long, f array<float>").repartition(2)
    want = float(np.asarray(model(np.ones((1, 4), "float32"))).item())

    def scored_right() -> bool:
        out = bm.transform(df, "f").toPandas()["prediction"]
        return len(out) == 8 and np.allclose(out, want, atol=1e-6)

    assert scored_right()
    spark.sparkContext.parallelize(range(8), 8).map(lambda x: x * 2).collect()  # unrelated
    assert scored_right()
    bm.unpersist(blocking=True)
    assert scored_right()
    assert all(n <= 2 for n in builds_by_worker(build_log, bm.key).values())


def test_flavour_mismatch_is_reported_on_the_executor(spark):
    model = models.mlp(n_features=4)
    bm = sk.BroadcastModel(spark, model)
    shipment = bm._broadcast.value

    def as_tf_keras(header):
        header["keras"].update(flavour="tf_keras", version="2.21.0")

    edited = dataclasses.replace(shipment, payload=rewrite_header(shipment.payload, as_tf_keras))
    bm._broadcast = spark.sparkContext.broadcast(edited)
    bm._model = None  # behave like a handle whose driver copy is gone: build from the payload
    df = spark.createDataFrame([(1, [1.0] * 4)], "id long, f array<float>")
    with pytest.raises(Exception, match=r"tf_keras.*2\.21\.0.*keras3.*3\.\d+.*TF_USE_LEGACY_KERAS"):
        df.rdd.mapPartitions(lambda rows: [bm.value.name for _ in rows]).collect()


def _python_worker_rss_mb() -> float:
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"pyspark.daemon" not in f.read():
                    continue
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def test_destroy_cycles_do_not_grow_worker_memory(spark):
    df = spark.createDataFrame([(i, [0.5] * 32) for i in range(64)], "id long, f array<float>").repartition(4).cache()
    df.count()
    rss = []
    for cycle in range(20):
        bm = sk.BroadcastModel(spark, models.mlp(n_features=32, hidden=256, outputs=4))
        assert bm.transform(df, "f").count() == 64
        bm.destroy()
        if cycle in (4, 19):
            rss.append(_python_worker_rss_mb())
    assert rss[0] > 0
    # 15 more cycles, each building a fresh model in every worker: bounded growth only
    assert rss[1] - rss[0] < 150, rss
