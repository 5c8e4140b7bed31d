"""``--resume`` with groups in flight together (issue 53): commits sized to the job by
default, groups scored at once and committed one at a time, kills at several moments, a
lease taken over while a driver is stalled inside a commit, and ``--max-invalid`` as one
budget across commits and across the runs that resume the job (issue 55, item 6)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.errors import InvalidRowsError
from spark_keras.jobs.score import lease as score_lease
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.budget import JobBudget
from spark_keras.jobs.score.commits import STAGING
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import HadoopPaths
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.manifest import plan_groups
from spark_keras.jobs.score.parallel import default_commit_bytes, in_flight, wave_size
from spark_keras.jobs.score.run import score
from tests import models
from tests.conftest import REPO_ROOT

ROWS = 200  # per input file
FILES = 8
BAD_EVERY = 25  # every 25th row of a file holds a NaN: 8 invalid rows per file


def write_rows(path, first: int, seed: int, bad: bool = False) -> None:
    x = np.random.default_rng(seed).standard_normal((ROWS, 6)).astype("float32")
    if bad:
        x[::BAD_EVERY, 0] = np.nan
    pq.write_table(pa.table({"id": pa.array(np.arange(first, first + ROWS), pa.int64()),
                             "features": pa.array(list(x), pa.list_(pa.float32()))}), path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``clean/``: 8 files; ``bad/``: 8 files of which 8 rows each are invalid; a model."""
    folder = tmp_path_factory.mktemp("score-inflight")
    for name, bad in (("clean", False), ("bad", True)):
        (folder / name).mkdir()
        for i in range(FILES):
            write_rows(folder / name / f"part-{i}.parquet", i * ROWS, i, bad)
    sk.save(models.mlp(n_features=6, hidden=8, outputs=3), str(folder / "model.skp"))
    return folder


def job_argv(data, out, *extra: str, source: str = "clean") -> list[str]:
    return ["--model", str(data / "model.skp"), "--input", str(data / source), "--output",
            str(out), "--features", "features", "--resume", *extra]


def read_sorted(out) -> tuple[list[int], list[int]]:
    """The ids and the predictions' bits of an output, by id (pyarrow: no Spark job)."""
    table = pq.read_table(str(out), columns=["id", "prediction"]).sort_by("id")
    bits = np.stack(table["prediction"].to_numpy(zero_copy_only=False)).astype("float32")
    return table["id"].to_pylist(), bits.view(np.uint32).ravel().tolist()


def wave_jobs(spark) -> dict[str, list[int]]:
    """Each wave's Spark jobs so far (by the wave's job tag, ``_staging-wNNNNN-...``): the
    tasks of each, once Spark's listener bus has delivered the events it holds."""
    context = spark.sparkContext._jsc.sc()
    context.listenerBus().waitUntilEmpty()
    jobs = context.statusStore().jobsList(None)
    found: dict[str, list[int]] = {}
    for job in (jobs.apply(i) for i in range(jobs.size())):
        for tag in job.jobTags().mkString("\n").split("\n"):
            if tag.startswith(f"{STAGING}w"):
                found.setdefault(tag, []).append(job.numTasks())
    return found


def records(out) -> dict[int, dict]:
    log = out / "_spark_keras" / "commits"
    return {int(p.name[1:6]): json.loads(p.read_text()) for p in log.glob("g*.json")
            if ".moving" not in p.name}


# --- no Spark --------------------------------------------------------------------------------

def test_default_groups_fit_the_job_from_a_laptop_to_a_cluster():
    """About ten groups per group in flight (a kill loses about a tenth), and enough in
    flight to keep every task slot busy: 10 MB on local[2], 1 TB on 500 cores."""
    assert in_flight(2) == 4 and in_flight(500) == 32 and in_flight(0) == 3
    small = [250_000] * 40  # 10 MB in 40 files
    groups = plan_groups(small, default_commit_bytes(sum(small), 2))
    assert len(groups) == 40  # a kill loses the 4 in flight at most: a tenth
    big = [2**30] * 1000  # 1 TB in 1 GiB files on 500 cores
    groups = plan_groups(big, default_commit_bytes(sum(big), 500))
    assert 300 <= len(groups) <= 340  # ~10 x 32 in flight
    per_group = 1000 / len(groups) * 8  # tasks of 128 MiB
    assert in_flight(500) * per_group >= 500  # in flight: every slot busy
    assert plan_groups([5, 5, 5], default_commit_bytes(15, 2)) == [[0], [1], [2]]  # files whole


