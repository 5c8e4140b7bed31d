"""The commits section's kill: what a SIGKILL of the driver costs a ``--resume`` job with
the default settings. The job as a user runs it (``python jobs/score.py --master
local[2]``, a process each), on a parquet input of :data:`ROWS` rows in :data:`FILES` files
(:data:`FEATURES` float32 features, about 25 MB), with a model of about 2,000 rows/s on
local[2] (:func:`slow_mlp_model`):

1. the plain job (no ``--resume``), timed (its wall time, Spark's start-up included);
2. ``--resume`` with the default settings, its driver SIGKILLed at :data:`KILL_AT` of the
   plain job's time (from its start; and a second job at :data:`KILL_AT` of the plain job's
   scoring time from when its manifest appears: the driver's start-up, Spark's and
   TensorFlow's, left out);
3. the same command again: the rows it scores (``rows``) against the rows committed before
   (``rows_skipped``), and its wall time;
4. an uninterrupted ``--resume`` run: the resumed output must equal it, value for value,
   each row once (read with pyarrow, sorted by id).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

ROWS = 100_000
FILES = 40
FEATURES = 40  # 160 bytes of float32 a row: about 25 MB of parquet (38 MB at 60)
KILL_AT = 0.6  # of the plain job's wall time
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def described() -> str:
    """What the docs say of this table."""
    return (f"A kill: the job as a user runs it (`python jobs/score.py --master local[2]`, a "
            f"process each) on a parquet input of {FEATURES} float32 features a row, with an "
            f"MLP of three 1536-unit layers: the plain job timed (wall time, Spark's start-up "
            f"included; of which scoring: the job's own `seconds`, reading to publishing); "
            f"`--resume` with the default settings, its driver SIGKILLed at "
            f"{KILL_AT:g} of that time (wall time from the process's start; then, a second "
            f"job, {KILL_AT:g} of the scoring time from when its manifest appears, as its "
            f"scoring begins); the same command again (its `rows` scored against "
            f"`rows_skipped`, from `--metrics-json`); an uninterrupted `--resume` run, which "
            f"the resumed output must equal (ids and predictions, sorted by id, read with "
            f"pyarrow).")


def slow_mlp_model(features: int = FEATURES, width: int = 1536) -> Any:
    """An MLP of about 2,000 rows/s on local[2] (three ``width``-unit layers)."""
    import keras

    return keras.Sequential([keras.Input((features,))]
                            + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
                            + [keras.layers.Dense(1)], name="slow_mlp")


def _job(work: str, out: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("SPARK_REMOTE", None)
    argv = [sys.executable, os.path.join(REPO_ROOT, "jobs", "score.py"), "--master", "local[2]",
            "--model", os.path.join(work, "model.skp"), "--input", os.path.join(work, "input"),
            "--output", out, "--features", "features", "--no-progress", *extra]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _finish(job: subprocess.Popen, what: str) -> None:
    _, err = job.communicate(timeout=3600)
    if job.returncode != 0:
        raise RuntimeError(f"{what} failed ({job.returncode}): {err.decode()[-2000:]}")


def _timed(work: str, out: str, *extra: str) -> float:
    started = time.perf_counter()
    _finish(_job(work, out, *extra), f"job {extra}")
    return time.perf_counter() - started


def _kill(job: subprocess.Popen, after: float, begun: str | None = None) -> bool:
    """SIGKILL the driver ``after`` seconds from now (``begun``: from when that file
    appears, the job's manifest: its scoring begins); its JVM and workers follow. Whether
    it was killed (not ended before)."""
    while begun is not None and not os.path.exists(begun) and job.poll() is None:
        time.sleep(0.05)
    try:
        job.wait(timeout=after)
        return False
    except subprocess.TimeoutExpired:
        os.kill(job.pid, signal.SIGKILL)
    job.wait()
    time.sleep(2)
    try:
        os.killpg(job.pid, signal.SIGKILL)  # what outlived it
    except ProcessLookupError:
        pass
    return True


def _read_sorted(out: str) -> tuple[list[int], bytes]:
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(out, columns=["id", "prediction"]).sort_by("id")
    values = np.asarray(table["prediction"].to_numpy(zero_copy_only=False), dtype="float32")
    return table["id"].to_pylist(), values.tobytes()


def run(quick: bool = False) -> list[dict]:
    """One row per kill (at :data:`KILL_AT` of the plain job's wall time from the start,
    and of its scoring time from when the resumed job's scoring begins): the plain job's
    seconds, the committed groups, the rerun's rows and seconds, whether the output equals
    an uninterrupted run's."""
    import spark_keras as sk
    from bench.commits_bench import write_input

    rows, files = (4_000, 8) if quick else (ROWS, FILES)
    work = tempfile.mkdtemp(prefix="resume-kill-bench-")
    try:
        write_input(os.path.join(work, "input"), files, rows // files, FEATURES)
        sk.save(slow_mlp_model(width=64 if quick else 1536), os.path.join(work, "model.skp"))
        size = sum(os.path.getsize(os.path.join(work, "input", f))
                   for f in os.listdir(os.path.join(work, "input")))
        metrics = os.path.join(work, "metrics.json")
        plain = _timed(work, os.path.join(work, "plain"), "--metrics-json", metrics)
        scoring = json.loads(open(metrics).read())["seconds"]  # reading to publishing
        reference = os.path.join(work, "reference")
        _timed(work, reference, "--resume")
        found = []
        for moment, after, begun in (
                (f"{KILL_AT:g} x the plain job's wall time, from its start", KILL_AT * plain,
                 None),
                (f"{KILL_AT:g} x the plain job's scoring time, from the manifest",
                 KILL_AT * scoring, os.path.join("_spark_keras", "manifest.json"))):
            out = os.path.join(work, f"resumed-{len(found)}")
            killed = _kill(_job(work, out, "--resume"), after,
                           None if begun is None else os.path.join(out, begun))
            log = os.path.join(out, "_spark_keras", "commits")
            committed = len([n for n in (os.listdir(log) if os.path.isdir(log) else [])
                             if n.endswith(".json") and ".moving" not in n])
            rerun = _timed(work, out, "--resume", "--metrics-json", metrics)
            figures = json.loads(open(metrics).read())
            ids, values = _read_sorted(out)
            reference_ids, reference_values = _read_sorted(reference)
            found.append({
                "killed at": moment, "rows": rows, "input MB": size / 1e6,
                "plain job s": plain, "of which scoring s": scoring, "killed": killed,
                "groups": figures["groups_total"], "groups committed at the kill": committed,
                "rerun rows scored": figures["rows"],
                "rerun rows skipped": figures["rows_skipped"],
                "rerun share scored": figures["rows"] / rows, "rerun s": rerun,
                "equal to an uninterrupted run":
                    ids == reference_ids == list(range(rows)) and values == reference_values})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return found
