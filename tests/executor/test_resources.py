"""A task's CPUs and GPUs on a real local-cluster: TensorFlow's thread pools follow the
task's CPUs (stage profiles included), and a task assigned a GPU builds its model for that
GPU. This machine has no GPU: Spark's workers discover two fake ones (addresses "0" and
"1", a discovery script), so every task is assigned one and its model, keyed by that
device, falls back to the CPU with one warning per process."""

from __future__ import annotations

import logging
import os
import stat

import numpy as np
import pytest
from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.errors import ArgumentError, ArgumentTypeError
from spark_keras.executor import resources
from tests import models
from tests.conftest import DAEMON, daemon_reports, make_spark, preloaded_daemons
from tests.executor import test_daemon as daemon_tests

# a local-cluster[1,2,1024] with fake GPUs of its own: about 75 s in all
pytestmark = pytest.mark.slow

ROWS = 64


@pytest.fixture(scope="module")
def cluster(build_log, tmp_path_factory):
    script = tmp_path_factory.mktemp("gpus") / "discover_gpus.sh"
    script.write_text("#!/bin/sh\necho '{\"name\": \"gpu\", \"addresses\": [\"0\", \"1\"]}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    # an executor of 2 cores and 2 fake GPUs: every task of the default profile gets one
    # GPU (the two tasks running at once, each its own); a second executor would only
    # repeat it (and cost its JVM and its daemon's preload)
    session = make_spark("local-cluster[1,2,1024]", build_log, **{
        "spark.executor.memory": "1g",
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": str(script),
        "spark.executor.resource.gpu.amount": "2",
        "spark.task.resource.gpu.amount": "1"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def case(cluster):
    model = models.mlp(n_features=8, hidden=16, outputs=1)
    x = np.random.default_rng(3).standard_normal((ROWS, 8)).astype("float32")
    df = cluster.createDataFrame([(i, x[i].tolist()) for i in range(ROWS)],
                                 "id long, features array<float>").repartition(8).cache()
    df.count()
    return model, x, df, np.asarray(model(x)).reshape(-1)


def builds(build_log: str, bm) -> list[dict]:
    return [r for r in read_build_log(build_log) if r["key"].split("@")[0] == bm.key]


def scored(bm, df, **kwargs) -> np.ndarray:
    out = bm.transform(df, "features", **kwargs).select("id", "prediction").toPandas()
    return out.sort_values("id")["prediction"].to_numpy()


# --- GPUs per task (first: the RDD workers have not warned yet) -------------------------

def test_each_task_builds_its_model_for_its_gpu_and_scores_on_cpu_here(cluster, case):
    """Every task's model is keyed by, and records, the GPU Spark assigned the task (also
    in a reused worker whose next task got the other GPU); TensorFlow sees no GPU here, so
    it runs on the CPU, correctly, and each worker process warns once."""
    model, x, _df, expected = case
    bm = sk.BroadcastModel(cluster, model)
    bm2 = sk.BroadcastModel(cluster, models.mlp(n_features=8, hidden=4, outputs=1, name="other"))

    def probe(rows):
        from pyspark import TaskContext

        warnings: list[str] = []
        handler = logging.Handler(logging.WARNING)
        handler.emit = lambda record: warnings.append(record.getMessage())
        logger = logging.getLogger("spark_keras")
        logger.addHandler(handler)
        try:
            rows = list(rows)
            preds = list(bm.predict_partition([x[i] for i in rows]))
            list(bm2.predict_partition([x[i] for i in rows]))  # a second model: no second warning
        finally:
            logger.removeHandler(handler)
        placement = sk.cache_info()["placement_by_key"]
        addresses = TaskContext.get().resources()["gpu"].addresses
        yield os.getpid(), list(addresses), placement, warnings, list(zip(rows, preds))

    tasks = cluster.sparkContext.parallelize(range(ROWS), 16).mapPartitions(probe).collect()
    got = dict(item for *_, items in tasks for item in items)
    np.testing.assert_allclose([got[i] for i in range(ROWS)], expected, atol=1e-5)
    assert {a for _, addresses, *_ in tasks for a in addresses} == {"0", "1"}
    for _, addresses, placement, _, _ in tasks:
        assert len(addresses) == 1
        entry = placement[f"{bm.key}@GPU:{addresses[0]}"]
        assert entry["requested_device"] == f"GPU:{addresses[0]}", entry
        assert entry["gpu_address"] == addresses[0] and entry["device"] == "CPU:0", entry
    warned: dict[int, list[str]] = {}
    for pid, _, _, warnings, _ in tasks:
        warned.setdefault(pid, []).extend(w for w in warnings if "TensorFlow sees 0 GPU" in w)
    assert all(len(w) == 1 for w in warned.values()), warned


# --- threads follow the task's CPUs --------------------------------------------------

def test_scoring_tasks_size_tensorflow_threads_to_their_cpus(cluster, case, build_log):
    model, _x, df, expected = case
    bm = sk.BroadcastModel(cluster, model)
    np.testing.assert_allclose(scored(bm, df), expected, atol=1e-5)
    records = builds(build_log, bm)
    assert records
    for r in records:
        assert (r["task_cpus"], r["intra_op_threads"], r["inter_op_threads"], r["threads"]) \
            == (1, 1, 1, "task"), r
        assert r["device"] == "CPU:0" and r["key"] == f"{bm.key}@{r['requested_device']}", r


def test_a_stage_profile_with_two_cpus_gives_tensorflow_two_threads(cluster, case, build_log):
    model, _x, df, expected = case
    bm = sk.BroadcastModel(cluster, model)
    # task requests alone: a TaskResourceProfile (the executors stay as they are)
    profile = ResourceProfileBuilder().require(TaskResourceRequests().cpus(2)).build
    np.testing.assert_allclose(scored(bm, df, profile=profile), expected, atol=1e-5)
    records = builds(build_log, bm)
    assert records
    for r in records:
        assert (r["task_cpus"], r["intra_op_threads"], r["inter_op_threads"]) == (2, 2, 2), r
        assert r["requested_device"] is None and r["key"] == bm.key, r  # no GPU asked
    if DAEMON == "spark_keras.executor.daemon":  # numpy's and scipy's BLAS pools ran in the
        # daemon (OMP_NUM_THREADS=2): it still preloaded, and its workers' pools have 2 threads
        import pyarrow as pa

        def probe(batches):
            import threadpoolctl

            for _ in batches:
                pass
            pools = [p["num_threads"] for p in threadpoolctl.threadpool_info()
                     if p["internal_api"] == "openblas"]
            yield pa.RecordBatch.from_pylist([{"ppid": os.getppid(), "pools": pools}])

        found = df.mapInArrow(probe, "ppid long, pools array<long>", profile=profile).collect()
        reports = daemon_reports(build_log)
        assert all(reports[r.ppid]["refused"] is None and r.pools == [2, 2] for r in found), \
            (found, reports)


def test_the_users_thread_setting_wins(cluster, case, build_log):
    """TF_NUM_INTRAOP_THREADS on the executors: spark_keras leaves the intra-op pool to it
    (and still sizes the inter-op pool). The variable goes through the context's executor
    environment, which every function shipped afterwards carries (new workers)."""
    model, _x, df, expected = case
    bm = sk.BroadcastModel(cluster, model)
    environment = cluster.sparkContext.environment
    environment["TF_NUM_INTRAOP_THREADS"] = "3"
    try:
        np.testing.assert_allclose(scored(bm, df), expected, atol=1e-5)
    finally:
        del environment["TF_NUM_INTRAOP_THREADS"]
    records = builds(build_log, bm)
    assert records
    for r in records:
        assert (r["intra_op_threads"], r["inter_op_threads"], r["threads"]) \
            == (3, 1, "environment/task"), r


# --- on the driver: profile checks, device mapping, the daemon -----------------------

def test_profile_needs_pyspark_4_and_a_resource_profile():
    import pyspark

    assert resources.profile_supported(pyspark.__version__)  # the installed 4.x
    assert resources.profile_supported("4.0.0") and not resources.profile_supported("3.5.3")
    profile = ResourceProfileBuilder().require(TaskResourceRequests().cpus(2)).build
    resources.check_profile(profile)
    resources.check_profile(None, "3.5.3")  # no profile: fine on any version
    with pytest.raises(ArgumentError, match=r"PySpark 4.0 or later .* this is 3.5.3"):
        resources.check_profile(profile, "3.5.3")
    with pytest.raises(ArgumentTypeError, match="ResourceProfile, not dict"):
        resources.check_profile({"cpus": 2})


def test_transform_refuses_a_bad_profile_on_the_driver(cluster, case):
    model, _x, df, _expected = case
    with pytest.raises(ArgumentTypeError, match="profile must be"):
        sk.BroadcastModel(cluster, model).transform(df, "features", profile="gpu")


@pytest.mark.parametrize("address, visible, task, cuda, index", [
    ("1", 2, ["1"], None, 1),            # the address is TensorFlow's index
    ("3", 2, ["3"], "2,3", 1),           # CUDA_VISIBLE_DEVICES renumbers: its position
    ("3", 1, ["3"], None, 0),            # an isolated container sees the task's GPU alone
    ("3", 2, ["3"], None, None),         # not seen: CPU
    ("1", 0, ["1"], None, None),         # no GPU at all
    ("GPU-ab12", 2, ["GPU-ab12"], "GPU-0f,GPU-ab12", 1),  # UUIDs
])
def test_spark_gpu_address_to_tensorflow_index(address, visible, task, cuda, index):
    assert resources.tensorflow_gpu_index(address, visible, task, cuda) == index


def test_a_daemon_that_lists_tensorflow_devices_does_not_fork(tmp_path):
    daemon_tests.test_a_daemon_that_cannot_fork_safely_becomes_the_stock_one(
        tmp_path, "tests.preload.lists_devices", "preloading listed TensorFlow's devices")


@pytest.mark.skipif(DAEMON != "spark_keras.executor.daemon", reason="the stock daemon is tested")
def test_the_daemon_preloads_without_listing_devices(cluster, build_log):
    reports = preloaded_daemons(cluster, build_log)
    assert all(r["tensorflow_devices_listed"] is False for r in reports), reports
