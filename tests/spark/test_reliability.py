"""Bad rows, evictions, dropped broadcasts, version mismatches and memory bounds, on real
local Spark."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.executor.transport.broadcast import BroadcastTransport
from tests import models
from tests.conftest import builds_by_worker, make_spark, run_script, worker_cache_infos
from tests.payload.test_integrity import rewrite_header

CACHE_LIMIT = 3
SLOTS = 2  # local[2]: at most two Python workers per pool (SQL, RDD) build a model


@pytest.fixture(scope="module")
def spark(build_log):
    session = make_spark("local[2]", build_log,
                         **{"spark.executorEnv.SPARK_KERAS_CACHE_MAX_ENTRIES": str(CACHE_LIMIT)})
    yield session
    session.stop()


@pytest.mark.slow  # 18 s of make test's 15 min
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


@pytest.mark.slow  # 20 s of make test's 15 min
def test_cache_limit_holds_over_ten_models(spark, build_log):
    """Ten models through a 3-entry cache: workers evict, and a model evicted everywhere
    is rebuilt when used again, and predicts what the driver's model predicts."""
    df = spark.createDataFrame([(i, [0.1 * i] * 4) for i in range(16)], "id long, f array<float>").repartition(4)
    x = np.array([[0.1 * i] * 4 for i in range(16)], "float32")
    handles, expected = [], []
    for k in range(10):
        model = models.mlp(n_features=4, hidden=8, outputs=1, name=f"m{k}")
        bm = sk.BroadcastModel(spark, model)
        expected.append(np.asarray(model(x)).reshape(-1))
        out = bm.transform(df, "f").toPandas().sort_values("id")
        np.testing.assert_allclose(out["prediction"], expected[-1], atol=1e-6)
        handles.append(bm)
    infos = worker_cache_infos(spark)
    assert all(i["entries"] <= CACHE_LIMIT and i["max_entries"] == CACHE_LIMIT for i in infos.values())
    assert sum(i["evictions"] for i in infos.values()) > 0, (infos, builds_by_worker(build_log, handles[-1].key))
    first = handles[0]
    assert not any(first.key in i["keys"] for i in infos.values()), infos  # evicted everywhere
    built = sum(builds_by_worker(build_log, first.key).values())
    assert built >= 1
    out = first.transform(df, "f").toPandas().sort_values("id")
    np.testing.assert_allclose(out["prediction"], expected[0], atol=1e-6)
    assert sum(builds_by_worker(build_log, first.key).values()) > built  # really rebuilt


def rebuilt_since(build_log, key: str, before: dict) -> dict:
    """Builds of ``key`` by worker since ``before`` (a ``builds_by_worker`` snapshot)."""
    after = builds_by_worker(build_log, key)
    return {w: n - before.get(w, 0) for w, n in after.items() if n > before.get(w, 0)}


@pytest.mark.slow  # 19 s of make test's 15 min
def test_dropped_broadcast_value_rebuilds_transparently(spark, build_log):
    """A task that does not use the broadcast makes PySpark drop it from the worker; the
    model cache still serves the model (no second build), and after unpersist each worker
    rebuilds it exactly once."""
    model = models.mlp(n_features=4, outputs=1)
    bm = sk.BroadcastModel(spark, model)
    df = spark.createDataFrame([(i, [1.0] * 4) for i in range(8)], "id long, f array<float>").repartition(2)
    want = float(np.asarray(model(np.ones((1, 4), "float32"))).item())

    def scored_right() -> bool:
        out = bm.transform(df, "f").toPandas()["prediction"]
        return len(out) == 8 and np.allclose(out, want, atol=1e-6)

    def registry_sizes(batches):  # an unrelated SQL task, in the pool that scored
        try:
            from pyspark.core.broadcast import _broadcastRegistry
        except ImportError:  # PySpark 3.5
            from pyspark.broadcast import _broadcastRegistry
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([len(_broadcastRegistry)])], names=["n"])

    assert scored_right()
    built = builds_by_worker(build_log, bm.key)
    assert built and set(built.values()) == {1} and len(built) <= SLOTS, built
    sizes = spark.range(8, numPartitions=8).mapInArrow(registry_sizes, "n long").collect()
    assert {r.n for r in sizes} == {0}  # the workers dropped every broadcast value
    assert scored_right()
    served = builds_by_worker(build_log, bm.key)  # from the cache: no worker built it twice
    assert set(served.values()) == {1} and len(served) <= SLOTS, served
    bm.unpersist(blocking=True)
    before = builds_by_worker(build_log, bm.key)  # the key may change with unpersist
    assert scored_right()
    rebuilt = rebuilt_since(build_log, bm.key, before)
    assert rebuilt and set(rebuilt.values()) == {1} and len(rebuilt) <= SLOTS, rebuilt


