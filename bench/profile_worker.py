"""Where a Python worker's time goes while it scores: ``python -m bench.profile_worker``.

Runs the scoring bench's MLP (200,000 rows of ``array<float>``, 10,000-row Arrow batches)
and CNN on local[2] through ``BroadcastModel.transform`` and ``predict_udf``, samples every
Python worker with py-spy (``py-spy record --idle --nonblocking --format raw``: Python
stacks, native time charged to the Python frame that called it) during one timed
run after a warm-up (the workers idle while py-spy attaches), and sorts the samples into
stages by the frames on their stacks:

* ``JVM -> Python read``: PySpark's serializers reading the Arrow stream (including the
  wait for the JVM's next batch);
* ``column walk and checks``: spark_keras's readers (``inference/walk.py``, ``columns.py``,
  ``images.py``, ``engine.py``);
* ``model call``: the compiled model (``inference/predictor.py`` and TensorFlow below it);
* ``output build``: ``inference/outputs.py``;
* ``spark_keras glue``: ``spark/scoring.py`` (Arrow columns in, the result batch out),
  the handle and the cache;
* ``pandas <-> Arrow``: PySpark's pandas conversions (``predict_udf``);
* ``Python -> JVM write``: PySpark's serializers writing the results back;
* ``gc after each task``: the full garbage collection PySpark's daemon runs when a reused
  worker ends a task (``gc.collect()`` in ``pyspark/daemon.py``; told from the daemon's
  wait for the next task by its line);
* ``other``: everything else; ``idle between tasks`` is left out of the table.

Each stage is shown in milliseconds per 10,000-row batch (samples x sampling interval,
summed over the workers, divided by the batches scored), so the rows add up to the
workers' busy time. py-spy must be installed (``pip install py-spy``; ``--py-spy PATH``
points at another binary); the ptrace it needs works as root or with
``kernel.yama.ptrace_scope=0``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

from bench import scoring_bench as sb
from bench.frames import input_columns, make_frame, workloads
from bench.harness import timed_run, warm_up, worker_pids
from bench.report import table
from bench.sessions import scoring_session

# (stage, markers): a sample belongs to the stage of the first frame, read from the leaf
# up, that contains one of its markers (py-spy frames read "function (path:line)").
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("model call", ("inference/predictor.py", "inference/shaped_calls.py", "spark_keras/flavour.py",
                    "tensorflow/", "keras/")),
    ("output build", ("inference/outputs.py",)),
    ("column walk and checks", ("inference/walk.py", "inference/columns.py", "inference/images.py",
                                "inference/engine.py")),
    ("spark_keras glue", ("spark_keras/spark/scoring.py", "spark_keras/spark/udf.py",
                          "spark_keras/spark/transform.py", "spark_keras/spark/map_partitions.py",
                          "spark_keras/handle.py", "spark_keras/cache.py")),
    ("pandas <-> Arrow", ("arrow_to_pandas", "_create_batch", "_create_array", "pandas/")),
    ("Python -> JVM write", ("dump_stream",)),
    ("JVM -> Python read", ("load_stream",)),
]
GC_AFTER_TASK = "gc after each task"
IDLE = "idle between tasks"
OTHER = "other"
BATCH_ROWS = 10_000
ATTACH_SECONDS = 2.0  # for py-spy to attach to every worker before the timed run
# a worker between tasks: waiting for its next task, or not yet given one
_IDLE_MARKERS = ("get_init_message", "manager (daemon.py")


@functools.cache
def _daemon_gc_frame() -> str:
    """py-spy's frame for the ``gc.collect()`` PySpark's daemon runs after each task of
    a reused worker (``manager (daemon.py:<line>)``)."""
    import inspect

    import pyspark.daemon

    lines = inspect.getsource(pyspark.daemon).splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.strip() == "gc.collect()")
    return f"manager (daemon.py:{line})"


def stage_of(stack: str) -> str:
    """The stage of one collapsed stack (``frame;frame;...``, root first)."""
    frames = stack.split(";")
    python = [frame for frame in frames if ".py:" in frame]
    if python and python[-1] == _daemon_gc_frame():
        return GC_AFTER_TASK
    if not python or any(marker in python[-1] for marker in _IDLE_MARKERS) \
            or any("get_init_message" in frame for frame in python):
        return IDLE
    for frame in reversed(frames):
        for stage, markers in STAGES:
            if any(marker in frame for marker in markers):
                return stage
    return OTHER


def read_raw(path: str) -> collections.Counter:
    """Samples per stage from py-spy's raw (collapsed) output."""
    counts: collections.Counter = collections.Counter()
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if stack and n.isdigit():
                counts[stage_of(stack)] += int(n)
    return counts


def profile_run(frame_fn: Callable, df, py_spy: str, rate: int, folder: str) -> tuple[collections.Counter, float]:
    """Samples per stage over all workers during one run of ``frame_fn(df)``, and its seconds."""
    pids = worker_pids(workers_only=True)
    procs, outs = [], []
    for pid in pids:
        out = os.path.join(folder, f"{pid}.txt")
        outs.append(out)
        procs.append(subprocess.Popen([py_spy, "record", "--idle", "--nonblocking", "--rate", str(rate),
                                       "--format", "raw", "-o", out, "--pid", str(pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        time.sleep(ATTACH_SECONDS)  # the recorders attach; every sample then is of this run
        seconds, _ = timed_run(frame_fn, df)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.wait(timeout=60)
    counts: collections.Counter = collections.Counter()
    for out in outs:
        if os.path.exists(out):
            counts += read_raw(out)
    return counts, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    parser.add_argument("--rate", type=int, default=250, help="samples per second per worker")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    spark = scoring_session()
    spark.sparkContext.setLogLevel("ERROR")
    import spark_keras

    workers = spark.sparkContext.parallelize(range(2), 2).map(
        lambda _: __import__("spark_keras").__file__).collect()
    print(f"spark_keras imported from {spark_keras.__file__} (driver), {sorted(set(workers))} (workers)")
    rows = []
    try:
        for workload in workloads(args.quick):
            model = workload.build()
            df = make_frame(spark, workload, "array", partitions=2 if args.quick else 8)
            cols = input_columns(workload, "array")
            batches = max(1, -(-workload.rows // BATCH_ROWS))
            for method in ("BroadcastModel.transform", "BroadcastModel.predict_udf"):
                frame_fn = sb.METHODS[method](spark, model, workload, "array", cols)
                warm_up(frame_fn, df)
                with tempfile.TemporaryDirectory() as folder:
                    counts, seconds = profile_run(frame_fn, df, args.py_spy, args.rate, folder)
                busy = sum(n for stage, n in counts.items() if stage != IDLE) or 1
                ms = {stage: counts[stage] * 1000 / args.rate / batches
                      for stage in [s for s, _ in STAGES] + [GC_AFTER_TASK, OTHER]}
                rows.append({"workload": workload.name, "method": method.split(".")[-1],
                             "rows/s": workload.rows / seconds,
                             **{f"{stage} ms": value for stage, value in ms.items()},
                             "busy ms": busy * 1000 / args.rate / batches,
                             "model share %": 100 * counts["model call"] / busy})
            df.unpersist()
    finally:
        spark.stop()
    print(f"\nms per {BATCH_ROWS:,}-row Arrow batch, summed over the workers (py-spy, {args.rate} Hz)\n")
    print(table(rows, floatfmt="{:,.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
