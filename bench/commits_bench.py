"""`python -m bench.commits_bench [--quick]`: what ``--resume`` (commits) and
``--progress`` cost a clean score job. The job's Python entry point
(:func:`spark_keras.jobs.score.run.score`, what ``spark-keras score`` runs) in one local[2]
session (and one on :data:`CLUSTER`: more task slots than a group's tasks), on one parquet
input of :data:`FILES` files of :data:`ROWS_PER_FILE` rows of :data:`FEATURES` float features,
a small MLP (:func:`bench.models.small_mlp_model`):

- plain: no ``--resume``, ``--no-progress`` (the job as it was: one write, one rename);
- ``--resume`` with the default settings: a commit per file here (about ten groups per
  group in flight, :mod:`spark_keras.jobs.score.parallel`), groups scored at once, each
  written, recorded in the commit log and published;
- ``--resume``: commits of :data:`FILES_PER_COMMIT` files each (``--commit-bytes``);
- ``--resume --progress``: the default settings with the progress lines
  (``--progress-seconds`` :data:`PROGRESS_SECONDS`, so a short run has its periodic lines
  too), logged to a buffer as the job logs them to stderr.

Each run writes a fresh output folder (removed after); its wall time is the
:func:`score` call's (reading the input's metadata, planning, loading and shipping the
model, scoring, writing, publishing). A warm-up run of each mode first, then the modes
alternated in :data:`ROUNDS` rounds ("plain again": the plain job a second time in each
round, the spread of identical work): the median rows/s of each mode, and the median over
the rounds of each run against the same round's plain run. Each run's figures checked:
every row scored, none skipped, the commits made.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FILES = 8
ROWS_PER_FILE = 25_000
FEATURES = 16
FILES_PER_COMMIT = 2  # 4 commits of the 8 files (the default makes 8)
PROGRESS_SECONDS = 1.0
ROUNDS = 5
PLAIN, PLAIN_AGAIN, RESUME, PROGRESS = ("plain (no --resume, --no-progress)", "plain again",
                                        "--resume (commits)", "--resume --progress")
DEFAULT = "--resume, default settings"  # a commit per file of this input
MODES = (PLAIN, PLAIN_AGAIN, DEFAULT, RESUME, PROGRESS)
LOCAL, CLUSTER = "local[2]", "local-cluster[2,2,1024]"  # 2 slots; 2 executors of 2 slots


def write_input(folder: str, files: int, rows: int, features: int = FEATURES) -> None:
    """``files`` parquet files of ``rows`` rows each: ``id`` (0, 1, ... across the files)
    and ``features``, an array of float32 values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder)
    for i in range(files):
        x = np.random.default_rng(i).standard_normal((rows, features)).astype("float32")
        pq.write_table(pa.table({
            "id": pa.array(np.arange(i * rows, (i + 1) * rows), pa.int64()),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), features)
            .cast(pa.list_(pa.float32()))}), os.path.join(folder, f"part-{i:03d}.parquet"))


def _args(work: str, mode: str, out: str) -> argparse.Namespace:
    from spark_keras.jobs.score.main import parse_args

    argv = ["--model", os.path.join(work, "model.skp"), "--input", os.path.join(work, "input"),
            "--output", out, "--features", "features", "--no-progress"]
    if mode == RESUME:
        one_file = os.path.getsize(os.path.join(work, "input", "part-000.parquet"))
        argv += ["--resume", "--commit-bytes", str(FILES_PER_COMMIT * one_file + 1024)]
    if mode in (DEFAULT, PROGRESS):
        argv += ["--resume"]
    if mode == PROGRESS:
        argv += ["--progress", "--progress-seconds", str(PROGRESS_SECONDS)]
    return parse_args(argv)


def _commits(mode: str, files: int) -> int:
    """The commits a run in ``mode`` makes of ``files`` input files."""
    return -(-files // FILES_PER_COMMIT) if mode == RESUME else \
        files if mode in (DEFAULT, PROGRESS) else 1


def _run(spark, work: str, mode: str, total: int, files: int) -> tuple[float, int]:
    """Seconds of one job run in ``mode`` and the progress lines it logged (figures checked)."""
    from spark_keras.jobs.score.files import HadoopPaths
    from spark_keras.jobs.score.run import score

    out = os.path.join(work, f"out-{time.monotonic_ns()}")
    args = _args(work, mode, out)
    job_logger = logging.getLogger("spark_keras.jobs.score")
    level = job_logger.level
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)  # as the job's stderr lines: formatted, written
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    if args.progress:  # as the job's main() does with --progress
        job_logger.setLevel(logging.INFO)
        job_logger.addHandler(handler)
    try:
        started = time.perf_counter()
        summary = score(spark, HadoopPaths(spark), args)
        seconds = time.perf_counter() - started
    finally:
        job_logger.removeHandler(handler)
        job_logger.setLevel(level)
        shutil.rmtree(out, ignore_errors=True)
    assert summary["rows"] == total and summary["invalid_rows"] == 0, summary
    if args.resume:
        assert summary["rows_skipped"] == 0, summary
        assert summary["groups"] == _commits(mode, files), summary
    logged = lines.getvalue().count("\n")
    assert (logged > 0) == bool(args.progress), (mode, logged)
    return seconds, logged


def _wait_for_slots(spark, master: str, timeout: float = 180) -> None:
    """Until every executor of a ``local-cluster[N,C,...]`` master has registered (its
    task slots are what sizes the groups in flight)."""
    import re

    found = re.match(r"local-cluster\[(\d+),\s*(\d+),", master)
    deadline = time.monotonic() + timeout
    while found and spark.sparkContext.defaultParallelism < int(found[1]) * int(found[2]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{master}: the executors did not register in {timeout:g} s")
        time.sleep(0.2)


def run(quick: bool = False, repeats: int = ROUNDS, master: str = LOCAL) -> list[dict]:
    """One row per mode: rows/s (median of the rounds) and the ratio to the plain job."""
    import spark_keras as sk
    from bench.models import small_mlp_model
    from bench.sessions import local_session

    files, rows = (4, 500) if quick else (FILES, ROWS_PER_FILE)
    rounds = 1 if quick else repeats
    total = files * rows
    work = tempfile.mkdtemp(prefix="commits-bench-")
    spark = local_session("commits-bench", driver_memory="4g", master=master)
    try:
        _wait_for_slots(spark, master)
        write_input(os.path.join(work, "input"), files, rows)
        sk.save(small_mlp_model(FEATURES), os.path.join(work, "model.skp"))
        for mode in MODES:  # warm-up: workers started, Keras imported, model built
            _run(spark, work, mode, total, files)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        logged: dict[str, list[int]] = {mode: [] for mode in MODES}
        for _ in range(rounds):  # alternated: drifts of a shared machine hit every mode
            for mode in MODES:
                seconds, lines = _run(spark, work, mode, total, files)
                times[mode].append(seconds)
                logged[mode].append(lines)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return [{"master": master, "job": mode, "commits": _commits(mode, files),
             "rows": total, "rounds": rounds, "median s": statistics.median(times[mode]),
             "rows/s": total / statistics.median(times[mode]),
             "x plain, median of rounds": statistics.median(
                 p / t for p, t in zip(times[PLAIN], times[mode])),
             "progress lines": statistics.median(logged[mode])}
            for mode in MODES]


def main(argv: list[str] | None = None) -> int:
    from bench.report import section_main

    return section_main("python -m bench.commits_bench", "score job: plain vs --resume vs "
                        "--resume --progress", run, "{:,.3f}", argv)


if __name__ == "__main__":
    sys.exit(main())
