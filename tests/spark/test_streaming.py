"""Structured Streaming on real local Spark: a file source of parquet files scored by
``BroadcastModel.transform`` / ``predict_udf`` into a parquet sink with a checkpoint.

Every micro-batch reads one input file (``maxFilesPerTrigger=1``), so each file is one
Arrow batch on a worker, and the expected predictions are the driver's predictor on that
same file: outputs must be bit-identical, not merely close."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.inference import predictor_for
from tests import models
from tests.conftest import REPO_ROOT, builds_by_worker

SCHEMA = "id long, features array<float>"
ROWS_PER_FILE = 40
# local[2]: a one-file micro-batch is one task; PySpark now and then replaces a worker
# between jobs (see test_spark_broadcast.MAX_BUILDERS). A build per micro-batch would
# give one builder per batch.
MAX_BUILDERS = 4


class Source:
    """A folder of parquet input files with known ids and features (file ``i`` holds ids
    ``i * rows .. (i + 1) * rows - 1``), and the predictions they must get."""

    def __init__(self, folder, n_features: int = 8, rows: int = ROWS_PER_FILE) -> None:
        self.folder = str(folder)
        self.n_features, self.rows, self.files = n_features, rows, 0
        os.makedirs(self.folder, exist_ok=True)

    def ids(self, i: int) -> np.ndarray:
        return np.arange(i * self.rows, (i + 1) * self.rows, dtype=np.int64)

    def features(self, i: int) -> np.ndarray:
        return np.random.default_rng(1000 + i).standard_normal((self.rows, self.n_features),
                                                               dtype=np.float32)

    def add(self, n: int) -> range:
        """Write the next ``n`` files (each written aside, then renamed in: the source
        never lists a partial file); their indexes."""
        new = range(self.files, self.files + n)
        for i in new:
            flat = pa.array(self.features(i).reshape(-1), pa.float32())
            table = pa.table({"id": self.ids(i),
                              "features": pa.FixedSizeListArray.from_arrays(flat, self.n_features)
                              .cast(pa.list_(pa.float32()))})
            aside = os.path.join(os.path.dirname(self.folder), f".writing-{i}.parquet")
            pq.write_table(table, aside)
            os.replace(aside, os.path.join(self.folder, f"part-{i:05d}.parquet"))
        self.files += n
        return new

    def expected(self, model, files) -> dict[int, np.float32]:
        """id -> prediction of ``model`` on the driver, file by file (a file is one Arrow
        batch on the worker; results can differ in the last bit with the batch)."""
        predict = predictor_for(model)
        out: dict[int, np.float32] = {}
        for i in files:
            y = predict([self.features(i)], 1024)[0].reshape(-1)
            out.update(zip(self.ids(i).tolist(), y))
        return out

    def stream(self, spark):
        return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(self.folder)


def scored(spark, bm, source: Source, how: str):
    stream = source.stream(spark)
    if how == "transform":
        return bm.transform(stream, "features")
    return stream.select("id", bm.predict_udf()("features").alias("prediction"))


def start(spark, bm, source: Source, folder, how: str = "transform", **trigger):
    """A query writing ``bm``'s predictions to ``folder/sink`` (parquet), checkpointed
    in ``folder/checkpoint``; ``availableNow`` unless another trigger is given."""
    return (scored(spark, bm, source, how).writeStream.format("parquet")
            .option("path", os.path.join(folder, "sink"))
            .option("checkpointLocation", os.path.join(folder, "checkpoint"))
            .trigger(**(trigger or {"availableNow": True})).start())


def run(spark, bm, source: Source, folder, how: str = "transform") -> list[dict]:
    """An ``availableNow`` query to its end; its progress reports of batches with rows."""
    query = start(spark, bm, source, folder, how)
    query.awaitTermination(240)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return [p for p in query.recentProgress if p["numInputRows"]]


def assert_sink_holds(spark, folder, expected: dict[int, np.float32]) -> None:
    """The sink, read back by Spark (through its commit log), holds every expected id
    exactly once, with a bit-identical prediction."""
    out = spark.read.parquet(os.path.join(folder, "sink")).select("id", "prediction").toPandas()
    ids = out["id"].to_numpy()
    assert len(ids) == len(set(ids.tolist())), f"{len(ids) - len(set(ids.tolist()))} rows written twice"
    assert set(ids.tolist()) == set(expected), (sorted(set(expected) - set(ids.tolist()))[:10],
                                                sorted(set(ids.tolist()) - set(expected))[:10])
    out = out.sort_values("id")
    got = out["prediction"].to_numpy(dtype=np.float32)
    want = np.array([expected[i] for i in out["id"].tolist()], dtype=np.float32)
    np.testing.assert_array_equal(got, want)


def checkpoint_batches(folder) -> tuple[int, int]:
    """(batches planned, batches committed) in the query's checkpoint."""
    def count(name):
        path = os.path.join(folder, "checkpoint", name)
        return len([f for f in os.listdir(path) if f.isdigit()]) if os.path.isdir(path) else 0

    return count("offsets"), count("commits")


