"""Large payloads through Spark's shuffle at ship time
(:mod:`spark_keras.executor.transport.chunked`): shares read from the driver's channel,
exchanged between executors, each executor's file written and checked against the
driver's digest before any task needs it, no chunk left in any block manager after.

The threshold and the chunk size are lowered (driver-side settings read when a payload
ships) so that a small model takes the large path in several shares: seconds, not
minutes."""

from __future__ import annotations

import hashlib
import os

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.executor import driver_payload
from spark_keras.executor.transport import chunked
from spark_keras.executor.transport.executor_file import executor_folder
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.payload import host_file
from tests.conftest import make_spark

CHUNK = 64 * 1024


def mlp(seed: int) -> keras.Model:
    """About 1.1 MB of weights: 17 chunks of 64 KiB."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((32,)), keras.layers.Dense(512, activation="tanh"),
                             keras.layers.Dense(512, activation="tanh"), keras.layers.Dense(2)])


@pytest.fixture
def small_chunks(monkeypatch):
    """Payloads over 64 KiB take the large path, in 64 KiB chunks."""
    monkeypatch.setattr(driver_payload, "LARGE_PAYLOAD", CHUNK)
    monkeypatch.setattr(chunked, "CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(chunked, "SHARE_BYTES", 4 * CHUNK)  # 17 chunks: shares of 4 or so


@pytest.fixture(scope="module")
def cluster(build_log):
    import time

    session = make_spark("local-cluster[2,1,1024]", build_log,
                         **{"spark.executor.memory": "1g"})
    # both executors registered: a model ships to the executors there when it ships
    deadline = time.monotonic() + 120
    while session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3 \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    yield session
    session.stop()


def release_cached(spark) -> None:
    """The shared session's cached frames of earlier modules unpersisted: blocks added
    while the memory store is full evict them, and the storage figures would count the
    chunks less what they pushed out (in the whole suite: 83% of a payload)."""
    import gc
    import time

    gc.collect()  # handles of earlier modules no longer referenced release their blocks
    spark.catalog.clearCache()
    for rdd in spark.sparkContext._jsc.getPersistentRDDs().values():
        rdd.unpersist(True)
    # Spark's ContextCleaner removes the blocks of broadcasts and RDDs the JVM collected,
    # asynchronously: a JVM GC now, and the figure read until it holds still, so that no
    # earlier module's cleanup lands between the figures read below (in CI: 65%)
    spark.sparkContext._jvm.System.gc()
    last, deadline = -1, time.monotonic() + 20
    while (now := stored(spark)) != last and time.monotonic() < deadline:
        last = now
        time.sleep(1.0)


def stored(spark) -> int:
    """Bytes of blocks in the storage memory of every block manager (the driver's and
    the executors'), as Spark's block manager master counts them."""
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().values().iterator()
    total = 0
    while status.hasNext():
        limit_and_free = status.next()
        total += limit_and_free._1() - limit_and_free._2()
    return total


def scored(spark, bm, x, **kwargs):
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(len(x))],
                               "id long, features array<float>").repartition(2)
    got = bm.transform(df, "features", **kwargs).toPandas().sort_values("id")
    return got, np.stack(got["prediction"].to_numpy()).astype("float32")




def executor_files(spark, tasks: int = 8) -> dict[str, list[str]]:
    """The names in each executor's payload folder that the tasks of one job saw (a short
    sleep each, so that every executor gets one), by folder."""
    def look(_):
        import time

        time.sleep(0.3)
        folder = executor_folder()
        yield folder, sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []

    return dict(spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(look).collect())


def held_files(spark, key: str, tasks: int = 2) -> list[str]:
    """The files of model ``key`` in the executor's payload folder that its Python workers
    hold open (the users file of a model they built aside; other models' files, which
    workers that built them keep in their cache, do not count): one task on each worker
    of local[2]."""
    def look(_):
        import time

        time.sleep(0.3)
        folder, held = executor_folder(), []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
            except OSError:
                continue
            if folder and target.startswith(os.path.join(folder, key)) \
                    and not target.endswith(".users"):
                held.append(target)
        yield from held

    return spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(look).collect()


def jobs_started(sc) -> int:
    """The number of Spark jobs ``sc`` has started."""
    value = sc._jsc.sc().dagScheduler().nextJobId()  # an AtomicInteger (Py4J: its int)
    return int(value.get() if hasattr(value, "get") else value)


def test_the_executor_file_is_written_at_ship_and_no_chunk_stays(spark, small_chunks):
    """local[2] (the driver's block manager is the only one): the executor's file of each
    version is there before a task needs it, written by one Spark job whatever the
    number of chunks; no chunk's blocks or driver file stay, no worker holds a file of
    the folder open."""
    x = np.random.default_rng(3).standard_normal((16, 32)).astype("float32")
    release_cached(spark)
    before = stored(spark)
    temp = set(os.listdir(spark.sparkContext._temp_dir))
    jobs = jobs_started(spark.sparkContext)
    bm = sk.BroadcastModel(spark, mlp(4))
    try:
        assert jobs_started(spark.sparkContext) - jobs == 1  # the warm-up (17 chunks)
        assert held_files(spark, bm.key) == []
        n, name = bm._nbytes, bm._name
        [(folder, names)] = executor_files(spark).items()
        assert f"{bm.key}.skp" in names and not [f for f in names if ".tmp-" in f], names
        assert os.path.getsize(host_file.path_for(folder, bm.key)) == n > 16 * CHUNK
        assert stored(spark) - before < 0.2 * n  # no block of the shuffle stays
        assert set(os.listdir(spark.sparkContext._temp_dir)) <= temp  # and its driver files
        assert isinstance(bm._transport, ServedTransport)  # who was not there downloads it
        _, found = scored(spark, bm, x)
        np.testing.assert_allclose(found, np.asarray(mlp(4)(x)), rtol=1e-5, atol=1e-6)

        bm.update(mlp(5))  # a later version ships the same way
        [(_, names)] = executor_files(spark).items()
        assert f"{name}.v2.skp" in names, names
        assert stored(spark) - before < 0.2 * n
        got, found = scored(spark, bm, x, version_col="v")
        assert set(got["v"]) == {"2"}
        np.testing.assert_allclose(found, np.asarray(mlp(5)(x)), rtol=1e-5, atol=1e-6)
        bm.unpersist(blocking=True)  # built again under a new key, from the driver's copy
        _, found = scored(spark, bm, x)
        np.testing.assert_allclose(found, np.asarray(mlp(5)(x)), rtol=1e-5, atol=1e-6)
    finally:
        bm.destroy(blocking=True)
    assert stored(spark) - before < 0.2 * n


def test_chunks_that_are_not_the_payload_publish_nothing(spark, small_chunks):
    """The shares read from the driver's channel are assembled on the executor, and the
    file published only if its digest is the one the handle carries."""
    import dataclasses

    sc = spark.sparkContext
    bm = sk.BroadcastModel(spark, mlp(7))
    try:
        right, n = bm._transport, bm._nbytes
        wrong = dataclasses.replace(right, sha256=hashlib.sha256(b"another payload").hexdigest())
        assert chunked.warm(sc, "warm-refused", n, wrong) == 0
        [(folder, names)] = executor_files(spark, 2).items()
        assert not [f for f in names if f == "warm-refused.skp" or ".tmp-" in f], names
        try:
            assert chunked.warm(sc, "warm-taken", n, right) == 1
            with open(host_file.path_for(folder, "warm-taken"), "rb") as f, \
                    open(host_file.path_for(folder, bm.key), "rb") as g:
                assert f.read() == g.read()
        finally:
            host_file.discard(folder, "warm-taken")
    finally:
        bm.destroy(blocking=True)


@pytest.mark.slow  # a local-cluster of its own: about 40 s idle (3-4 min under load)
def test_each_executor_has_the_file_at_ship_and_builds_from_it(cluster, build_log, small_chunks):
    model, second = mlp(0), mlp(1)
    x = np.random.default_rng(1).standard_normal((40, 32)).astype("float32")
    before = stored(cluster)
    bm = sk.BroadcastModel(cluster, model)
    try:
        n, name = bm._nbytes, bm._name
        found_files = executor_files(cluster)
        assert len(found_files) == 2, found_files  # both executors, each with the file
        assert all(f"{bm.key}.skp" in names for names in found_files.values()), found_files
        for folder in found_files:
            assert os.path.getsize(host_file.path_for(folder, bm.key)) == n
        assert stored(cluster) - before < 0.2 * n  # no block manager holds a chunk
        _, found = scored(cluster, bm, x)
        np.testing.assert_allclose(found, np.asarray(model(x)), rtol=1e-5, atol=1e-6)
        records = [r for r in read_build_log(build_log) if r["key"] == bm.key]
        assert records and all(r["shared"] for r in records), records

        # read before scoring: a scoring job's task binaries stay in the block managers
        # until the JVM collects them (252 KB in CI), which says nothing of the chunks
        before = stored(cluster)
        assert bm.update(second) == "2"  # a new version is written on both the same way
        assert all(f"{name}.v2.skp" in names for names in executor_files(cluster).values())
        assert stored(cluster) - before < 0.2 * n
        got, found = scored(cluster, bm, x, version_col="v")
        assert set(got["v"]) == {"2"}
        np.testing.assert_allclose(found, np.asarray(second(x)), rtol=1e-5, atol=1e-6)
    finally:
        bm.destroy(blocking=True)


def test_a_ship_gives_up_the_warm_up_while_other_jobs_hold_the_slots(spark, small_chunks,
                                                                      monkeypatch):
    """Another thread's job holds both slots of local[2] (a streaming query could, for
    ever): the warm-up's job waits for them, so the ship gives it up after
    STALL_SECONDS (lowered to 2 here; it waited as long as the other job ran), leaves no
    partial file, and the executor builds from the driver's copy once it has a slot."""
    import threading
    import time

    from spark_keras.executor.transport import slot_wait

    monkeypatch.setattr(slot_wait, "STALL_SECONDS", 2.0)
    sc = spark.sparkContext
    x = np.random.default_rng(5).standard_normal((8, 32)).astype("float32")

    def busy() -> None:
        sc.setJobGroup("test-busy", "holds every slot", True)
        try:
            sc.parallelize(range(2), 2).foreach(lambda _: __import__("time").sleep(90))
        except Exception:
            pass  # cancelled below

    holder = threading.Thread(target=busy, daemon=True)
    holder.start()
    tracker = sc.statusTracker()
    deadline = time.monotonic() + 60
    while sum(tracker.getStageInfo(s).numActiveTasks for s in tracker.getActiveStageIds()
              if tracker.getStageInfo(s)) < 2:
        assert time.monotonic() < deadline, "the busy job never held both slots"
        time.sleep(0.2)
    started = time.monotonic()
    try:
        bm = sk.BroadcastModel(spark, mlp(6))
        shipped = time.monotonic() - started
    finally:
        sc.cancelJobGroup("test-busy")
        holder.join(60)
    try:
        assert shipped < 45, f"the ship waited {shipped:.0f} s for the other job's slots"
        deadline = time.monotonic() + 30  # the warm-up's clean-up runs once a slot frees
        while any(".tmp-" in f for names in executor_files(spark, 2).values()
                  for f in names):
            assert time.monotonic() < deadline, executor_files(spark, 2)
            time.sleep(0.5)
        _, found = scored(spark, bm, x)
        np.testing.assert_allclose(found, np.asarray(mlp(6)(x)), rtol=1e-5, atol=1e-6)
    finally:
        bm.destroy(blocking=True)
