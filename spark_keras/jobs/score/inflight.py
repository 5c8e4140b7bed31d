"""Driving a ``--resume`` run: its groups scored several at once, each committed as soon
as Spark has written it.

* **In flight.** :func:`~spark_keras.jobs.score.parallel.in_flight` groups at a time (the
  task slots and two more, from ``defaultParallelism`` each time a group is started, so
  executors added or lost count), each a Spark job submitted from a driver thread of its
  own, tagged (:class:`~spark_keras.jobs.score.parallel.Jobs`), writing into staging
  folders of its own.
* **Committed one at a time.** Only the main thread commits (:func:`commits.commit`),
  each group as soon as it is written, in the order they finish: the commit log then holds
  any set of groups, which a rerun recovers as it recovers one run's (each row once, equal
  to an uninterrupted run, nothing half committed after a kill at any moment). The lease
  is checked before each commit and before each of its renames: a driver paused inside a
  commit past a takeover renames nothing more (a rename it had begun finds its source
  gone when the other job rolled the group forward, and fails).
* **A failure** (a group's Spark job, a commit, a budget passed, a lost lease, Ctrl-C)
  cancels the other groups' Spark jobs, waits for their threads and removes their staging
  folders (not those of a group whose commit began: a rerun rolls it forward).
* **The budget** (``--max-invalid``) is the job's, across its commits and runs
  (:class:`~spark_keras.jobs.score.budget.JobBudget`).
"""

from __future__ import annotations

import collections
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
from spark_keras.jobs.score.parallel import MAX_IN_FLIGHT, Jobs, in_flight
from spark_keras.jobs.score.progress import Heartbeat, Progress
from spark_keras.spark.figures import reasons_observed

__all__ = ["run_groups"]

logger = logging.getLogger("spark_keras.jobs.score")


class _Group:
    """A group in flight: its staging folders, its Spark job's tag, when it began."""

    def __init__(self, plan: Plan, index: int) -> None:
        self.index = index
        self.tag = f"{commits.STAGING}g{index:05d}-{uuid.uuid4().hex[:12]}"
        self.staging = {key: join(root, self.tag) for key, root in plan.roots()}
        self.started = time.perf_counter()
        self.observation: Any = None
        self.committing = False

    def record(self, plan: Plan) -> dict:
        """The commit record of the written group (its figures as Spark observed them)."""
        figures = self.observation.get
        return {"format": FORMAT, "group": self.index,
                "input_files": [plan.manifest["files"][i][0]
                                for i in plan.manifest["groups"][self.index]],
                "rows": int(figures["rows"]), "invalid_rows": int(figures["invalid_rows"]),
                "invalid_by_reason": reasons_observed(figures["invalid_by_reason"]),
                "model_builds": int(figures["model_builds"]),
                "build_seconds": round(float(figures["build_seconds"]), 3),
                "seconds": round(time.perf_counter() - self.started, 3),
                "committed": utc_time(int(time.time() * 1000))}

    def remove_staging(self, plan: Plan) -> None:
        for folder in self.staging.values():
            try:
                plan.paths.delete(folder)
            except Exception as exc:  # must not hide why the job stops
                logger.warning("cannot remove the staging folder %s: %s", folder, exc)


def run_groups(plan: Plan, leases: Leases, read: Callable[[list[str]], Any],
               score: Callable[..., tuple[Any, Any]],
               write: Callable[[Any, str, str | None], None], qualify: Callable[[str], str],
               on_commit: Callable[[dict], None], heartbeat: Heartbeat, jobs: Jobs,
               max_invalid: float | None = None,
               published: Callable[[], None] = lambda: None) -> dict:
    """Score and commit every group not committed yet, several at once (see the module
    docstring), while this job holds the ``leases`` of its output and quarantine; the
    summary (:meth:`Progress.summary`).

    Args:
        read: the DataFrame of some input files (paths the path layer takes).
        score: ``score(frame, max_invalid=limit)``: ``(scored DataFrame, its Observation)``.
        write: writes a scored DataFrame into a staging folder of the output and one of
            the quarantine (None without one), as Spark must be given them.
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
    running: dict[Future, _Group] = {}
    stopping = threading.Event()

    def written(group: _Group, scored: Any) -> None:  # a driver thread's part
        if stopping.is_set():  # the job stops: not begun
            return
        invalid = group.staging.get("invalid_")
        with jobs.tagged(group.tag, f"spark-keras score: group {group.index + 1} of "
                                    f"{progress.total}"):
            write(scored, qualify(group.staging[""]),
                  None if invalid is None else qualify(invalid))

    def line(tasks: Any) -> str:
        first = min((g.index for g in list(running.values())), default=None)
        if first is None:  # a beat between groups: not to be read as a commit's line
            return progress.line() + "; no group in flight"
        return progress.line(first, tasks)

    with ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="spark-keras-group") as pool, \
            heartbeat.beating(line):
        try:
            while todo or running:
                while todo and len(running) < in_flight(jobs.slots()):
                    group = _Group(plan, todo.popleft())
                    scored, group.observation = score(read(plan.group_files(group.index)),
                                                      max_invalid=budget.action_limit())
                    running[pool.submit(written, group, scored)] = group
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: running[f].index):
                    future.result()  # its Spark job's error, if any
                    group = running[future]
                    record = group.record(plan)
                    budget.check(group.index, record)
                    group.committing = True  # from here a rerun finishes or undoes it
                    leases.check()
                    record = commits.commit(plan, group.index, group.staging, record,
                                            leases.held)
                    del running[future]
                    budget.add(record)
                    progress.add(group.index, record)
                    published()
                    logger.info(progress.line())
                    on_commit(progress.summary())
        except BaseException:
            stopping.set()
            pending = set(running)
            while pending:  # again until they end: a thread may tag its job after a cancel
                for group in running.values():
                    jobs.cancel(group.tag)
                pending = wait(pending, timeout=1.0).not_done
            for group in running.values():
                if not group.committing:
                    group.remove_staging(plan)
            raise
    leases.check()
    budget.judge()
    for _, root in plan.roots():
        if not plan.paths.exists(join(root, commits.SUCCESS)):
            plan.paths.create(join(root, commits.SUCCESS), b"")
    return progress.summary()
