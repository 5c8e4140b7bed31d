"""A model larger than the JVM heaps, shipped and scored on local Spark.

Each run is a fresh process (a fresh driver JVM: ``spark.driver.memory`` is read when the
JVM starts), run as ``python -m bench.large_bench --gib G --ship S ...`` and printing one
JSON line: ship seconds (``BroadcastModel(...)``), seconds to the first prediction (the
first ``transform(...).collect()``, which lands the payload on every executor and builds
the model in a worker of each), whether the predictions are exactly the driver's, and
the peak memory of every process of the application, sampled every 50 ms from ``/proc``:
the driver's Python and JVM, each executor JVM, each Python worker (its peak resident
set, and its private memory, ``RssAnon``, at its peak and at the end). :func:`run`
launches the runs and makes the table (``python -m bench --only large``).

The model: ``Input((4096,))``, tanh ``Dense(4096)`` layers up to the size asked for
(64 MiB each), then ``Dense(8)``. The rows: 2 partitions of 16 rows, so each of the two
executors of ``local-cluster[2,1,1024]`` scores one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

from bench import socket_bytes
from bench.sampler import Sampler

WIDTH = 4096
LAYER_BYTES = WIDTH * WIDTH * 4
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_of(gib: float) -> Any:
    import keras

    layers = max(1, round(gib * 2**30 / LAYER_BYTES))
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((WIDTH,)),
                             *[keras.layers.Dense(WIDTH, activation="tanh") for _ in range(layers)],
                             keras.layers.Dense(8)])


class Peaks(Sampler):
    """Every process under this one, sampled from ``/proc`` until :meth:`stop`."""

    def __init__(self, interval: float = 0.05) -> None:
        self.seen: dict[int, dict[str, Any]] = {}
        super().__init__(interval)

    def sample(self) -> None:
        for pid, (role, parent) in _tree(os.getpid()).items():
            status = _status(pid)
            if status is None:
                continue
            entry = self.seen.setdefault(pid, {"rss": 0, "anon": 0})
            entry["role"], entry["ppid"] = role, parent  # (a launcher script may exec the JVM)
            entry["rss"] = max(entry["rss"], status.get("VmRSS", 0))
            entry["anon"] = max(entry["anon"], status.get("RssAnon", 0))
            entry["anon_now"] = status.get("RssAnon", 0)
            entry["anon_since_mark"] = max(entry.get("anon_since_mark", 0), entry["anon_now"])

    def mark(self) -> dict[int, int]:
        """Every process's private memory now (KiB), by pid; each one's peak from now
        on is its ``anon_since_mark``."""
        for e in self.seen.values():
            e["anon_since_mark"] = e.get("anon_now", 0)
        return {pid: e.get("anon_now", 0) for pid, e in self.seen.items()}

    def stop(self) -> list[dict[str, Any]]:
        self.halt()
        return [dict(e, pid=pid) for pid, e in sorted(self.seen.items())]


def _status(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            out[key] = int(value.split()[0])  # KiB
    return out


def _tree(root: int) -> dict[int, tuple[str, int]]:
    """The processes under ``root`` (and itself), each with its role and its parent."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                commands[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
    roles = {root: "driver Python"}
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if pid in roles or parent not in roles:
                continue
            command = commands.get(pid, "")
            if "org.apache.spark.launcher.Main" in command:
                roles[pid] = "launcher"  # spark-class's own short-lived JVM
            elif "CoarseGrainedExecutorBackend" in command:
                roles[pid] = "executor JVM"
            elif "java" in command.split(" ")[0]:
                roles[pid] = "driver JVM"
            elif roles[parent] in ("Python daemon", "Python worker"):
                roles[pid] = "Python worker"
            elif "daemon" in command:
                roles[pid] = "Python daemon"
            else:
                roles[pid] = "other"
            changed = True
    return {pid: (role, parents.get(pid, 0)) for pid, role in roles.items()}


