"""Driving a ``--resume`` run: its groups scored in waves, several groups by one Spark
job, each group committed as soon as its wave is written.

* **Waves.** A wave is a run of the groups left
  (:func:`~spark_keras.jobs.score.parallel.wave_size`: tasks for every slot, then at most
  a twentieth of the input and a minute of the run's pace): one Spark job, tagged
  (:class:`~spark_keras.jobs.score.parallel.Jobs`), over the union of its groups' reads
  (each group read alone, so its tasks and model batches are the ones a job of that group
  alone has), each row carrying its group's index in a hidden column
  (:data:`~spark_keras.jobs.score.trust.GROUP_COL`). Spark writes the wave into staging
  folders of its own partitioned by that column: each group's files land in a folder
  ``__spark_keras_group=N`` of their own, that group's staging folder; one ``observe``
  gives each group's figures (``observe_by``). One plan and one Spark job per wave, not per
  group: a Spark job and its plan cost far more than a commit.
* **In flight.** :data:`~spark_keras.jobs.score.parallel.WAVES_IN_FLIGHT` waves at a time,
  each submitted from a driver thread of its own: the next wave's tasks wait in Spark's
  queue while the driver commits the last one's groups. A wave written first makes room
  for the next before its groups are committed (that wave built and handed to its thread
  first): the slots do not wait on the driver's commits.
* **Committed one at a time.** Only the main thread commits (:func:`commits.commit`),
  each group of a wave, in order, once the wave is written, waves in the order they finish:
  the commit log then holds any set of groups, which a rerun recovers as it recovers one
  run's (each row once, equal to an uninterrupted run, nothing half committed after a
  kill at any moment). The lease is checked before each commit and before each of its
  renames: a driver paused inside a commit past a takeover renames nothing more (a rename
  it had begun finds its source gone when the other job rolled the group forward, and
  fails).
* **A failure** (a wave's Spark job, a commit, a budget passed, a lost lease, Ctrl-C)
  cancels the other waves' Spark jobs, waits for their threads and removes their staging
  folders (not those of a wave whose commits began: a rerun rolls its group forward).
* **The budget** (``--max-invalid``) is the job's, across its commits and runs
  (:class:`~spark_keras.jobs.score.budget.JobBudget`).
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from spark_keras.jobs.score import commits
from spark_keras.jobs.score.budget import JobBudget
from spark_keras.jobs.score.files import join
from spark_keras.jobs.score.lease import Leases
from spark_keras.jobs.score.manifest import FORMAT, Plan, utc_time
from spark_keras.jobs.score.parallel import WAVES_IN_FLIGHT, Jobs, wave_size
from spark_keras.jobs.score.progress import Heartbeat, Progress
from spark_keras.jobs.score.trust import GROUP_COL
from spark_keras.spark.figures import reasons_observed

__all__ = ["run_groups"]

logger = logging.getLogger("spark_keras.jobs.score")


class _Wave:
    """Groups scored by one Spark job: its staging folders, its job's tag, when it began."""

    def __init__(self, plan: Plan, number: int, groups: list[int]) -> None:
        self.groups = groups
        self.number = number
        self.tag = f"{commits.STAGING}w{number:05d}-{uuid.uuid4().hex[:12]}"
        self.staging = {key: join(root, self.tag) for key, root in plan.roots()}
        self.bytes = sum(plan.group_bytes(i) for i in groups)
        self.started = time.perf_counter()
        self.observation: Any = None
        self.committing = False

    def group_staging(self, index: int) -> dict[str, str]:
        """Group ``index``'s staging folders: where Spark's ``partitionBy`` put its files."""
        return {key: join(folder, f"{GROUP_COL}={index}") for key, folder in self.staging.items()}

    def record(self, plan: Plan, index: int) -> dict:
        """The commit record of group ``index`` once written (its figures as observed)."""
        figures = self.observation.get

        def figure(name: str) -> Any:
            return figures[f"{name}@{index}"]

        return {"format": FORMAT, "group": index,
                "input_files": [plan.manifest["files"][i][0]
                                for i in plan.manifest["groups"][index]],
                "rows": int(figure("rows")), "invalid_rows": int(figure("invalid_rows")),
                "invalid_by_reason": reasons_observed(figure("invalid_by_reason")),
                "model_builds": int(figure("model_builds")),
                "build_seconds": round(float(figure("build_seconds")), 3),
                "seconds": round(time.perf_counter() - self.started, 3),
                "committed": utc_time(int(time.time() * 1000))}

    def remove_staging(self, plan: Plan) -> None:
        for folder in self.staging.values():
            try:
                plan.paths.delete(folder)
            except Exception as exc:  # must not hide why the job stops
                logger.warning("cannot remove the staging folder %s: %s", folder, exc)


def _wave_frame(plan: Plan, read: Callable[[list[str]], Any], groups: list[int]) -> Any:
    """The rows of ``groups``, each group read alone (its own tasks), with its index in
    :data:`GROUP_COL`, in one DataFrame."""
    from pyspark.sql import functions as F

    frames = [read(plan.group_files(i)).withColumn(GROUP_COL, F.lit(i)) for i in groups]
    return functools.reduce(lambda a, b: a.union(b), frames)


