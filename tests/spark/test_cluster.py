"""What really crosses executors: local-cluster[2,1,1024] (two executor JVMs, each with
its own Python daemon and workers)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import spark_keras as sk
from tests import models
from tests.conftest import DAEMON, builds_by_worker, make_spark, preloaded_daemons


@pytest.fixture(scope="module")
def cluster(build_log):
    session = make_spark("local-cluster[2,1,1024]", build_log,
                         **{"spark.executor.memory": "1g", "spark.python.worker.reuse": "true"})
    yield session
    session.stop()


def observations(cluster, rows: int, partitions: int, seed: int):
    """Random actor-CNN observations, and a cached DataFrame of them (id, flat obs)."""
    x = np.random.default_rng(seed).standard_normal((rows, 120, 160, 2)).astype("float32")
    df = cluster.createDataFrame([(i, x[i].reshape(-1).tolist()) for i in range(rows)],
                                 "id long, obs array<float>").repartition(partitions).cache()
    df.count()
    return x, df


@pytest.mark.slow  # a whole job or driver of its own, or a cluster: 40-50 s
def test_two_executors_build_once_per_worker_and_match_the_driver(cluster, build_log):
    model = models.actor_cnn()
    x, df = observations(cluster, rows=48, partitions=12, seed=11)
    expected = np.asarray(model(x))
    bm = sk.BroadcastModel(cluster, model)

    for _ in range(2):
        out = bm.transform(df, "obs", batch_size=8).select("id", "prediction").toPandas().sort_values("id")
        np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), expected, atol=1e-5)

    def where(rows):
        rows = list(rows)
        obs = np.array([r.obs for r in rows], "float32").reshape(-1, 120, 160, 2)
        preds = np.asarray(bm.value(obs)) if rows else np.zeros((0, 5))
        yield os.getcwd(), os.getpid(), [(r.id, p.tolist()) for r, p in zip(rows, preds)]

    parts = df.rdd.mapPartitions(where).collect()
    executors = {cwd for cwd, _, _ in parts}
    assert len(executors) == 2, executors  # tasks really ran in both executors
    got = dict(item for _, _, items in parts for item in items)
    np.testing.assert_allclose(np.array([got[i] for i in range(len(x))]), expected, atol=1e-5)

    builds = builds_by_worker(build_log, bm.key)
    assert builds and all(n == 1 for n in builds.values()), builds
    pids_that_scored = {pid for _, pid, _ in parts}
    assert pids_that_scored <= {pid for _, pid in builds}
    # 2 executors x 1 core: at most one Python worker per executor and pool (SQL, RDD)
    assert len(pids_that_scored) <= 2 and len(builds) <= 4, (pids_that_scored, builds)


@pytest.mark.slow  # local-cluster, a worker killed and its task retried: about 60 s
def test_worker_killed_mid_task_every_row_exactly_once(cluster, build_log, tmp_path):
    """One task SIGKILLs its own Python worker on its first attempt, once the model is
    built: Spark retries it, and the output has every row once, with correct predictions,
    the killed partition's rows coming from the retry."""
    import signal

    from pyspark import TaskContext

    model = models.actor_cnn()
    x, df = observations(cluster, rows=96, partitions=24, seed=12)
    bm = sk.BroadcastModel(cluster, model)
    marker = str(tmp_path / "killed")

    def score(rows):
        ctx = TaskContext.get()
        rows = list(rows)
        obs = np.array([r.obs for r in rows], "float32").reshape(-1, 120, 160, 2)
        preds = np.asarray(bm.value(obs)) if rows else np.zeros((0, 5))  # the model is built
        if rows and ctx.attemptNumber() == 0:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # one task only
            except FileExistsError:
                pass
            else:
                os.write(fd, f"{os.getpid()} {ctx.partitionId()}".encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGKILL)
        for r, p in zip(rows, preds):
            yield r.id, p.tolist(), ctx.partitionId(), ctx.attemptNumber()

    out = df.rdd.mapPartitions(score).collect()
    with open(marker) as f:
        killed_pid, killed_partition = map(int, f.read().split())
    assert sorted(i for i, *_ in out) == list(range(len(x)))  # every row, exactly once
    got = {i: p for i, p, *_ in out}
    np.testing.assert_allclose(np.array([got[i] for i in range(len(x))]), np.asarray(model(x)), atol=1e-5)
    attempts = {(part, attempt) for _, _, part, attempt in out}
    assert (killed_partition, 0) not in attempts  # the killed attempt left no rows
    assert any(part == killed_partition and attempt >= 1 for part, attempt in attempts), attempts
    assert killed_pid in {pid for _, pid in builds_by_worker(build_log, bm.key)}  # had built it


@pytest.mark.slow  # local-cluster: about 30 s
def test_each_executor_forks_its_workers_from_a_preloaded_daemon(cluster, build_log):
    if DAEMON != "spark_keras.executor.daemon":
        pytest.skip("the suite runs on the stock daemon (SPARK_KERAS_TEST_DAEMON)")
    daemons = preloaded_daemons(cluster, build_log, partitions=12)
    assert len(daemons) == 2, daemons  # one per executor


@pytest.mark.slow  # a cluster's jobs: about 40 s
def test_an_update_and_keyed_models_cross_executors(cluster, build_log):
    """Both executors ask the driver for the version and read version 2 from it (a
    DataFrame planned before the update scores with it, exactly); KeyedModels' models,
    read from the driver by the executors that meet their keys, score exactly too."""
    from tests.spark.test_keyed import _assert_exact, _frame, _rows

    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"cross{i}") for i in (1, 2))
    rows = _rows(["a", "b", "c"], seed=5)
    df = _frame(cluster, rows).repartition(8).cache()
    df.count()
    bm = sk.BroadcastModel(cluster, v1)
    scored = bm.transform(df, "features", version_col="v")
    _assert_exact(scored.toPandas().assign(key="a"), {"a": v1})
    bm.update(v2)

    def executor(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([os.getcwd()])], names=["cwd"])

    out = scored.toPandas()
    assert set(out.v) == {"2"}
    _assert_exact(out.assign(key="a"), {"a": v2})
    builders = builds_by_worker(build_log, f"{bm._name}.v2")
    assert len(builders) >= 2, builders  # workers of both executors (one each at least)
    assert len({r.cwd for r in df.mapInArrow(executor, "cwd string").collect()}) == 2
    bm.destroy()

    by_key = {k: models.mlp(n_features=4, hidden=8, name=f"cross_{k}") for k in ("a", "b", "c")}
    km = sk.KeyedModels(cluster, by_key)
    try:
        _assert_exact(km.transform(df, "features", key="key").toPandas(), by_key)
    finally:
        km.destroy()
