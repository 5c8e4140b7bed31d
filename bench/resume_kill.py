"""The commits section's kill: what a SIGKILL of the driver costs a ``--resume`` job with
the default settings. The job as a user runs it (``python jobs/score.py --master
local[2]``, a process each), on a parquet input of :data:`ROWS` rows in :data:`FILES` files
(:data:`FEATURES` float32 features, about 25 MB), with a model of about 2,000 rows/s on
local[2] (:func:`slow_mlp_model`):

1. the plain job (no ``--resume``), timed (its wall time, Spark's start-up included);
2. ``--resume`` with the default settings, its driver SIGKILLed at :data:`KILL_AT` of the
   plain job's time;
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
            f"{KILL_AT:g} of that time; the same command again (its `rows` scored against "
            f"`rows_skipped`, from `--metrics-json`); an uninterrupted `--resume` run, which "
            f"the resumed output must equal (ids and predictions, sorted by id, read with "
            f"pyarrow).")


def slow_mlp_model(features: int = FEATURES, width: int = 1536) -> Any:
    """An MLP of about 2,000 rows/s on local[2] (three ``width``-unit layers)."""
    import keras

    return keras.Sequential([keras.Input((features,))]
                            + [keras.layers.Dense(width, activation="relu") for _ in range(3)]
                            + [keras.layers.Dense(1)], name="slow_mlp")


def _write_input(folder: str, rows: int, files: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder)
    per_file = rows // files
    for i in range(files):
        x = np.random.default_rng(i).standard_normal((per_file, FEATURES)).astype("float32")
        pq.write_table(pa.table({
            "id": pa.array(np.arange(i * per_file, (i + 1) * per_file), pa.int64()),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), FEATURES)
            .cast(pa.list_(pa.float32()))}), os.path.join(folder, f"part-{i:03d}.parquet"))


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


def _kill(job: subprocess.Popen, after: float) -> None:
    """SIGKILL the driver ``after`` seconds from now; its JVM and workers follow."""
    try:
        job.wait(timeout=after)
        raise RuntimeError("the job ended before it was killed")
    except subprocess.TimeoutExpired:
        os.kill(job.pid, signal.SIGKILL)
    job.wait()
    time.sleep(2)
    try:
        os.killpg(job.pid, signal.SIGKILL)  # what outlived it
    except ProcessLookupError:
        pass


def _read_sorted(out: str) -> tuple[list[int], bytes]:
    import numpy as np
    import pyarrow.parquet as pq

    table = pq.read_table(out, columns=["id", "prediction"]).sort_by("id")
    values = np.asarray(table["prediction"].to_numpy(zero_copy_only=False), dtype="float32")
    return table["id"].to_pylist(), values.tobytes()


def run(quick: bool = False) -> list[dict]:
    """One row: the plain job's seconds, when the driver was killed, the committed rows,
    the rerun's rows and seconds, whether the output equals an uninterrupted run's."""
    import spark_keras as sk

    rows, files = (4_000, 8) if quick else (ROWS, FILES)
    work = tempfile.mkdtemp(prefix="resume-kill-bench-")
    try:
        _write_input(os.path.join(work, "input"), rows, files)
        sk.save(slow_mlp_model(width=64 if quick else 1536), os.path.join(work, "model.skp"))
        size = sum(os.path.getsize(os.path.join(work, "input", f))
                   for f in os.listdir(os.path.join(work, "input")))
        out, metrics = os.path.join(work, "resumed"), os.path.join(work, "metrics.json")
        plain = _timed(work, os.path.join(work, "plain"), "--metrics-json", metrics)
        scoring = json.loads(open(metrics).read())["seconds"]  # of which scoring, writing
        _kill(_job(work, out, "--resume"), KILL_AT * plain)
        committed = len([n for n in os.listdir(os.path.join(out, "_spark_keras", "commits"))
                         if n.endswith(".json") and ".moving" not in n])
        rerun = _timed(work, out, "--resume", "--metrics-json", metrics)
        figures = json.loads(open(metrics).read())
        _timed(work, os.path.join(work, "reference"), "--resume")
        ids, values = _read_sorted(out)
        reference_ids, reference_values = _read_sorted(os.path.join(work, "reference"))
        equal = ids == reference_ids == list(range(rows)) and values == reference_values
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [{"rows": rows, "input MB": size / 1e6, "plain job s": plain,
             "of which scoring s": scoring,
             "killed at s": KILL_AT * plain, "groups": figures["groups_total"],
             "groups committed at the kill": committed,
             "rerun rows scored": figures["rows"], "rerun rows skipped": figures["rows_skipped"],
             "rerun share scored": figures["rows"] / rows, "rerun s": rerun,
             "equal to an uninterrupted run": equal}]