def test_a_wave_holds_the_slots_then_at_most_a_twentieth_of_the_input_and_a_minute_of_work():
    """A kill loses the two waves in flight: a wave is capped by a twentieth of the input
    and by a minute of the run's pace, whichever is less, but never holds fewer tasks than
    the slots. 25 MB in 40 groups on local[2]: waves of 2 groups, however fast the run."""
    small = [625_000] * 40
    assert wave_size(small, sum(small), 2) == 2
    assert wave_size(small, sum(small), 2, pace=1e12) == 2  # not the whole rest of the input
    assert wave_size(small, sum(small), 8, pace=1.0) == 8  # the slots' floor
    files = [100 * 10**6] * 1000  # 100 GB of 100 MB groups on 2 slots
    assert wave_size(files, sum(files), 2) == 50  # 5 GB: a twentieth
    assert wave_size(files, sum(files), 2, pace=10**7) == 6  # 600 MB: a minute at 10 MB/s
    assert wave_size(files, sum(files), 2, pace=1e12) == 50
    assert wave_size([10**9], 10**9, 2, pace=1.0) == 1  # one at least


def test_one_budget_over_the_commits_of_every_run():
    """A count: each group's Spark job gets what is left; a commit that would pass it is
    refused. A fraction: judged on the job's rows at the end, not per commit."""
    before = {0: {"rows": 100, "invalid_rows": 20}, 1: {"rows": 100, "invalid_rows": 5}}
    budget = JobBudget(30, before)
    assert budget.action_limit() == 5
    budget.check(2, {"rows": 100, "invalid_rows": 5})
    budget.add({"rows": 100, "invalid_rows": 5})
    assert budget.action_limit() == 0  # no invalid row left: the next one aborts
    with pytest.raises(InvalidRowsError, match=r"--max-invalid 30 passed: 31 of 400 rows "
                                               r"\(7\.75%\) .* group 4 is not committed"):
        budget.check(3, {"rows": 100, "invalid_rows": 1})
    fraction = JobBudget(0.1, {0: {"rows": 100, "invalid_rows": 40}})
    assert fraction.action_limit() is None  # one group 40% invalid: judged with the rest
    fraction.add({"rows": 300, "invalid_rows": 0})
    fraction.judge()  # 40 of 400: 10%, not past it
    fraction.add({"rows": 1, "invalid_rows": 1})
    with pytest.raises(InvalidRowsError, match="41 of 401 rows"):
        fraction.judge()
    assert JobBudget(0, {}).action_limit() == 0 and JobBudget(None, before).action_limit() is None


def test_a_driver_whose_beats_stalled_publishes_nothing_more(tmp_path, monkeypatch):
    """Before each rename of a commit: a job whose own last beat is older than half the
    takeover's wait stops (another host may judge it gone), even if its holder file is
    still there."""
    monkeypatch.setattr(score_lease, "STALE_SECONDS", 1.0)
    monkeypatch.setattr(score_lease, "BEAT_SECONDS", 60.0)  # no beat after the first
    monkeypatch.setattr(score_lease, "SETTLE_SECONDS", 0.1)
    with score_lease.Leases(ArrowPaths(), [str(tmp_path / "out")]) as leases:
        leases.held()
        time.sleep(0.6)
        leases.check()  # the holder file: still there
        with pytest.raises(JobError, match=r"this job's lease beats stalled for \d+ s"):
            leases.held()


# --- the job's Python entry point, in the shared session ----------------------------------------