def wait_for(condition, timeout: float = 120, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {condition.__name__}")
        time.sleep(every)


@pytest.fixture(autouse=True)
def no_query_left(spark):
    yield
    for query in spark.streams.active:
        query.stop()


# --- 1. transform and predict_udf on a stream --------------------------------------------

@pytest.mark.parametrize("how", ["transform", "predict_udf"])
def test_stream_writes_every_row_once_bit_identical(spark, build_log, tmp_path, how):
    model = models.mlp(n_features=8, hidden=16, outputs=1)
    source = Source(tmp_path / "in")
    files = source.add(4)
    bm = sk.BroadcastModel(spark, model)
    batches = run(spark, bm, source, str(tmp_path), how)
    assert len(batches) == 4, [(p["batchId"], p["numInputRows"]) for p in batches]
    assert_sink_holds(spark, str(tmp_path), source.expected(model, files))
    builds = builds_by_worker(build_log, bm.key)
    assert builds and all(n == 1 for n in builds.values()), builds


# --- 2. stopped mid-stream, restarted from the checkpoint --------------------------------

def test_stopped_mid_stream_then_restarted_writes_every_row_once(spark, tmp_path):
    """A processing-time query is stopped while a micro-batch is planned but not
    committed, then restarted from its checkpoint twice: with the same BroadcastModel,
    and with a new BroadcastModel of the same model (what a restarted driver does).
    Every input row is in the sink once, with the driver's prediction."""
    folder = str(tmp_path)
    model = models.mlp(n_features=8, hidden=16, outputs=1)
    source = Source(tmp_path / "in")
    source.add(8)
    bm = sk.BroadcastModel(spark, model)

    query = start(spark, bm, source, folder, processingTime="1 second")
    # stop in flight: 3+ batches committed and the next one planned, not committed
    def in_flight():
        planned, committed = checkpoint_batches(folder)
        return committed >= 3 and planned > committed

    wait_for(in_flight)
    query.stop()
    assert query.exception() is None, query.exception()
    planned, committed = checkpoint_batches(folder)
    assert 3 <= committed < 8, (planned, committed)  # files are left for the restarts
    assert planned == committed + 1, "the stop was meant to interrupt a micro-batch"

    source.add(2)
    resumed = run(spark, bm, source, folder)
    # the restart picks up where the checkpoint is: no committed batch is run again
    assert resumed and resumed[0]["batchId"] == committed, (committed, resumed[0]["batchId"])
    assert checkpoint_batches(folder) == (10, 10)

    source.add(2)
    after_driver_restart = sk.BroadcastModel(spark, model)
    resumed = run(spark, after_driver_restart, source, folder)
    assert [p["batchId"] for p in resumed] == [10, 11]
    assert_sink_holds(spark, folder, source.expected(model, range(source.files)))


# --- 3, 4. a long stream: one build per worker, flat worker memory ------------------------

LONG_WARMUP_FILES = 6
# a model kept per micro-batch adds its weights LONG_FILES times, against a bound of once:
# ten batches show it tenfold (thirty showed nothing more, and cost 20 more batches)
LONG_FILES = 10


def worker_memory_kb(pid: int) -> dict[str, int]:
    """``Rss``, ``Pss``, ``Anonymous``... of a live process, from its smaps_rollup (kB).
    RSS counts every page the process maps, its own or shared: a model built again (on a
    new mapping of the payload file, or copied) adds its weights to it."""
    found = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                found[name] = int(rest.split()[0])
    return found


@pytest.fixture(scope="module")
def long_stream(spark, build_log, tmp_path_factory):
    """One query over 16 one-file micro-batches of a 17 MB model, measured at rest after
    6 batches (warm) and at the end; workers found in the build log (builders of the key)."""
    folder = str(tmp_path_factory.mktemp("long-stream"))
    model = models.mlp(n_features=64, hidden=65_536, outputs=1)  # 4.3M weights
    source = Source(os.path.join(folder, "in"), n_features=64, rows=16)
    source.add(LONG_WARMUP_FILES)
    bm = sk.BroadcastModel(spark, model)
    query = start(spark, bm, source, folder, processingTime="0 seconds")
    try:
        query.processAllAvailable()
        workers = [pid for _, pid in builds_by_worker(build_log, bm.key)]
        before = {pid: worker_memory_kb(pid) for pid in workers}
        source.add(LONG_FILES)
        query.processAllAvailable()
        after = {pid: worker_memory_kb(pid) for pid in workers}  # the same processes
        batches = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert_sink_holds(spark, folder, source.expected(model, range(source.files)))
    return {"bm": bm, "batches": batches, "before": before, "after": after}


@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_long_stream_builds_once_per_worker(long_stream, build_log):
    bm = long_stream["bm"]
    assert len(long_stream["batches"]) == LONG_WARMUP_FILES + LONG_FILES
    builds = builds_by_worker(build_log, bm.key)
    assert builds and all(n == 1 for n in builds.values()), builds
    assert len(builds) <= MAX_BUILDERS, builds
    records = [r for r in read_build_log(build_log) if r["key"] == bm.key]
    assert all(r.get("shared") for r in records), records  # built on the executor's file


@pytest.mark.slow  # shares the long stream above
def test_long_stream_does_not_grow_worker_memory(long_stream):
    """10 micro-batches after a 6-batch warm-up add less than one copy of the weights to
    the workers' RSS, summed over the workers that scored. A model kept per micro-batch
    adds its weights 10 times, copied or mapped afresh from the payload file (a worker
    made to keep one extra model per micro-batch grew by about 500 MB over 30 batches
    here; PSS would not see a second mapping of the same file, RSS does)."""
    bm, before, after = long_stream["bm"], long_stream["before"], long_stream["after"]
    assert before, "no worker built the model"
    growth = {pid: (after[pid]["Rss"] - before[pid]["Rss"]) / 1024 for pid in before}
    detail = {pid: {k: (before[pid][k], after[pid][k]) for k in ("Rss", "Pss", "Anonymous")}
              for pid in before}
    weights_mb = bm.nbytes / 2**20
    assert weights_mb > 16
    assert sum(growth.values()) < weights_mb, (growth, weights_mb, detail)


# --- 5. switching a stream to a new model version ----------------------------------------

def executor_state(spark) -> dict[int, dict]:
    """By SQL-pool worker pid: the model keys its cache holds and the payload files in the
    executor's folder. Ships no handle, so it releases nothing itself."""
    import json

    from spark_keras.executor.transport.executor_file import executor_folder

    def report(batches):
        for _ in batches:
            pass
        folder = executor_folder()
        files = sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []
        state = {"keys": sk.cache_info()["keys"], "files": files}
        yield pa.RecordBatch.from_arrays([pa.array([os.getpid()]), pa.array([json.dumps(state)])],
                                         names=["pid", "state"])

    rows = spark.range(8, numPartitions=8).mapInArrow(report, "pid long, state string").collect()
    return {r.pid: json.loads(r.state) for r in rows}


def test_switching_model_version_restarts_from_the_checkpoint(spark, build_log, tmp_path):
    """Stop the query, destroy() the old BroadcastModel, create one for the new model,
    restart from the checkpoint: rows committed before keep v1's predictions, rows after
    get v2's, every row once; workers running the new query drop v1 and its file."""
    folder = str(tmp_path)
    v1 = models.mlp(n_features=8, hidden=16, outputs=1, name="v1")
    v2 = models.mlp(n_features=8, hidden=16, outputs=1, name="v2")
    source = Source(tmp_path / "in")
    before_switch = source.add(3)
    bm1 = sk.BroadcastModel(spark, v1)
    assert len(run(spark, bm1, source, folder)) == 3
    assert any(f.startswith(bm1.key) for s in executor_state(spark).values() for f in s["files"])

    source.add(3)  # arrives while the query is down, or later: scored by v2 either way
    bm1.destroy()  # before the new query's plan is made: its handle carries the release
    bm2 = sk.BroadcastModel(spark, v2)
    assert [p["batchId"] for p in run(spark, bm2, source, folder)] == [3, 4, 5]
    source.add(2)
    assert [p["batchId"] for p in run(spark, bm2, source, folder)] == [6, 7]

    expected = source.expected(v1, before_switch)
    expected.update(source.expected(v2, range(3, source.files)))
    assert_sink_holds(spark, folder, expected)
    assert not np.array_equal(list(source.expected(v1, [3]).values()),
                              list(source.expected(v2, [3]).values()))

    v2_workers = {pid for _, pid in builds_by_worker(build_log, bm2.key)}
    state = executor_state(spark)
    assert v2_workers & set(state), (v2_workers, state)  # we asked some of them
    for pid in v2_workers & set(state):
        assert bm1.key not in state[pid]["keys"], state[pid]
    for s in state.values():
        assert not any(f.startswith(bm1.key) for f in s["files"]), s["files"]


def test_destroying_the_handle_of_a_running_query_fails_it_cleanly(spark, tmp_path):
    """The plan of a running query holds its handle: destroy() fails the next micro-batch
    (its broadcast is gone) before anything is written; a restart from the checkpoint with
    a new BroadcastModel then writes every row once."""
    folder = str(tmp_path)
    model = models.mlp(n_features=8, hidden=16, outputs=1)
    source = Source(tmp_path / "in")
    source.add(5)
    bm = sk.BroadcastModel(spark, model)
    query = start(spark, bm, source, folder, processingTime="1 second")
    wait_for(lambda: checkpoint_batches(folder)[1] >= 2)
    bm.destroy()
    with pytest.raises(Exception, match="after it was destroyed"):
        query.awaitTermination(60)
    assert not query.isActive
    run(spark, sk.BroadcastModel(spark, model), source, folder)
    assert_sink_holds(spark, folder, source.expected(model, range(source.files)))


# --- the example job ------------------------------------------------------------------------

@pytest.mark.slow  # the example job in its own driver
def test_stream_example_job_runs(tmp_path):
    """Without ``--out`` in a temporary folder of its own, which it leaves empty."""
    job_tmp = tmp_path / "tmp"
    job_tmp.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(job_tmp))
    env.pop("SPARK_KERAS_BUILD_LOG", None)
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "jobs", "stream.py"),
                           "--files", "3", "--rows", "200"],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not os.listdir(job_tmp), os.listdir(job_tmp)  # nothing left behind
    summary = [line for line in proc.stdout.splitlines() if line.startswith("STREAMED")]
    assert summary, proc.stdout[-2000:]
    fields = dict(part.split("=", 1) for part in summary[0].split()[1:])
    assert fields["rows"] == "600" and fields["unique_ids"] == "600", summary
    assert fields["batches"] == "3", summary
    assert fields["mismatches"] == "0", summary
