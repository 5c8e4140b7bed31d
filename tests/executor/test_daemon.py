"""The preloading daemon (``spark.python.daemon.module=spark_keras.executor.daemon``):
workers fork from a daemon that imported TensorFlow, Keras and the SPARK_KERAS_PRELOAD
modules without starting TensorFlow's runtime or any thread a fork does not stop (BLAS
pools of tasks with two CPUs are stopped by a fork), score bit-identically on every
path (with ``spark.python.worker.reuse=false``, after a worker is killed), keep sharing
the daemon's pages when they drop a model, and a daemon that cannot fork safely becomes
the stock one."""

from __future__ import annotations

import os
import re
import signal
import struct
import subprocess
import sys

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for
from tests import models
from tests.conftest import REPO_ROOT, builds_by_worker, daemon_reports, make_spark, preloaded_daemons
from tests.preload.layers import Scale

DAEMON = "spark_keras.executor.daemon"


@pytest.fixture(scope="module")
def spark(build_log):
    # local[2,2]: two slots, a failed task is retried once; a fresh worker for every task
    session = make_spark("local[2,2]", build_log, **{
        "spark.python.daemon.module": DAEMON,
        "spark.python.worker.reuse": "false",
        "spark.executorEnv.SPARK_KERAS_PRELOAD": "tests.preload.layers"})
    yield session
    session.stop()


def scaled_mlp() -> keras.Model:
    inp = keras.Input((6,))
    out = keras.layers.Dense(3)(Scale(3.0)(keras.layers.Dense(16, activation="relu")(inp)))
    return keras.Model(inp, out)


def test_starting_the_daemon_module_imports_nothing_that_starts_a_thread():
    """``python -m spark_keras.executor.daemon`` imports its package first: pyarrow (whose
    allocator starts a thread as it loads), PySpark or TensorFlow imported there would run
    before the daemon's guard, and every daemon would fall back to the stock one."""
    code = ("import sys, spark_keras.executor.daemon as d; "
            "print(sorted(m for m in ('pyarrow', 'pandas', 'pyspark', 'tensorflow', 'keras') "
            "if m in sys.modules), d.native_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO_ROOT)).stdout
    assert out.strip() == "[] ['python']", out


def test_workers_fork_from_a_daemon_that_preloaded_safely(spark, build_log):
    for report in preloaded_daemons(spark, build_log, partitions=4):
        assert report["keras"].startswith(("keras3", "tf_keras")) and report["backend"] == "tensorflow"
        assert report["preloaded"] == ["tests.preload.layers"]
        assert report["threads"] == ["python"] and report["python_threads"] == ["MainThread"], report
        assert report["tensorflow_runtime_started"] is False
        assert report["gc_frozen_objects"] > 100_000  # Keras and TensorFlow, out of the GC's way


def test_every_scoring_path_matches_the_model_bit_for_bit(spark, build_log):
    from pyspark.ml.functions import array_to_vector

    model = scaled_mlp()
    x = np.random.default_rng(4).standard_normal((40, 6)).astype("float32")
    want = predictor_for(model)([x], 1024)[0]
    bm = sk.BroadcastModel(spark, model)
    # two partitions, one a slot: each of the five paths runs two tasks, each in a fresh
    # worker (reuse is off), ten builds in all (four partitions proved no more: 35 s)
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(40)],
                               "id long, f array<float>").repartition(2)

    def stacked(pdf, col="prediction"):
        return np.stack(pdf.sort_values("id")[col].to_numpy())

    np.testing.assert_array_equal(stacked(bm.transform(df, "f").toPandas()), want)
    np.testing.assert_array_equal(stacked(bm.transform(
        df.withColumn("v", array_to_vector("f")), "v").toPandas()), want)
    np.testing.assert_array_equal(stacked(df.select("id", bm.predict_udf()("f").alias("p"))
                                          .toPandas(), "p"), want)

    def partitions(rows):
        rows = list(rows)
        return zip([r.id for r in rows], bm.predict_partition([r.f for r in rows]))

    def user_code(rows):  # user code calling bm.value in the RDD pool
        rows = list(rows)
        out = np.asarray(bm.value(np.array([r.f for r in rows], "float32").reshape(-1, 6)))
        return zip([r.id for r in rows], out)

    for fn in (partitions, user_code):
        got = dict(df.rdd.mapPartitions(fn).collect())
        np.testing.assert_array_equal(np.stack([got[i] for i in range(40)]), want)

    builds = builds_by_worker(build_log, bm.key)
    # a fresh worker for each path's tasks, one build each
    assert len(builds) >= 10 and set(builds.values()) == {1}, builds


def test_a_worker_killed_mid_task_is_replaced_and_no_row_is_lost(spark):
    model = models.mlp(4, 8, 2)
    bm = sk.BroadcastModel(spark, model)
    x = np.arange(64, dtype="float32").reshape(16, 4) / 10

    def dies_once(rows):
        from pyspark import TaskContext

        rows = list(rows)
        ctx = TaskContext.get()
        if ctx.partitionId() == 1 and ctx.attemptNumber() == 0:
            bm.value  # noqa: B018  (mid-task: the model is built, then the worker dies)
            os.kill(os.getpid(), signal.SIGKILL)
        return [(i, ctx.attemptNumber(), p) for i, p in zip(rows, bm.predict_partition([x[i] for i in rows]))]

    out = spark.sparkContext.parallelize(range(16), 4).mapPartitions(dies_once).collect()
    assert sorted(i for i, _, _ in out) == list(range(16))
    assert {i: a for i, a, _ in out if a}.keys() == {4, 5, 6, 7}  # partition 1, retried
    np.testing.assert_array_equal(np.stack([p for *_, p in sorted(out, key=lambda r: r[0])]),
                                  predictor_for(model)([x], 1024)[0])


