"""What a fresh Python worker pays to rebuild a BroadcastModel in a slow-trigger stream.

    .venv/bin/python -m bench.stream_rebuild [--reps 6] [--slow-trigger 75 [--batches 3]]

A standalone measurement (not part of ``python -m bench``). Spark ends idle Python
workers: the executor's PythonWorkerFactory checks every 10 s and ends them once it has
handed out no worker for 60 s. A streaming query whose trigger interval leaves more than
70 s between micro-batches therefore runs every micro-batch in fresh workers, forked from
the executor's daemon, and each rebuilds its model (60-70 s: some micro-batches).

Part 1 (a minute or two): ``local[2]`` with the preloading daemon and
``spark.python.worker.reuse=false``, so every task runs in a freshly forked worker, the
position of a worker that replaced an idle-ended one. For each model, tasks run one at a
time:

* first build on the executor: no payload file yet; the worker reads the broadcast,
  writes the executor's payload file, maps it and rebuilds the model (1 task);
* fresh worker, file present (``--reps`` tasks): it maps the file and rebuilds the Keras
  objects around the mapped weights: nothing is transferred or copied;
* fresh worker without the shared file (``share_weights=False``, ``--reps`` tasks): it
  reads the broadcast and copies the weights, for comparison.

Each task reports the build time (``SPARK_KERAS_BUILD_LOG``'s ``seconds``, the same
``get_or_build`` timing ``cache_info()`` sums), whether the executor's file was there
before it built, the first prediction on the rebuilt model (tracing its ``tf.function``
and calling it) and a second one, and the time from its fork to the task function's
first line (``/proc/self/stat``, 10 ms resolution: PySpark's worker set-up and unpickling
the task; the ``os.fork`` in the daemon is a fraction of it).

Part 2 (``--slow-trigger SECONDS``; 3 batches of 75 s take 3-4 minutes): a real stream,
one input file per micro-batch, worker reuse on (the default), with the MLP and the CNN
chained (two ``transform`` calls, so each micro-batch runs one Python worker per model).
Spark aligns processing-time triggers to multiples of the interval; the query starts
just after one (and after a warm-up job started the daemon), so every micro-batch after
the first follows a full interval without Python tasks. Per micro-batch: the time since
the previous one ended, the pids that built each model and their build seconds (from
the build log), and the micro-batch's duration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

from bench.models import actor_model, big_mlp_model, mlp_model
from bench.sessions import local_session, start_seconds

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")



# --- models --------------------------------------------------------------------------------

# name, builder, input shape, rows per prediction
MODELS = [("MLP", mlp_model, (64,), 64), ("CNN (actor)", actor_model, (120, 160, 2), 8),
          ("MLP 100 MB", big_mlp_model, (64,), 64)]


# --- in the Python workers -----------------------------------------------------------------

def rebuild_task(bm: Any, input_shape: tuple[int, ...], rows: int) -> Callable:
    """A task that builds ``bm``'s model in this (fresh) worker and predicts twice."""

    def task(index: int, _items: Any):
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)  # first: the task starts
        import numpy as np

        from spark_keras.executor.transport.executor_file import executor_folder
        from spark_keras.payload import host_file

        folder = executor_folder()
        present = folder is not None and os.path.exists(host_file.path_for(folder, bm.key))
        x = np.random.default_rng(index).standard_normal((rows, *input_shape), dtype=np.float32)
        t0 = time.perf_counter()
        bm.value  # noqa: B018  (the build)
        t1 = time.perf_counter()
        bm.predictor([x], rows)
        t2 = time.perf_counter()
        bm.predictor([x], rows)
        t3 = time.perf_counter()
        yield {"pid": os.getpid(), "file_present": present,
               "fork_to_task": since_boot - start_seconds(), "build_wall": t1 - t0,
               "first_predict": t2 - t1, "second_predict": t3 - t2}

    return task


# --- on the driver -------------------------------------------------------------------------

def session(build_log: str, reuse: bool):
    return local_session("spark-keras-bench-stream-rebuild", driver_memory="4g", **{
        "spark.python.worker.reuse": str(reuse).lower(),
        "spark.python.daemon.module": "spark_keras.executor.daemon",
        "spark.executorEnv.SPARK_KERAS_BUILD_LOG": build_log})


def build_records(build_log: str, key: str) -> dict[int, list[dict]]:
    from spark_keras.cache import read_build_log

    found: dict[int, list[dict]] = {}
    for r in read_build_log(build_log):
        if r["key"] == key:
            found.setdefault(r["pid"], []).append(r)
    return found


