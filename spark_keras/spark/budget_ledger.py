"""On the driver: the invalid rows the tasks of each action report against a
``max_invalid`` limit counted over the whole action (``max_invalid_scope="action"``, see
:mod:`spark_keras.inference.limits`), answered over the driver's channel
(``GET /invalid``, :mod:`.version_server`; the worker's side is :mod:`.job_budget`).

A report carries the budget's key (one per ``transform`` or UDF column), the task's scope
(its micro-batch or action, :func:`.versions.scope_of`), stage, partition and attempt, its
rows and invalid rows so far, the limit, whether its last batch was scored, and its first
reasons: numbers and at most three short strings, read from the query string (never a
pickle). Per budget and scope the driver keeps each partition's furthest count in each
stage (the largest rows and invalid rows any attempt reported for it: retries and
speculative copies count once), their sum per stage, the partitions of each stage whose
last batch was reported, and the first reasons. The action's count is that of its stage
that scored the most rows (of the most invalid ones): a stage that scores the rows again
(a sort's sampling job; a filter on the prediction that Spark evaluates below an
exchange, then again above it on the rows kept) counts once, not twice.

Bounds: :data:`MAX_COUNTS` budgets x scopes (the least recently reported dropped), each
at most :data:`MAX_PARTITIONS` partitions (past that, a task is told to count alone) and
:data:`~spark_keras.inference.limits.QUOTED_REASONS` reasons of :data:`REASON_CHARS`.

Answers (JSON): ``passed`` (the error's text: every report of that budget and scope gets
it from then on), ``pending`` (a fraction waits for the stage's number of tasks: ask
again), ``alone`` (why the driver cannot judge: the task counts alone), ``reasons``
(whether more first reasons are wanted).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import re
import sys
import threading
import time
from typing import Any

from ..inference.limits import QUOTED_REASONS, passed_message
from .channel_server import Refused
from .versions import active_context, in_context

logger = logging.getLogger("spark_keras")

MAX_COUNTS = 64
MAX_PARTITIONS = 250_000
REASON_CHARS = 300
# seconds the last reports of a stage wait for its number of tasks before counting alone
STAGE_COUNT_WAIT = 8.0
PENDING_RETRY = 0.5  # seconds a task waits before it asks again
_KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_TASK = re.compile(r"([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,6})")
_COUNTS = re.compile(r"([0-9]{1,18})\.([0-9]{1,18})")
_LIMIT = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,17})?(?:e-[0-9]{1,3})?")


@dataclasses.dataclass(frozen=True)
class Report:
    """One task's report (see the module's text)."""

    key: str
    scope: str
    stage: int
    partition: int
    attempt: int
    rows: int
    invalid: int
    limit: float
    final: bool
    reasons: tuple[str, ...] = ()

    @classmethod
    def parse(cls, query: dict[str, str], scope: str | None) -> "Report":
        """The report of a request's ``query`` (``scope`` checked already).

        Raises:
            Refused: 400, a field missing or malformed.
        """
        key, task, counts = query.get("name", ""), query.get("task", ""), query.get("counts", "")
        limit, final = query.get("limit", ""), query.get("final", "")
        if scope is None:
            raise Refused(400, "a report names its task's scope (scope=)")
        if not _KEY.fullmatch(key) or not (t := _TASK.fullmatch(task)) \
                or not (c := _COUNTS.fullmatch(counts)) or final not in ("0", "1") \
                or not _LIMIT.fullmatch(limit):
            raise Refused(400, "a report has name=<budget>, task=<stage>.<partition>.<attempt>, "
                               "counts=<rows>.<invalid>, limit=<max_invalid>, final=0|1")
        value: float = int(limit) if limit.isdigit() else float(limit)
        if not math.isfinite(value) or (value >= 1 and value != int(value)):
            raise Refused(400, f"limit={limit!r} is not a max_invalid (a count or a fraction)")
        reasons: tuple[str, ...] = ()
        if query.get("reasons"):
            try:
                given = json.loads(query["reasons"])
            except ValueError:
                given = None
            if not isinstance(given, list) or not all(isinstance(r, str) for r in given):
                raise Refused(400, "reasons= is a JSON list of strings")
            reasons = tuple(r[:REASON_CHARS] for r in given[:QUOTED_REASONS])
        rows, invalid = int(c.group(1)), int(c.group(2))
        if invalid > rows:
            raise Refused(400, f"counts={counts!r}: more invalid rows than rows")
        return cls(key, scope, int(t.group(1)), int(t.group(2)), int(t.group(3)), rows, invalid,
                   value, final == "1", reasons)


def describe(scope: str) -> str:
    """A scope as an operator reads it."""
    kind, _, rest = scope.partition(":")
    number = rest.rpartition(":")[2]
    if kind == "stream":
        query, _, batch = rest.rpartition(":")
        return f"micro-batch {batch} of streaming query {query}"
    return f"SQL execution {number}" if kind == "sql" else f"the job of stage {number}"


class _Count:
    """One budget's count in one scope: per stage, the sum of its partitions' furthest
    counts; the action's count is its largest stage's."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.best: dict[tuple[int, int], tuple[int, int]] = {}  # (stage, partition) -> furthest
        self.stages: dict[int, list[int]] = {}  # stage -> [rows, invalid] of its partitions
        self.rows = 0  # the largest stage's rows...
        self.invalid = 0  # ... and invalid rows (each stage's only grow)
        self.finals: dict[int, set[int]] = {}  # stage -> partitions whose last batch was reported
        self.reasons: list[str] = []
        self.passed: str | None = None
        self.waiting: dict[int, float] = {}  # stage -> since when its last reports wait
        self.warned = False

    def add(self, report: Report) -> bool:
        """Count ``report``; False if its partition is one too many to keep."""
        where = (report.stage, report.partition)
        old = self.best.get(where)
        if old is None:
            if len(self.best) >= MAX_PARTITIONS:
                return False
            old = (0, 0)
        new = (max(old[0], report.rows), max(old[1], report.invalid))
        self.best[where] = new
        stage = self.stages.setdefault(report.stage, [0, 0])
        stage[0] += new[0] - old[0]
        stage[1] += new[1] - old[1]
        self.rows, self.invalid = max(self.rows, stage[0]), max(self.invalid, stage[1])
        for reason in report.reasons:
            if len(self.reasons) < QUOTED_REASONS:
                self.reasons.append(reason)
        if report.final:
            self.finals.setdefault(report.stage, set()).add(report.partition)
        return True

    def over(self) -> bool:
        if self.limit >= 1 or self.limit == 0:
            return self.invalid > self.limit
        return self.invalid > self.limit * self.rows