def test_waves_of_groups_are_fewer_spark_jobs_each_group_committed_as_written(
        spark, data, tmp_path):
    """Default settings on local[2]: a group per file, scored in waves of two groups (the
    slots; a twentieth of the input is less than a group), one Spark job of 2 tasks each,
    two waves in flight, each group committed once: the output equals a run in one commit,
    bit for bit, each row once."""
    one = tmp_path / "one"
    score(spark, HadoopPaths(spark), parse_args(job_argv(data, one, "--commit-bytes", "1G")))
    out = tmp_path / "out"
    before = wave_jobs(spark)
    summary = score(spark, HadoopPaths(spark), parse_args(job_argv(data, out)))
    waves = {tag: jobs for tag, jobs in wave_jobs(spark).items() if tag not in before}
    assert (summary["groups"], summary["rows"]) == (FILES, FILES * ROWS), summary
    assert sorted(tag[:len(STAGING) + 6] for tag in waves) == \
        [f"{STAGING}w{n:05d}" for n in range(FILES // 2)], waves
    assert all(jobs == [2] for jobs in waves.values()), waves
    found = records(out)
    assert sorted(found) == list(range(FILES)) and all(r["rows"] == ROWS for r in found.values())
    # in flight together: the groups' times (each from its start to its write's end) overlap
    assert sum(r["seconds"] for r in found.values()) > 1.5 * summary["seconds"], found
    assert read_sorted(out) == read_sorted(one)
    assert read_sorted(out)[0] == list(range(FILES * ROWS))


class WatchingPaths(HadoopPaths):
    """The job's own path layer, which at the first commit's record (``gN.moving.json``, of
    whichever wave was written first) waits up to a minute for the third wave's Spark job
    to be submitted, and notes its tasks."""

    def __init__(self, spark) -> None:
        super().__init__(spark)
        self.before, self.queued = set(wave_jobs(spark)), None

    def move(self, src: str, dst: str) -> None:
        super().move(src, dst)
        if dst.endswith(".moving.json") and self.queued is None:
            deadline = time.monotonic() + 60
            while not self.queued and time.monotonic() < deadline:
                self.queued = [jobs for tag, jobs in wave_jobs(self.spark).items()
                               if tag not in self.before and tag.startswith(f"{STAGING}w00002-")]
                time.sleep(0.05)


def test_the_next_wave_is_queued_before_the_last_ones_groups_are_committed(
        spark, data, tmp_path):
    """Default settings (8 groups of a file, waves of 2 on local[2]): when the first of
    them is written, the third is built and its Spark job (2 tasks) submitted before the
    written wave's groups are committed, so the slots do not wait on the driver's commits."""
    paths = WatchingPaths(spark)
    summary = score(spark, paths, parse_args(job_argv(data, tmp_path / "out")))
    assert summary["groups"] == FILES and paths.queued == [[2]]


class StallingPaths(HadoopPaths):
    """The job's own path layer, stalled once right after a commit record of group 2
    (``g00002.moving.json``) lands: a driver paused inside a commit."""

    def __init__(self, spark) -> None:
        super().__init__(spark)
        self.stalled = threading.Event()
        self.resume = threading.Event()

    def move(self, src: str, dst: str) -> None:
        super().move(src, dst)
        if dst.endswith("g00002.moving.json") and not self.stalled.is_set():
            self.stalled.set()
            assert self.resume.wait(120)


def test_a_driver_whose_lease_was_taken_over_inside_a_commit_renames_nothing_more(
        spark, data, tmp_path, monkeypatch):
    """Another job takes the output over while this one is stalled after a commit's
    record (past the lease's last look): the stalled job renames no file of that group
    and writes no record; a rerun rolls the group forward and ends equal to an
    uninterrupted run."""
    monkeypatch.setattr(score_lease, "CHECK_SECONDS", 0.2)
    out = tmp_path / "out"
    argv = job_argv(data, out, "--commit-bytes", "1")  # a group per file
    paths = StallingPaths(spark)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            score(spark, paths, parse_args(argv))
        except BaseException as exc:  # noqa: BLE001  (what the test looks at)
            failed.append(exc)

    job = threading.Thread(target=run)
    job.start()
    try:
        assert paths.stalled.wait(240)
        lease = tmp_path / ".out.spark-keras-lease"
        for name in os.listdir(lease):  # what a job judging this one dead removes
            os.remove(lease / name)
        time.sleep(0.5)  # stalled on: past the last look at the lease
    finally:
        paths.resume.set()
        job.join(240)
    assert len(failed) == 1 and isinstance(failed[0], JobError), failed
    assert "another score job holds it now" in str(failed[0])
    log = out / "_spark_keras" / "commits"
    assert (log / "g00002.moving.json").exists() and not (log / "g00002.json").exists()
    assert not list(out.glob("g00002-*"))  # not one file of it renamed
    summary = score(spark, HadoopPaths(spark), parse_args(argv))
    assert summary["groups"] + summary["groups_skipped"] == FILES
    reference = tmp_path / "reference"
    score(spark, HadoopPaths(spark), parse_args(job_argv(data, reference, "--commit-bytes", "1")))
    assert read_sorted(out) == read_sorted(reference)


def test_max_invalid_is_one_budget_across_commits_and_resumed_runs(spark, data, tmp_path):
    """64 invalid rows in 8 groups of 8: --max-invalid 30 stops the job (each commit
    alone is far below it), committing at most 30; a resumed run counts the groups
    committed before: 3 groups (24 invalid) committed, 5 left with 40, a rerun allowed 50
    stops; one allowed 64 finishes."""
    common = ["--on-invalid", "null", "--commit-bytes", "1"]
    out = tmp_path / "out"
    with pytest.raises(Exception) as caught:
        score(spark, HadoopPaths(spark),
              parse_args(job_argv(data, out, *common, "--max-invalid", "30", source="bad")))
    assert "max_invalid" in str(caught.value) or "max-invalid" in str(caught.value)
    assert sum(r["invalid_rows"] for r in records(out).values()) <= 30

    resumed = tmp_path / "resumed"  # three groups committed by a run without a limit
    argv = job_argv(data, resumed, *common, source="bad")
    score(spark, HadoopPaths(spark), parse_args(argv))
    log = resumed / "_spark_keras" / "commits"
    for index, record in records(resumed).items():
        if index >= 3:  # as a kill before their commits leaves them
            (log / f"g{index:05d}.json").unlink()
            for name in record["files"]:
                (resumed / name).unlink()
    (resumed / "_SUCCESS").unlink()
    with pytest.raises(InvalidRowsError, match=r"--max-invalid 50 passed: (5[1-9]|6\d) of"):
        score(spark, HadoopPaths(spark), parse_args(argv + ["--max-invalid", "50"]))
    summary = score(spark, HadoopPaths(spark), parse_args(argv + ["--max-invalid", "64"]))
    assert summary["invalid_rows"] + 8 * summary["groups_skipped"] == 64
    assert (resumed / "_SUCCESS").exists()


# --- the job as a process, SIGKILLed at several moments ---------------------------------------

_KILLED_AT = """
import os, signal, sys
from spark_keras.jobs.score import commits, trust
moment, argv = sys.argv[1], sys.argv[2:]
renames = []
moved, committed = trust.move_into, commits.commit

def move_into(paths, root, source, target):
    moved(paths, root, source, target)
    renames.append(target)
    if moment == "commit" and len(renames) == 2:  # the second commit's first rename
        os.kill(os.getpid(), signal.SIGKILL)

def commit(*args, **kwargs):  # only a commit's renames count, not the recovery's
    trust.move_into = move_into
    try:
        return committed(*args, **kwargs)
    finally:
        trust.move_into = moved

commits.commit = commit
from spark_keras.jobs.score.main import main
sys.exit(main(argv))
"""


def killed_run(moment: str, argv: list[str], log, ready=None) -> None:
    """The job as a process, SIGKILLed inside a commit (its second rename) or, with
    ``ready`` (a condition on the output, polled), once it holds."""
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("SPARK_REMOTE", None)
    job = subprocess.Popen([sys.executable, "-c", _KILLED_AT, moment, "--master", "local[2]",
                            *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while job.poll() is None and ready is not None and not ready():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        if job.poll() is None and ready is not None:
            os.kill(job.pid, signal.SIGKILL)
        assert job.wait(240) == -signal.SIGKILL
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)  # its JVM and workers
        except ProcessLookupError:
            pass


@pytest.mark.slow  # three drivers killed, each its own Spark: about two minutes
@pytest.mark.timeout(900)
def test_killed_during_a_waves_job_with_waves_in_flight_and_inside_a_commit_resumes(
        spark, data, tmp_path, caplog):
    """Default settings (waves of groups, two in flight). A driver SIGKILLed while its first
    wave's Spark job writes (nothing committed), the rerun SIGKILLed with waves in flight
    (a group committed, a wave's files written or being written), the next inside a commit
    (its file renamed, its record not written); after each kill a reader sees the
    committed groups whole, each row once. A last rerun (the job's Python entry point on
    the module's session) scores only what was not committed, without a warning, and the
    output equals an uninterrupted run's, bit for bit, each row once."""
    out = tmp_path / "out"
    argv = job_argv(data, out)
    log_folder = out / "_spark_keras" / "commits"

    def writing() -> bool:  # a wave's Spark job under way (its writer set up), none committed
        return not records(out) and any(out.glob("_staging-w*/_temporary"))

    def in_flight_now() -> bool:  # a group committed, waves' files written or being written
        return bool(records(out)) and any(p for p in out.glob("_staging-w*")
                                          if any(p.rglob("*.parquet")))

    for moment, ready in (("none", writing), ("none", in_flight_now), ("commit", None)):
        before = records(out)
        with open(tmp_path / "job.log", "wb") as log:
            killed_run(moment, argv, log, ready=ready)
        found = records(out)
        assert len(found) < FILES and set(before) <= set(found), \
            (tmp_path / "job.log").read_text()[-3000:]
        if ready is writing:
            assert not found
            continue
        committed = sum(r["rows"] for r in found.values())  # what a reader sees meanwhile
        seen = spark.read.parquet(str(out)).select("id").toPandas()["id"]
        assert seen.is_unique and len(seen) >= committed
        if not list(log_folder.glob("*.moving.json")):  # not killed amid a group's renames
            assert len(seen) == committed
    assert found, "no group committed before the last kill"
    metrics = tmp_path / "metrics.json"
    caplog.clear()
    summary = score(spark, HadoopPaths(spark), parse_args(argv + ["--metrics-json", str(metrics)]))
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert json.loads(metrics.read_text()) == summary
    assert summary["rows_skipped"] == ROWS * summary["groups_skipped"] >= ROWS * len(found)
    assert summary["rows"] == ROWS * summary["groups"] == FILES * ROWS - summary["rows_skipped"]
    assert summary["done"] is True and summary["groups_total"] == FILES
    reference = tmp_path / "reference"
    score(spark, HadoopPaths(spark), parse_args(job_argv(data, reference)))
    assert read_sorted(out) == read_sorted(reference)
    assert read_sorted(out)[0] == list(range(FILES * ROWS))


def test_an_input_column_named_like_the_waves_group_column_is_refused(spark, data, tmp_path):
    """A wave writes each group's index in a hidden column (partitionBy): an input column
    of that name (any case) was replaced by it, silently lost from the output (a run
    without --resume keeps it); refused before anything is written."""
    from spark_keras.jobs.score.trust import GROUP_COL

    folder = tmp_path / "input"
    folder.mkdir()
    write_rows(folder / "part-0.parquet", 0, 0)
    table = pq.read_table(folder / "part-0.parquet")
    pq.write_table(table.append_column(GROUP_COL.upper(), pa.array(["user"] * ROWS)),
                   folder / "part-0.parquet")
    argv = ["--model", str(data / "model.skp"), "--input", str(folder), "--output",
            str(tmp_path / "out"), "--features", "features", "--resume"]
    with pytest.raises(JobError, match=f"input has a column '{GROUP_COL}'"):
        score(spark, HadoopPaths(spark), parse_args(argv))
    assert not (tmp_path / "out").exists()