def run_one(spark, bm, shape, rows, build_log: str) -> dict:
    """One task in a fresh worker; its report plus the build log's seconds for it."""
    task = rebuild_task(bm, shape, rows)
    (report,) = spark.sparkContext.parallelize([0], 1).mapPartitionsWithIndex(task).collect()
    records = build_records(build_log, bm.key).get(report["pid"], [])
    if len(records) != 1:
        raise RuntimeError(f"worker {report['pid']} logged {len(records)} builds of {bm.key}")
    report["build"] = records[0]["seconds"]
    report["shared"] = bool(records[0].get("shared"))
    return report


def part1(reps: int) -> list[dict]:
    import spark_keras as sk

    build_log = tempfile.mkdtemp(prefix="stream_rebuild_log_")
    spark = session(build_log, reuse=False)
    rows_out = []
    try:
        spark.sparkContext.parallelize(range(4), 2).map(lambda v: v).collect()  # the daemon
        for name, make, shape, rows in MODELS:
            model = make()
            shared = sk.BroadcastModel(spark, model)
            first = run_one(spark, shared, shape, rows, build_log)
            mapped = [run_one(spark, shared, shape, rows, build_log) for _ in range(reps)]
            copying = sk.BroadcastModel(spark, model, share_weights=False)
            copied = [run_one(spark, copying, shape, rows, build_log) for _ in range(reps)]
            pids = {r["pid"] for r in [first, *mapped, *copied]}
            if len(pids) != 2 * reps + 1:
                raise RuntimeError(f"tasks shared workers ({len(pids)} pids): worker reuse is on?")
            if first["file_present"] or not all(r["file_present"] for r in mapped):
                raise RuntimeError(f"unexpected payload file state: {first}, {mapped}")
            if not (first["shared"] and all(r["shared"] for r in mapped)) or any(r["shared"] for r in copied):
                raise RuntimeError("builds did not share (or copy) weights as asked")
            rows_out.append({"model": name, "weights MB": shared.nbytes / 2**20,
                             "first": first, "mapped": mapped, "copied": copied})
            shared.destroy()
            copying.destroy()
    finally:
        spark.stop()
    return rows_out


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def table1(results: list[dict], reps: int) -> str:
    head = ["model", "weights MB", "first build on the executor (read broadcast, write file, map) s",
            f"fresh worker, file present: map + rebuild s (median of {reps}, min-max)",
            f"fresh worker, no shared file: read broadcast + copy s (median of {reps})",
            "first prediction in the fresh worker (trace + call) s", "second prediction s",
            "fork to task start s (median)",
            "fresh worker total: fork to task + map build + first prediction s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        m = r["mapped"]
        total = med(m, "fork_to_task") + med(m, "build") + med(m, "first_predict")
        cells = [r["model"], f"{r['weights MB']:.1f}", f"{r['first']['build']:.3f}",
                 f"{med(m, 'build'):.3f} ({min(x['build'] for x in m):.3f}-{max(x['build'] for x in m):.3f})",
                 f"{med(r['copied'], 'build'):.3f}", f"{med(m, 'first_predict'):.3f}",
                 f"{med(m, 'second_predict'):.4f}", f"{med(m, 'fork_to_task'):.3f}", f"{total:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- part 2: a real stream with a slow trigger ---------------------------------------------

def write_stream_inputs(folder: str, batches: int, rows: int = 8) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder)
    for i in range(batches):
        rng = np.random.default_rng(i)
        mlp = rng.standard_normal((rows, 64), dtype=np.float32)
        cnn = rng.standard_normal((rows, 120 * 160 * 2), dtype=np.float32)
        table = pa.table({
            "id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
            "x_mlp": pa.FixedSizeListArray.from_arrays(pa.array(mlp.reshape(-1)), 64)
            .cast(pa.list_(pa.float32())),
            "x_cnn": pa.FixedSizeListArray.from_arrays(pa.array(cnn.reshape(-1)), 120 * 160 * 2)
            .cast(pa.list_(pa.float32())),
        })
        aside = os.path.join(os.path.dirname(folder), f".in-{i}.parquet")
        pq.write_table(table, aside)
        os.replace(aside, os.path.join(folder, f"part-{i:05d}.parquet"))


def part2(trigger_seconds: int, batches: int) -> tuple[list[dict], float]:
    import spark_keras as sk

    work = tempfile.mkdtemp(prefix="stream_rebuild_")
    build_log = os.path.join(work, "builds")
    spark = session(build_log, reuse=True)
    started = time.time()
    try:
        write_stream_inputs(os.path.join(work, "in"), batches)
        handles = {"MLP": sk.BroadcastModel(spark, mlp_model()),
                   "CNN (actor)": sk.BroadcastModel(spark, actor_model())}
        stream = (spark.readStream.schema("id long, x_mlp array<float>, x_cnn array<float>")
                  .option("maxFilesPerTrigger", 1).parquet(os.path.join(work, "in")))
        scored = handles["MLP"].transform(stream, "x_mlp", "p_mlp")
        scored = handles["CNN (actor)"].transform(scored, "x_cnn", "p_cnn").select("id", "p_mlp", "p_cnn")
        # start the SQL pool's daemon first, so micro-batch 0 does not pay for it; then
        # start the query just after a multiple of the interval (Spark aligns processing-
        # time triggers to them), so every later micro-batch follows a full interval
        spark.range(2, numPartitions=2).mapInArrow(lambda it: it, "id long").collect()
        time.sleep(trigger_seconds - time.time() % trigger_seconds + 0.5)
        query = (scored.writeStream.format("parquet").option("path", os.path.join(work, "sink"))
                 .option("checkpointLocation", os.path.join(work, "checkpoint"))
                 .trigger(processingTime=f"{trigger_seconds} seconds").start())
        print(f"part 2: a stream of {batches} micro-batches, trigger {trigger_seconds} s "
              f"(about {(batches - 1) * trigger_seconds + 15} s)...", flush=True)
        query.processAllAvailable()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        query.stop()
        rows = spark.read.parquet(os.path.join(work, "sink")).count()
        if rows != 8 * batches:
            raise RuntimeError(f"the sink holds {rows} rows, expected {8 * batches}")
        per_batch = []
        records = {name: [r for rs in build_records(build_log, bm.key).values() for r in rs]
                   for name, bm in handles.items()}
        for p in progress:
            begin = _epoch(p["timestamp"])
            end = begin + p["durationMs"]["triggerExecution"] / 1000 + 1
            row = {"batch": p["batchId"], "begin": begin,
                   "duration_s": p["durationMs"]["triggerExecution"] / 1000, "gap_s": None}
            for name, recs in records.items():
                inside = [r for r in recs if begin - 1 <= r["time"] <= end]
                row[name] = [(r["pid"], r["seconds"]) for r in inside]
            per_batch.append(row)
        for prev, row in zip(per_batch, per_batch[1:]):  # no Python task ran in between
            row["gap_s"] = row["begin"] - prev["begin"] - prev["duration_s"]
    finally:
        spark.stop()
    return per_batch, time.time() - started


def _epoch(timestamp: str) -> float:
    """A progress report's ISO timestamp (``2026-11-30T20:12:14.123Z``) as epoch seconds."""
    import datetime

    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def table2(per_batch: list[dict]) -> str:
    head = ["micro-batch", "idle before it s", "MLP: builds (pid: seconds)", "CNN: builds (pid: seconds)",
            "micro-batch duration s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in per_batch:
        def cell(builds):
            return ", ".join(f"{pid}: {s:.3f}" for pid, s in builds) or "none (cached)"
        gap = "-" if row["gap_s"] is None else f"{row['gap_s']:.0f}"
        lines.append(f"| {row['batch']} | {gap} | {cell(row['MLP'])} | {cell(row['CNN (actor)'])} | "
                     f"{row['duration_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stream_rebuild", description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=6, help="fresh workers per model and mode")
    p.add_argument("--slow-trigger", type=int, default=0, metavar="SECONDS",
                   help="also run a real stream with this processing-time trigger (75 is "
                        "beyond the idle-worker timeout of 60 s plus its 10 s check)")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the raw measurements here")
    args = p.parse_args(argv)

    started = time.time()
    results = part1(args.reps)
    print(f"\nPart 1: a fresh worker's rebuild (local[2], preloading daemon, worker reuse off; "
          f"{time.time() - started:.0f} s)\n")
    print(table1(results, args.reps))
    raw: dict[str, Any] = {"part1": results}
    if args.slow_trigger:
        per_batch, seconds = part2(args.slow_trigger, args.batches)
        print(f"\nPart 2: a real stream, trigger processingTime={args.slow_trigger} s, "
              f"worker reuse on ({seconds:.0f} s)\n")
        print(table2(per_batch))
        raw["part2"] = per_batch
    if args.json:
        with open(args.json, "w") as f:
            json.dump(raw, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