@pytest.mark.slow  # 20 s of make test's 15 min
def test_unpersisted_model_is_rebuilt_once_per_worker(spark, build_log):
    """After unpersist(), 3 actions x 20 partitions rebuild the model exactly once per
    worker (not once per task), predict right, and the old model leaves the caches."""
    model = models.mlp(n_features=4, hidden=8, outputs=1)
    x = np.random.default_rng(7).standard_normal((200, 4)).astype("float32")
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(200)], "id long, f array<float>") \
        .repartition(20).cache()
    df.count()
    expected = np.asarray(model(x)).reshape(-1)
    bm = sk.BroadcastModel(spark, model)

    def check_scores():
        out = bm.transform(df, "f").toPandas().sort_values("id")
        assert out["id"].tolist() == list(range(200))
        np.testing.assert_allclose(out["prediction"], expected, atol=1e-5)

    check_scores()
    old_key = bm.key
    assert builds_by_worker(build_log, old_key)
    bm.unpersist(blocking=True)
    before = builds_by_worker(build_log, bm.key)  # read after unpersist: it may change
    for _ in range(3):
        check_scores()
    rebuilt = rebuilt_since(build_log, bm.key, before)
    assert rebuilt and set(rebuilt.values()) == {1} and len(rebuilt) <= SLOTS, rebuilt
    infos = worker_cache_infos(spark, bm)
    assert any(bm.key in i["keys"] for i in infos.values()), infos
    if bm.key != old_key:
        assert not any(old_key in i["keys"] for i in infos.values()), infos


def test_flavour_mismatch_is_reported_on_the_executor(spark):
    model = models.mlp(n_features=4)
    bm = sk.BroadcastModel(spark, model)

    def as_tf_keras(header):
        header["keras"].update(flavour="tf_keras", version="2.21.0")

    edited = rewrite_header(sk.dumps(model), as_tf_keras)
    bm._transport, bm._nbytes = BroadcastTransport(spark.sparkContext, edited), len(edited)
    bm._model = None  # behave like a handle whose driver copy is gone: build from the payload
    df = spark.createDataFrame([(1, [1.0] * 4)], "id long, f array<float>")
    with pytest.raises(Exception, match=r"tf_keras.*2\.21\.0.*keras3.*3\.\d+.*TF_USE_LEGACY_KERAS"):
        df.rdd.mapPartitions(lambda rows: [bm.value.name for _ in rows]).collect()


def in_sql_workers(spark, fn) -> dict[int, list]:
    """``fn()`` run by 16 tasks of the SQL worker pool: its results by worker pid."""
    def task(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([os.getpid()]), pa.array([json.dumps(fn())])],
                                         names=["pid", "result"])

    found: dict[int, list] = {}
    for row in spark.range(16, numPartitions=16).mapInArrow(task, "pid long, result string").collect():
        found.setdefault(row.pid, []).append(json.loads(row.result))
    return found


def worker_memory_mb(spark, handle) -> dict[int, float]:
    """Memory each SQL-pool worker holds at rest, in MB: PSS of every mapping but shared
    libraries (their PSS moves with whatever else maps them on this machine), after
    shipping ``handle`` (workers then drop released models), a garbage collection and
    ``malloc_trim``. The weights count wherever they live: heap or a mapped payload file."""
    def measure():
        import ctypes
        import gc
        import re

        handle.release_stale()  # workers drop released models
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        kb, library = 0, False
        with open("/proc/self/smaps") as f:
            for line in f:
                if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                    library = re.search(r"\.so(\.[0-9]+)*$", line.rstrip()) is not None
                elif line.startswith("Pss:") and not library:
                    kb += int(line.split()[1])
        return kb / 1024

    return {pid: min(mb) for pid, mb in in_sql_workers(spark, measure).items()}