def run_groups(plan: Plan, leases: Leases, read: Callable[[list[str]], Any],
               score: Callable[..., tuple[Any, Any]],
               write: Callable[..., None], qualify: Callable[[str], str],
               on_commit: Callable[[dict], None], heartbeat: Heartbeat, jobs: Jobs,
               max_invalid: float | None = None,
               published: Callable[[], None] = lambda: None) -> dict:
    """Score and commit every group not committed yet, in waves (see the module
    docstring), while this job holds the ``leases`` of its output and quarantine; the
    summary (:meth:`Progress.summary`).

    Args:
        read: the DataFrame of some input files (paths the path layer takes).
        score: ``score(frame, max_invalid=limit, observe_by=(column, values))``:
            ``(scored DataFrame, its Observation)``, each figure per value of the column.
        write: ``write(scored, output folder, quarantine folder or None, group_col=...)``
            writes a scored wave into staging folders, as Spark must be given them.
        qualify: a path as Spark must be given it.
        on_commit: called with the summary after each commit.
        heartbeat: logs :meth:`Progress.line` while groups are scored.
        jobs: the session's task slots and job tags.
        max_invalid: ``--max-invalid``, the job's (checked).
        published: called once the files readers see have changed (after the recovery
            and each commit): a table's listing refreshed.
    """
    assert plan.output is not None  # known once the run begins
    committed = commits.begin(plan)
    published()
    progress = Progress(plan, committed)
    budget = JobBudget(max_invalid, committed)
    logger.info(progress.started())
    todo = collections.deque(i for i in range(progress.total) if i not in committed)
    total_bytes = sum(plan.group_bytes(i) for i in todo)
    running: dict[Future, _Wave] = {}
    stopping = threading.Event()
    numbers = itertools.count()
    began, scored_bytes = time.perf_counter(), 0

    def written(wave: _Wave, scored: Any) -> None:  # a driver thread's part
        if stopping.is_set():  # the job stops: not begun
            return
        invalid = wave.staging.get("invalid_")
        first, last = wave.groups[0] + 1, wave.groups[-1] + 1
        with jobs.tagged(wave.tag, f"spark-keras score: groups {first}-{last} of "
                                   f"{progress.total}"):
            write(scored, qualify(wave.staging[""]),
                  None if invalid is None else qualify(invalid), group_col=GROUP_COL)

    def line(tasks: Any) -> str:
        first = min((w.groups[0] for w in list(running.values())), default=None)
        if first is None:  # a beat between waves: not to be read as a commit's line
            return progress.line() + "; no group in flight"
        return progress.line(first, tasks)

    def next_wave() -> _Wave:
        pace = scored_bytes / (time.perf_counter() - began) if scored_bytes else None
        size = wave_size([plan.group_bytes(i) for i in todo], total_bytes, jobs.slots(), pace)
        return _Wave(plan, next(numbers), [todo.popleft() for _ in range(size)])

    with ThreadPoolExecutor(WAVES_IN_FLIGHT, thread_name_prefix="spark-keras-wave") as pool, \
            heartbeat.beating(line):
        try:
            done: list[Future] = []  # written, to commit once the next waves are queued
            while todo or running:
                while todo and len(running) - len(done) < WAVES_IN_FLIGHT:
                    wave = next_wave()
                    scored, wave.observation = score(
                        _wave_frame(plan, read, wave.groups), max_invalid=budget.action_limit(),
                        observe_by=(GROUP_COL, wave.groups))
                    running[pool.submit(written, wave, scored)] = wave
                for future in done:
                    wave = running[future]
                    for index in wave.groups:
                        record = wave.record(plan, index)
                        budget.check(index, record)
                        wave.committing = True  # from here a rerun finishes or undoes it
                        leases.check()
                        record = commits.commit(plan, index, wave.group_staging(index), record,
                                                leases.held)
                        budget.add(record)
                        progress.add(index, record)
                        published()
                        logger.info(progress.line())
                        on_commit(progress.summary())
                    del running[future]
                    wave.remove_staging(plan)
                done = []
                if running:
                    finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    done = sorted(finished, key=lambda f: running[f].number)
                    for future in done:
                        future.result()  # its Spark job's error, if any
                        scored_bytes += running[future].bytes
        except BaseException:
            stopping.set()
            pending = set(running)
            while pending:  # again until they end: a thread may tag its job after a cancel
                for wave in running.values():
                    jobs.cancel(wave.tag)
                pending = wait(pending, timeout=1.0).not_done
            for wave in running.values():
                if not wave.committing:
                    wave.remove_staging(plan)
            raise
    leases.check()
    budget.judge()
    for _, root in plan.roots():
        if not plan.paths.exists(join(root, commits.SUCCESS)):
            plan.paths.create(join(root, commits.SUCCESS), b"")
    return progress.summary()