def test_dropping_a_model_keeps_the_pages_a_worker_shares_with_the_daemon(spark, build_log):
    """A worker that drops a model (``release_stale`` after an ``unpersist``, an LRU
    eviction, ``clear``) reclaims it without walking, and so copying, the daemon's frozen
    objects: its private memory grew by ~100 MB when it unfroze them."""
    bm = sk.BroadcastModel(spark, scaled_mlp())
    x = np.ones((8, 6), "float32")

    def task(_):
        import gc
        import weakref

        from spark_keras.cache import model_cache

        def private_dirty_mb():
            with open("/proc/self/smaps_rollup") as f:
                return next(int(line.split()[1]) for line in f
                            if line.startswith("Private_Dirty:")) / 1024

        inherited = gc.get_freeze_count()  # the daemon's, before this worker built anything
        model = weakref.ref(bm.value)
        bm.predict_partition(list(x))
        before = private_dirty_mb()
        model_cache.drop(bm.key)  # what release_stale does for an unpersisted model
        yield os.getppid(), inherited, model() is None, private_dirty_mb() - before

    (ppid, inherited, collected, growth), = \
        spark.sparkContext.parallelize([0], 1).mapPartitions(task).collect()
    assert daemon_reports(build_log)[ppid]["refused"] is None and inherited > 100_000, inherited
    assert collected  # the dropped model's cycles are reclaimed
    assert growth < 30, growth  # 0-1 MB; 97 MB when the worker unfroze the daemon's objects


# --- the fork checks, on the daemon process itself ------------------------------------

@pytest.mark.parametrize("preload, reason", [
    ("tests.preload.starts_thread", r"preloading left 2 threads running \(.*preload-sleeper"),
    ("tests.preload.runs_tf_op", "preloading started TensorFlow's runtime"),
    ("tests.no_such_module", "preloading failed: SparkKerasError: cannot preload 'tests.no_such_module'"),
])
def test_a_daemon_that_cannot_fork_safely_becomes_the_stock_one(tmp_path, preload, reason):
    becomes_the_stock_daemon(tmp_path, preload, reason)


def test_a_native_thread_that_survives_a_fork_still_refuses_with_two_cpus(tmp_path):
    """With 2 CPUs numpy's and scipy's BLAS pools run too, their threads named as the main
    thread, as is this one: the fork probe tells them apart by thread id."""
    becomes_the_stock_daemon(tmp_path, "tests.preload.starts_native_thread",
                             r"preloading left 2 threads running across a fork "
                             r"\(1 started by preloading: python\)", cpus="2")


def test_a_daemon_with_two_cpus_preloads_though_blas_started_threads(tmp_path):
    """Spark gives a daemon ``OMP_NUM_THREADS=<task CPUs>``: numpy's and scipy's OpenBLAS
    (scipy also comes with TensorFlow here) start pool threads as they load. A fork stops
    them (OpenBLAS's fork handler): the daemon preloads and forks with no other thread."""
    report, cmdline, stderr = start_daemon(tmp_path, "scipy.linalg", cpus="2")
    assert report["refused"] is None and b"spark_keras.executor.daemon" in cmdline, report
    assert "scipy.linalg" in report["preloaded"] and "spark_keras daemon" not in stderr, stderr
    assert len(report["threads"]) >= 3 and report["threads_at_fork"] == ["python"], report


def becomes_the_stock_daemon(tmp_path, preload: str, reason: str, cpus: str = "1") -> None:
    """Start the daemon as Spark does; check it became the stock one for ``reason``."""
    report, cmdline, stderr = start_daemon(tmp_path, preload, cpus)
    assert b"pyspark.daemon" in cmdline  # the same process, now the stock daemon
    assert "spark_keras daemon: " in stderr and "using the stock PySpark daemon" in stderr, stderr
    assert report["refused"] and re.search(reason, report["refused"]), report


# the environment as it was when the tests were collected: sessions started by earlier
# tests leave variables behind that a daemon started here would inherit (in a whole run
# the 2-CPU daemon's OpenBLAS then started no pool threads, alone it did)
_COLLECTED_ENV = dict(os.environ)


def start_daemon(tmp_path, preload: str, cpus: str) -> tuple[dict, bytes, str]:
    """Start the daemon as Spark does, with ``OMP_NUM_THREADS`` the task's CPUs (as Spark
    sets it), and stop it once it told its port; its report, command line and stderr."""
    env = dict(_COLLECTED_ENV, PYTHONPATH=REPO_ROOT, SPARK_KERAS_PRELOAD=preload,
               OMP_NUM_THREADS=cpus, SPARK_KERAS_DAEMON_REPORT=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", DAEMON], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        port = struct.unpack("!i", proc.stdout.read(4))[0]  # what Spark reads first
        assert 0 < port < 65536
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read()
    finally:
        proc.stdin.close()  # the daemon's signal to shut down
        proc.wait(timeout=60)
        stderr = proc.stderr.read().decode()
    return daemon_reports(str(tmp_path))[proc.pid], cmdline, stderr
