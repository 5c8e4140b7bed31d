"""On the driver: what the budget ledger (:mod:`.budget_ledger`) knows of the stages its
reports name: whether a stage runs now, its number of tasks and how many completed.

Classic Spark: whether a stage runs, from its DAG scheduler (a stage of a job that runs
now: no listener's lag); its tasks, from the status tracker, asked at need.
A stage's partitions and the scopes of the jobs that run it (the scopes a report of it
may name, :func:`.scopes.scope_of` of each job's local properties) come from the DAG
scheduler too; Spark Connect tells neither: there a report's partition and scope are
not checked against its stage. Spark Connect: the execution progress the server sends the client every
``spark.connect.progress.reportInterval`` (:meth:`StageTasks.watch`): a stage is known
once a progress message names it, and runs until one says it is done. Kept per Spark
context (stage ids start again in each), at most :data:`StageTasks.KEEP` stages.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import threading
from typing import Any

from spark_keras.channel.scopes import SCOPE_PROPERTIES, active_context, in_context, scope_of

logger = logging.getLogger("spark_keras")

PENDING_RETRY = 0.5  # seconds a task waits before it asks the ledger again


@dataclasses.dataclass
class Stage:
    """What is known of one stage: ``tasks`` (its first attempt's), ``completed`` tasks,
    whether it ``runs`` now, its ``partitions`` and the ``scopes`` (within their context,
    :func:`.scopes.in_context`) of the jobs that run it (None: not told)."""

    tasks: int
    completed: int
    runs: bool
    partitions: int = sys.maxsize
    scopes: frozenset[str] | None = None


UNCHECKED = Stage(sys.maxsize, 0, True)  # a stage nothing tells of (a stream on Connect)


def classic() -> Any:
    """The SparkContext running in this process (classic Spark), or None."""
    if "pyspark" not in sys.modules:
        return None
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    return sc if sc is not None and getattr(sc, "_jsc", None) is not None else None


class StageTasks:
    """The stages this driver runs, as far as it can tell (see the module's text)."""

    KEEP = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: collections.OrderedDict[tuple[str | None, int], Stage] = collections.OrderedDict()

    def of(self, stage: int) -> Stage | None:
        """``stage`` of the Spark context running now (``runs`` False: it does not run);
        None while it is not known (its start not posted yet, or no progress message
        named it yet)."""
        context, sc = active_context(), classic()
        if sc is None:  # Spark Connect: what its progress said
            with self._lock:
                return self._known.get((context, stage))
        jobs = _jobs_of(sc, stage)
        if jobs is None and not _runs(sc, stage):
            return Stage(0, 0, False)
        if jobs is not None and not jobs[1]:
            return Stage(0, 0, False)  # dropped with its job (or none runs it)
        try:
            info = sc.statusTracker().getStageInfo(stage)
        except Exception as exc:  # a context stopping
            logger.debug("no status of stage %d: %s", stage, exc)
            return None
        if info is None:
            return None  # its start not posted yet (the listener bus runs behind)
        tasks = self.learn(context, stage, info.numTasks, info.numCompletedTasks)
        if jobs is None:
            return Stage(tasks, info.numCompletedTasks, True)
        scopes = frozenset(in_context(scope_of(p, stage), context) or "" for p in jobs[1])
        return Stage(tasks, info.numCompletedTasks, True, jobs[0], scopes)

    def runs_any(self, stages: Any) -> bool:
        """True if one of ``stages`` (ids) of the Spark context running now runs."""
        context, sc = active_context(), classic()
        if sc is not None:
            return any(_runs(sc, s) for s in stages)
        with self._lock:
            return any((known := self._known.get((context, s))) is not None and known.runs
                       for s in stages)

    def learn(self, context: str | None, stage: int, tasks: int, completed: int = 0,
              done: bool | None = None) -> int:
        """Record what ``stage`` of ``context`` is (``done``: None if not told); returns
        its tasks (its first attempt's: a stage attempt run again for lost partitions has
        fewer)."""
        with self._lock:
            known = self._known.get((context, stage))
            if known is None:
                known = self._known[(context, stage)] = Stage(tasks, completed, True)
            known.completed = max(known.completed, completed)
            if done is not None:
                known.runs = not done
            self._known.move_to_end((context, stage))
            while len(self._known) > self.KEEP:
                self._known.popitem(last=False)
            return known.tasks

    def progress(self, stages: Any = None, inflight_tasks: int = 0, operation_id: Any = None,
                 done: bool = False) -> None:
        """Spark Connect's progress handler (``SparkSession.registerProgressHandler``):
        never raises, as an exception there would fail the client's action."""
        try:
            context = active_context()
            for stage in stages or ():
                if stage.num_tasks > 0:
                    self.learn(context, int(stage.stage_id), int(stage.num_tasks),
                               int(stage.num_completed_tasks), bool(stage.done))
        except Exception as exc:
            logger.debug("cannot read Spark Connect's progress: %s", exc)

    def watch(self, session: Any) -> None:
        """Learn the stages of ``session`` (a Spark Connect session) from its progress
        messages (PySpark 4.0+; once per session)."""
        register = getattr(session, "registerProgressHandler", None)
        if register is None:
            return
        try:
            register(self.progress)  # the client keeps one registration per handler
        except Exception as exc:
            logger.debug("cannot watch Spark Connect's progress: %s", exc)


def _jobs_of(sc: Any, stage: int) -> tuple[int, list[dict[str, str | None]]] | None:
    """``stage``'s partitions and the scope properties of each active job that runs it,
    as classic Spark's DAG scheduler keeps them (no active job: it does not run); None
    if the scheduler does not say."""
    try:
        dag = sc._jsc.sc().dagScheduler()
        found = dag.stageIdToStage().get(stage)
        if found.isEmpty():
            return 0, []
        known, active, jobs = found.get(), dag.jobIdToActiveJob(), []
        ids = known.jobIds().toList().iterator()
        while ids.hasNext():
            job = active.get(ids.next())
            if job.isDefined():
                props = job.get().properties()
                jobs.append({k: None if props is None else props.getProperty(k)
                             for k in SCOPE_PROPERTIES})
        return int(known.numPartitions()), jobs
    except Exception as exc:  # noqa: BLE001 (Py4J's errors: another Spark, a JVM stopping)
        logger.debug("the DAG scheduler does not say which jobs run stage %d: %r", stage, exc)
        return None


def _runs(sc: Any, stage: int) -> bool:
    """Whether ``stage`` is one of a job classic Spark runs now: its DAG scheduler's
    stages (made before any task of the job, dropped as the job ends: no listener's lag),
    else (a Spark that does not say) its status tracker's running stages."""
    try:
        return bool(sc._jsc.sc().dagScheduler().stageIdToStage().contains(stage))
    except Exception as exc:  # noqa: BLE001 (Py4J's errors: another Spark, a JVM stopping)
        logger.debug("the DAG scheduler does not say whether stage %d runs: %r", stage, exc)
    try:
        return stage in sc.statusTracker().getActiveStageIds()
    except Exception:  # noqa: BLE001 (a context stopping)
        return False


stage_tasks = StageTasks()
