"""One copy of the weights per executor, on local-cluster[2,1,1024]: each executor writes
the payload file once, all its Python workers (SQL and RDD pools) build on weights
mapped from it, outputs are bit-identical, and destroy() removes the files."""

from __future__ import annotations

import os

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.executor.transport.executor_file import executor_folder
from spark_keras.payload import host_file
from tests import models
from tests.conftest import builds_by_worker, make_spark, worker_cache_infos
from tests.spark.test_cluster import observations


@pytest.fixture(scope="module")
def cluster(build_log):
    session = make_spark("local-cluster[2,1,1024]", build_log, **{"spark.executor.memory": "1g"})
    yield session
    session.stop()


@pytest.mark.slow  # a cluster or a server of its own: 20-50 s
def test_one_file_per_executor_shared_by_its_workers(cluster, build_log, tmp_path):
    model = models.actor_cnn()
    x, df = observations(cluster, rows=40, partitions=8, seed=21)
    bm = sk.BroadcastModel(cluster, model)
    keras_file = str(tmp_path / "actor.keras")  # Keras's own format, read in the workers
    model.save(keras_file)

    out = bm.transform(df, "obs", batch_size=8).select("id", "prediction").toPandas().sort_values("id")
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)

    def user_code(rows):  # the RDD worker pool: user code calling bm.value
        rows = list(rows)
        batch = np.array([r.obs for r in rows], "float32").reshape(-1, 120, 160, 2)
        preds = np.asarray(bm.value(batch))
        import keras

        # Keras's own round trip on the same batch in the same worker (its threads, not the
        # driver's: a convolution's bits can depend on how many threads split it)
        want = np.asarray(keras.saving.load_model(keras_file)(batch))
        folder = executor_folder()
        yield folder, os.getpid(), os.stat(host_file.path_for(folder, bm.key)).st_ino, \
            sorted(os.listdir(folder)), want, preds

    parts = df.rdd.mapPartitions(user_code).collect()
    folders = {folder for folder, *_ in parts}
    assert len(folders) == 2, folders  # both executors ran tasks, each has its own folder
    for folder in folders:
        seen = [p for p in parts if p[0] == folder]
        assert len({ino for _, _, ino, *_ in seen}) == 1  # one file per executor
        assert all(files == [f"{bm.key}.skp", f"{bm.key}.skp.lock", f"{bm.key}.skp.users"]
                   for _, _, _, files, *_ in seen)
    for *_, want, preds in parts:  # bit-identical to Keras's own format on the same batch
        np.testing.assert_array_equal(preds, want)

    records = [r for r in read_build_log(build_log) if r["key"] == bm.key]
    assert records and all(r["shared"] and r["private_bytes"] == 0 for r in records), records
    builds = builds_by_worker(build_log, bm.key)
    assert set(builds.values()) == {1} and len(builds) <= 4, builds  # 2 executors x 2 pools
    infos = worker_cache_infos(cluster, bm, sql=False)
    memory = [i["memory_by_key"][bm.key] for i in infos.values() if bm.key in i["memory_by_key"]]
    assert memory and all(m["shared"] and m["private_bytes"] == 0 for m in memory), infos

    key = bm.key
    bm.destroy()
    other = sk.BroadcastModel(cluster, models.mlp())

    def files_left(_):
        other.release_stale()  # a live handle carries the released keys
        folder = executor_folder()
        yield folder, sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    left = dict(cluster.sparkContext.parallelize(range(8), 8).mapPartitions(files_left).collect())
    assert set(left) == folders
    assert not any(name.startswith(key) for names in left.values() for name in names), left


@pytest.mark.slow  # local-cluster: about 45 s
def test_unpersist_keeps_one_rebuild_per_worker_on_a_fresh_file(cluster, build_log):
    """After unpersist the handle takes a new key: each worker rebuilds once, on a new
    executor file, and the old file is removed."""
    model = models.mlp(8, 16, 2)
    df = cluster.createDataFrame([(i, [float(i)] * 8) for i in range(40)],
                                 "id long, f array<float>").repartition(8).cache()
    df.count()
    bm = sk.BroadcastModel(cluster, model)
    bm.transform(df, "f").collect()
    old = bm.key
    bm.unpersist(blocking=True)
    for _ in range(3):
        out = bm.transform(df, "f").toPandas().sort_values("id")
        expected = np.asarray(model(np.array([[float(i)] * 8 for i in range(40)], "float32")))
        np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), expected, atol=1e-6)
    builds = builds_by_worker(build_log, bm.key)
    assert set(builds.values()) == {1} and len(builds) <= 2, builds

    def files(_):
        bm.release_stale()  # the old key was released by unpersist()
        folder = executor_folder()
        yield sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    names = {n for part in cluster.sparkContext.parallelize(range(4), 4).mapPartitions(files).collect()
             for n in part}
    assert f"{bm.key}.skp" in names and f"{old}.skp" not in names, names


@pytest.mark.slow  # local-cluster and an S3 server: about 45 s
def test_a_stored_model_is_read_once_per_executor(cluster, build_log, s3):
    """An ``s3://`` model: each of the two executors reads it from storage once, into
    its own folder, whatever the number of its Python workers and tasks."""
    import time

    model = models.mlp(8, 16, 2)
    uri = s3.put("cluster.skp", sk.dumps(model))
    bm = sk.BroadcastModel(cluster, uri)
    df = cluster.createDataFrame([(i, [float(i)] * 8) for i in range(64)],
                                 "id long, f array<float>").repartition(16)
    expected = np.asarray(model(np.array([[float(i)] * 8 for i in range(64)], "float32")))
    for _ in range(2):
        out = bm.transform(df, "f").toPandas().sort_values("id")
        np.testing.assert_array_equal(np.stack(out["prediction"].to_numpy()), expected)

    def where(_):
        bm.value  # noqa: B018  (the RDD pool builds it too)
        yield executor_folder(), os.stat(host_file.path_for(executor_folder(), bm.key)).st_ino

    seen = dict(cluster.sparkContext.parallelize(range(8), 8).mapPartitions(where).collect())
    assert len(seen) == 2, seen  # both executors, one file each
    time.sleep(0.3)  # the server logs a request just after answering it
    assert s3.gets("cluster.skp") == 1 + 2, s3.requests  # the driver, then each executor once
    builds = builds_by_worker(build_log, bm.key)
    assert set(builds.values()) == {1} and len(builds) <= 4, builds