def one(args: argparse.Namespace) -> dict[str, Any]:
    """One run, in this process."""
    import numpy as np
    import tensorflow as tf

    # the workers' threads (one per task CPU): the driver's reference predictions are
    # then bit-comparable with theirs (TensorFlow's sums depend on the thread count)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    peaks = Peaks()
    from pyspark.sql import SparkSession

    import spark_keras as sk
    from spark_keras.cache import read_build_log
    from spark_keras.executor.driver_payload import weights_nbytes
    from spark_keras.executor.transport import chunked
    from spark_keras.inference.predictor import predictor_for

    builder = (SparkSession.builder.master(args.master).appName("spark-keras-large")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.memory", args.driver_memory)
               .config("spark.executor.memoryOverhead", "6g")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", REPO)
               .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
               .config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", os.path.join(args.tmp, "builds")))
    if args.executor_memory:
        builder = builder.config("spark.executor.memory", args.executor_memory)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    model = model_of(args.gib)
    source: Any = model
    if args.uri:
        path = os.path.join(args.tmp, "model.skp")
        sk.save(model, path)
        source = "file://" + path
    result: dict[str, Any] = {"ship": args.ship, "uri": args.uri, "gib": args.gib,
                              "driver_heap_mib": heap / 2**20,
                              "weights_gib": weights_nbytes(model) / 2**30}
    from pyspark.sql import functions as F

    rng = np.random.default_rng(1)
    rows = rng.standard_normal((32, WIDTH)).astype("float32")
    df = spark.createDataFrame([(i, rows[i].tolist()) for i in range(len(rows))],
                               "id long, features array<float>").repartition(args.partitions, "id")
    df = df.withColumn("part", F.spark_partition_id()).cache()
    _wait_for_executors(spark, args.master)
    df.mapInArrow(_warm, "n long").collect()  # the scoring workers started, Keras imported
    before = peaks.mark()
    sockets = socket_bytes.SocketBytes() if args.count_bytes else None
    start, started = time.perf_counter(), time.time()
    try:
        bm = sk.BroadcastModel(spark, source, ship=args.ship)
        result["ship_s"] = time.perf_counter() - start
        me = peaks.seen.get(os.getpid(), {})
        result["driver_python_ship_peak_mib"] = me.get("anon_since_mark", 0) / 1024
        result["transport"] = type(bm._transport).__name__
        result["payload_bytes"] = bm._nbytes  # chunks: written on each executor at ship time
        result["chunks"] = -(-bm._nbytes // chunked.CHUNK_BYTES) if bm._chunked else 0
        result["shares"] = -(-bm._nbytes // chunked.SHARE_BYTES) if bm._chunked else 0
        got = bm.transform(df, "features").select("part", "id", "prediction").collect()
        result["first_prediction_s"] = time.perf_counter() - start
        # each worker's build of it (pid, seconds from the ship's start to the build's end)
        result["builds"] = [{"pid": r["pid"], "s": r["time"] - started} for r in
                            read_build_log(os.path.join(args.tmp, "builds")) if r["key"] == bm.key]
        # exact: each partition's rows called as one batch on the driver, as the worker did
        predictor, diffs = predictor_for(model), []
        for part in sorted({r["part"] for r in got}):
            mine = [r for r in got if r["part"] == part]
            expected = predictor([rows[[r["id"] for r in mine]]])[0]
            found = np.asarray([r["prediction"] for r in mine], dtype="float32")
            diffs.append(float(np.max(np.abs(found - expected))))
        result["max_abs_diff"] = max(diffs)
        result["exact"] = max(diffs) == 0.0
        result["rows"] = len(got)
    except Exception as exc:  # the broadcast of today's path, out of heap
        text = str(exc)
        causes = [line.strip() for line in text.splitlines()
                  if "OutOfMemoryError" in line or "heap space" in line.lower()]
        result["error"] = f"{type(exc).__name__}: {(causes or text.splitlines() or [''])[0][:200]}"
    time.sleep(0.3)
    result["driver_python_before_mib"] = before.get(os.getpid(), 0) / 1024
    result["processes"] = peaks.stop()
    if sockets is not None:
        sockets.stop()
        result["driver_sent_bytes"] = socket_bytes.driver_sent(sockets, result["processes"])
    spark.stop()
    return result


def _wait_for_executors(spark: Any, master: str, timeout: float = 120) -> None:
    """Until every executor of a ``local-cluster[N,...]`` master has registered."""
    found = re.match(r"local-cluster\[(\d+),", master)
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
    deadline = time.monotonic() + timeout
    while found and status().size() < int(found.group(1)) + 1 and time.monotonic() < deadline:
        time.sleep(0.2)


def _warm(batches: Any) -> Any:
    """In a scoring worker: Keras and spark_keras imported before the clock starts (no
    TensorFlow op: the first task that scores sizes TensorFlow's thread pools)."""
    import keras  # noqa: F401
    import pyarrow as pa

    import spark_keras  # noqa: F401

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"n": pa.array([], pa.int64())})


def launch(gib: float, ship: str, *, master: str, driver_memory: str = "1g",
           executor_memory: str | None = None, uri: bool = False, partitions: int = 2,
           count_bytes: bool = False, timeout: float = 900) -> dict[str, Any]:
    """One run in a fresh process; its result."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="spark_keras_large_") as tmp:
        command = [sys.executable, "-m", "bench.large_bench", "--gib", str(gib), "--ship", ship,
                   "--master", master, "--driver-memory", driver_memory, "--tmp", tmp]
        if executor_memory:
            command += ["--executor-memory", executor_memory]
        if uri:
            command.append("--uri")
        if count_bytes:
            command.append("--count-bytes")
        command += ["--partitions", str(partitions)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ship": ship, "gib": gib, "error": f"exit {done.returncode}: "
                f"{(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}"}
    return json.loads(lines[-1])


def summary(result: dict[str, Any], label: str) -> dict[str, Any]:
    """One table row of a run."""
    def peak(role: str, key: str = "rss") -> str:
        values = [p[key] / 2**20 for p in result.get("processes", []) if p["role"] == role
                  and (role != "Python worker" or p[key] > 200 * 1024)]  # (workers that scored)
        return " / ".join(f"{v:.2f}" for v in values) if values else "-"

    workers = [p for p in result.get("processes", []) if p["role"] == "Python worker"
               and p["anon"] > 200 * 1024]
    build = [(p["anon"] - p.get("anon_now", p["anon"])) / 2**20 for p in workers]
    grew = result.get("driver_python_ship_peak_mib", 0) - result.get("driver_python_before_mib", 0)
    return {"path": label, "driver heap GiB": round(result.get("driver_heap_mib", 0) / 1024, 2),
            "weights GiB": round(result.get("weights_gib", 0), 2),
            "ship s": result.get("ship_s"), "first prediction s": result.get("first_prediction_s"),
            "exact": result.get("exact", False),
            "driver Python GiB": peak("driver Python"),
            "driver Python growth while shipping GiB": round(grew / 1024, 2) if "ship_s" in result else None,
            "driver JVM GiB": peak("driver JVM"),
            "executor JVMs GiB": peak("executor JVM"),
            "workers GiB (peak RSS)": peak("Python worker"),
            "workers private at build above steady GiB": " / ".join(f"{b:.2f}" for b in build) or "-",
            "worst worker build overhead x weights": (max(build) / result["weights_gib"])
            if build and result.get("weights_gib") else None,
            "error": result.get("error", "")}


PLAN = [("ship='auto' (chunk broadcasts)", "auto", "1g", False),
        ("ship='driver' (the driver's file)", "driver", "1g", False),
        ("file:// URI", "auto", "1g", True),
        ("ship='broadcast' (today's path)", "broadcast", "1g", False),
        ("ship='broadcast', 5g driver heap", "broadcast", "5g", False)]


def run(quick: bool = False) -> list[dict[str, Any]]:
    gib = 0.6 if quick else 2.1
    master = "local[2]" if quick else "local-cluster[2,1,1024]"
    driver = "512m" if quick else None
    rows = []
    for label, ship, heap, uri in PLAN[:2] if quick else PLAN:
        result = launch(gib, ship, master=master, driver_memory=driver or heap, uri=uri)
        rows.append(summary(result, label))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, required=True)
    parser.add_argument("--ship", default="auto")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--executor-memory")
    parser.add_argument("--uri", action="store_true")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--count-bytes", action="store_true")  # the driver's (transfer_bench)
    parser.add_argument("--tmp", default="/tmp")
    print(json.dumps(one(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