@pytest.mark.slow  # 9 s of make test's 15 min
def test_destroy_cycles_do_not_grow_worker_memory(spark, build_log):
    """With a cache large enough to keep every model (so eviction cannot hide a leak),
    6 cycles of build, score, destroy() on a 21 MB model grow the workers' memory by less
    than one model, and no destroyed model stays in a worker's cache."""
    def set_limit():
        sk.configure_cache(max_entries=100)
        return sk.cache_info()["max_entries"]

    def reset_limit():
        sk.configure_cache(max_entries=CACHE_LIMIT)
        return 0

    keeper = sk.BroadcastModel(spark, models.mlp(n_features=2))  # live, shipped after destroys
    x = np.random.default_rng(9).standard_normal((64, 64)).astype("float32")
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(64)], "id long, f array<float>") \
        .repartition(4).cache()
    df.count()
    keys: list[str] = []

    def cycle() -> int:
        model = models.mlp(n_features=64, hidden=80_000, outputs=4)  # 5.4M weights
        bm = sk.BroadcastModel(spark, model)
        out = bm.transform(df, "f").toPandas().sort_values("id")
        np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-4)
        keys.append(bm.key)
        bm.destroy()
        return bm.nbytes

    configured = in_sql_workers(spark, set_limit)
    try:
        assert all(v == [100] * len(v) for v in configured.values()), configured
        for _ in range(3):  # warm-up: TensorFlow, tracing, allocator high-water marks
            cycle()
        before = worker_memory_mb(spark, keeper)
        nbytes = max(cycle() for _ in range(6))
        after = worker_memory_mb(spark, keeper)
        infos = worker_cache_infos(spark, keeper)
    finally:
        in_sql_workers(spark, reset_limit)
    assert nbytes > 20 * 2**20
    builders = {pid for key in keys for _, pid in builds_by_worker(build_log, key)}
    # every model was built under the large limit, in workers measured before and after
    measured = set(configured) & set(before) & set(after)
    assert builders and builders <= measured, (builders, configured, before, after)
    growth = sum(after[pid] - before[pid] for pid in builders)
    assert growth < nbytes / 2**20, (growth, before, after)
    assert builders <= set(infos), infos
    for info in infos.values():
        assert not set(keys) & set(info["keys"]), info


KILLED_EXECUTOR = """
import os, signal, time
import numpy as np
import spark_keras as sk
from spark_keras.payload import host_file
from spark_keras.executor.transport import executor_file
from tests import models
from tests.conftest import make_spark

# one worker, two executors: block manager folders side by side, as for any executors
# of one application on one host
spark = make_spark("local-cluster[1,2,1024]", %(log)r, **{"spark.executor.memory": "512m",
                                                          "spark.executor.cores": "1"})
sc = spark.sparkContext
model = models.mlp(n_features=4)
bm = sk.BroadcastModel(spark, model)
x = np.ones((1, 4), "float32")
want = float(np.asarray(model(x)).item())


def land(_):
    got = float(np.asarray(bm.value(x)).item())  # builds on the executor's file
    yield executor_file.executor_folder(), executor_file._executor_pid(), got


def landed(until, timeout=300):
    found, deadline = {}, time.monotonic() + timeout
    while not until(found):
        assert time.monotonic() < deadline, found
        for folder, pid, got in sc.parallelize(range(8), 8).mapPartitions(land).collect():
            assert abs(got - want) < 1e-6, (got, want)
            found[folder] = pid
    return found


first = landed(lambda found: len(found) == 2)  # both executors ran tasks
paths = {folder: host_file.path_for(folder, bm.key) for folder in first}
assert all(map(os.path.exists, paths.values())), paths  # neither removed the other's
assert len({os.path.dirname(os.path.dirname(f)) for f in first}) == 1, first
dead, live = sorted(first)
assert os.path.basename(os.readlink(f"/proc/{first[dead]}/exe")).startswith("java")
os.kill(first[dead], signal.SIGKILL)
time.sleep(5)
assert os.path.exists(paths[dead])  # Spark leaves it: the application has not ended
landed(lambda found: set(found) - set(first))  # the replacement executor lands the model
assert not os.path.exists(paths[dead]) and not os.path.exists(dead), os.listdir(dead)
assert os.path.exists(paths[live])
spark.stop()
print("RECLAIMED")
"""


@pytest.mark.slow  # a local-cluster driver of its own, an executor killed and replaced
@pytest.mark.timeout(1500)  # 2-3 min alone; 11 min on a machine loaded 10x
def test_a_killed_executors_payload_file_goes_when_its_replacement_lands_the_model(tmp_path):
    """Two executors on one host each land the model beside the other's file, neither
    removing it; one executor JVM is SIGKILLed: Spark keeps its folder until the
    application ends, but the executor replacing it removes the dead one's payload file
    when it lands the same model, and leaves the live executor's alone."""
    log = tmp_path / "log"
    log.mkdir()
    run_script(tmp_path, KILLED_EXECUTOR % {"log": str(log)}, "RECLAIMED", timeout=1400)