class Ledger:
    """Every budget's count per scope, on this driver (see the module's text)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.OrderedDict[tuple[str, str], _Count] = collections.OrderedDict()

    def answer(self, report: Report) -> dict[str, Any]:
        """The answer to ``report`` (see the module's text)."""
        context = active_context()
        scope = in_context(report.scope, context) or report.scope
        with self._lock:
            count = self._count(report.key, scope, report.limit)
            if count.passed is None and not count.add(report):
                return self._alone(count, scope, f"the action has more than {MAX_PARTITIONS} "
                                                 f"partitions: those past it are counted per task")
            answer: dict[str, Any] = {"reasons": len(count.reasons) < QUOTED_REASONS}
            if count.passed is not None:
                return {**answer, "passed": count.passed}
            if count.limit >= 1 or count.limit == 0:
                if count.over():
                    count.passed = self._message(count, scope, "so far")
                    return {**answer, "passed": count.passed}
                return answer
            if not report.final:
                return answer
        tasks = stage_tasks.of(report.stage, context, report.scope)
        with self._lock:
            if tasks is None:
                if report.scope.startswith("stream:") and not stage_tasks.classic():
                    return self._alone(count, scope, "Spark Connect reports no stage of a "
                                                     "streaming query to its client")
                since = count.waiting.setdefault(report.stage, time.monotonic())
                if time.monotonic() - since > STAGE_COUNT_WAIT:
                    return self._alone(count, scope, f"the number of tasks of stage "
                                                     f"{report.stage} was not known within "
                                                     f"{STAGE_COUNT_WAIT:.0f} s")
                return {**answer, "pending": PENDING_RETRY}
            if count.passed is None and len(count.finals.get(report.stage, ())) >= tasks \
                    and count.over():
                count.passed = self._message(count, scope, f"in all (the {tasks} tasks of "
                                                           f"stage {report.stage} scored)")
            return answer if count.passed is None else {**answer, "passed": count.passed}

    def _count(self, key: str, scope: str, limit: float) -> _Count:
        count = self._counts.get((key, scope))
        if count is None:
            count = self._counts[(key, scope)] = _Count(limit)
            while len(self._counts) > MAX_COUNTS:
                self._counts.popitem(last=False)
        self._counts.move_to_end((key, scope))
        return count

    @staticmethod
    def _message(count: _Count, scope: str, when: str) -> str:
        return passed_message("max_invalid", count.limit, count.invalid, count.rows,
                              count.reasons, f"scored by the tasks of {describe(scope)} "
                              f"were invalid {when}")

    @staticmethod
    def _alone(count: _Count, scope: str, why: str) -> dict[str, Any]:
        if not count.warned:
            count.warned = True
            logger.warning("max_invalid=%r cannot be judged over %s: %s; its tasks count their "
                           "own rows (max_invalid_scope='task')", count.limit, describe(scope), why)
        return {"alone": why}


class StageTasks:
    """The number of tasks of each stage, as this driver learns it: classic Spark's status
    tracker, asked at need; on Spark Connect the execution progress the server sends the
    client (:func:`watch`). Kept per Spark context (stage ids start again in each)."""

    KEEP = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: collections.OrderedDict[tuple[str | None, int], int] = collections.OrderedDict()

    @staticmethod
    def classic() -> bool:
        """True when a classic SparkContext runs in this process."""
        if "pyspark" not in sys.modules:
            return False
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        return sc is not None and getattr(sc, "_jsc", None) is not None

    def of(self, stage: int, context: str | None, scope: str) -> int | None:
        """The tasks of ``stage`` (None while unknown)."""
        with self._lock:
            known = self._known.get((context, stage))
        if known is not None or not self.classic():
            return known
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        try:
            info = sc.statusTracker().getStageInfo(stage) if sc is not None else None
        except Exception as exc:  # a context stopping: the task counts alone after the wait
            logger.debug("no status of stage %d for %s: %s", stage, scope, exc)
            return None
        if info is None:  # not posted yet (the listener bus runs behind), or dropped
            return None
        self.learn(context, stage, info.numTasks)
        return info.numTasks

    def learn(self, context: str | None, stage: int, tasks: int) -> None:
        """Record that ``stage`` of ``context`` has ``tasks`` tasks (its first attempt's:
        a stage attempt run again for lost partitions has fewer)."""
        with self._lock:
            self._known.setdefault((context, stage), tasks)
            self._known.move_to_end((context, stage))
            while len(self._known) > self.KEEP:
                self._known.popitem(last=False)

    def progress(self, stages: Any = None, inflight_tasks: int = 0, operation_id: Any = None,
                 done: bool = False) -> None:
        """Spark Connect's progress handler (``SparkSession.registerProgressHandler``):
        never raises, as an exception there would fail the client's action."""
        try:
            context = active_context()
            for stage in stages or ():
                if stage.num_tasks > 0:
                    self.learn(context, int(stage.stage_id), int(stage.num_tasks))
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


ledger = Ledger()
stage_tasks = StageTasks()


def answer(query: dict[str, str], scope: str | None) -> dict[str, Any]:
    """The channel's answer to ``GET /invalid`` (``scope`` checked)."""
    return ledger.answer(Report.parse(query, scope))
