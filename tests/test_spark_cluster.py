"""What really crosses executors: local-cluster[2,1,1024] (two executor JVMs, each with
its own Python daemon and workers)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import spark_keras as sk

from . import models
from .conftest import builds_by_worker, make_spark


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


def test_worker_killed_mid_job_every_row_exactly_once(cluster, build_log):
    """SIGKILL the first Python worker that builds the model, while the job runs: Spark
    retries its task and the output still has every row once, with correct predictions."""
    import signal
    import threading
    import time

    from spark_keras.cache import read_build_log

    model = models.actor_cnn()
    x, df = observations(cluster, rows=96, partitions=24, seed=12)
    bm = sk.BroadcastModel(cluster, model)
    killed: list[int] = []

    def killer():
        deadline = time.time() + 240
        while time.time() < deadline and not killed:
            records = [r for r in read_build_log(build_log) if r["key"] == bm.key]
            if records:
                pid = records[0]["pid"]
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    return
            time.sleep(0.02)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    out = bm.transform(df, "obs", batch_size=4).select("id", "prediction").toPandas()
    thread.join(5)
    assert killed, "the killer never found a worker to kill"
    assert sorted(out["id"]) == list(range(len(x)))  # every row, exactly once
    got = np.stack(out.sort_values("id")["prediction"].to_numpy())
    np.testing.assert_allclose(got, np.asarray(model(x)), atol=1e-5)
    builders = builds_by_worker(build_log, bm.key)
    assert any(pid != killed[0] for _, pid in builders)  # another worker took over
