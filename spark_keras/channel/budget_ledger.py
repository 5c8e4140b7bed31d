"""On the driver: the invalid rows the tasks of each action report against a
``max_invalid`` limit counted over the whole action (``max_invalid_scope="action"``, see
:mod:`spark_keras.inference.limits`), answered over the driver's channel
(``GET /invalid``, :mod:`.answers`; the worker's side is :mod:`.job_budget`).

The driver registers each budget with its limit as it makes it (:meth:`Ledger.register`;
its tasks report with its own token); ``predict_partition``'s, made in tasks, is
``p.<handle>.<limit>``, reported with the handle's token. A report names the budget, never
its limit (an unknown budget: 404), and carries the task's scope (:func:`.scopes.scope_of`),
stage, partition and attempt, its rows and invalid rows so far, whether its last batch
was scored, and its first reasons: numbers and at most three short strings, in the query
string (never a pickle). Its stage must run now (:mod:`.budget_stages`), its partition
be one of the stage's, and (classic Spark) a job of its scope must run that stage, or it
is refused (409): a token holder files no count for another action or a made-up
partition. One not known yet is not counted (``pending``: a last report asks again, at most
:data:`STAGE_COUNT_WAIT` seconds). Spark Connect tells nothing of a stream's stages: there
a count's reports are not checked, and a fraction counts alone.

Per budget and scope the driver keeps each partition's furthest count in each stage (the
report of any attempt with the most invalid rows, then rows: retries and speculative copies
count once; no more partitions in a stage than it has tasks), their sum per stage, the
partitions of each stage whose last batch was reported, and the first reasons. The
action's count is that of its stage with the most invalid rows (then rows), as they are:
a stage that scores the rows again counts once. A fraction is judged by
:mod:`.budget_fraction`.

Bounds: the counts take at most :data:`MAX_BYTES` (:data:`PARTITION_BYTES` a partition);
to make room the counts of actions that ended (none of their stages runs, no report for
:data:`IDLE` seconds) go, each leaving its verdict (at most :data:`MAX_ENDED`). A count
that finds no room is never reset: its budget counts alone in that action from then on
(``alone``, warned once), as one that cannot be judged does.

Answers (JSON): ``passed`` (the error's text: every report of that budget and scope gets
it from then on), ``pending`` (ask again in that many seconds), ``alone`` (why the driver
cannot judge: the task counts alone), ``reasons`` (whether more first reasons are wanted).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from spark_keras.channel import budget_fraction, budget_stages
from spark_keras.channel.budget_count import (
    COUNT_BYTES,
    PARTITION_BYTES,
    Count,
    Report,
    describe,
    parse_limit,
)
from spark_keras.channel.budget_stages import PENDING_RETRY
from spark_keras.channel.protocol import Refused
from spark_keras.channel.scopes import active_context, in_context
from spark_keras.inference.limits import QUOTED_REASONS

logger = logging.getLogger("spark_keras")

MAX_BYTES = 64 << 20
IDLE = 30.0  # seconds without a report after which an ended action's count may go
ROOM_CHECKS = 16  # idle counts asked of Spark (a JVM call each) per report that needs room
MAX_ENDED = 4096  # verdicts kept of the counts that went
MAX_BUDGETS = 1 << 16  # budgets registered (the least recently used forgotten)
STAGE_COUNT_WAIT = 8.0  # seconds a last report waits for its stage to be known


class Ledger:
    """Every budget's count per scope, on this driver (see the module's text)."""

    def __init__(self, stages: budget_stages.StageTasks | None = None) -> None:
        self._lock = threading.RLock()
        self._stages = stages or budget_stages.stage_tasks
        self._budgets: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._handles: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._counts: collections.OrderedDict[tuple[str, str], Count] = collections.OrderedDict()
        self._ended: collections.OrderedDict[tuple[str, str], Count] = collections.OrderedDict()
        self._bytes = 0
        self._unknown: collections.OrderedDict[tuple[str | None, int], float] = \
            collections.OrderedDict()  # stages not known yet: since when a last report waits
        self._warned: set[tuple[str, str]] = set()
        self._warned_all_invalid: set[tuple[str, str]] = set()
        self.fractions = budget_fraction.Fractions()

    def register(self, key: str, limit: float) -> None:
        """Answer reports of budget ``key``, whose limit is ``limit``."""
        with self._lock:
            self._budgets[key] = limit
            self._budgets.move_to_end(key)
            while len(self._budgets) > MAX_BUDGETS:
                self._budgets.popitem(last=False)

    def limit_of(self, key: str, handle: str | None = None) -> float | None:
        """The limit of budget ``key``: registered here, or, reported with the token of
        ``handle``, its ``predict_partition``'s (``p.<handle>.<limit>``); None: neither."""
        if handle is not None:
            prefix = f"p.{handle}."
            return parse_limit(key[len(prefix):]) if key.startswith(prefix) else None
        with self._lock:
            limit = self._budgets.get(key)
            if limit is not None:
                self._budgets.move_to_end(key)
        return limit

    def answer(self, report: Report, handle: str | None = None) -> dict[str, Any]:
        """The answer to ``report``, sent with the budget's token or ``handle``'s (see
        the module's text)."""
        limit = self.limit_of(report.key, handle)
        if limit is None:
            raise Refused(404, "no max_invalid budget of that name on this driver (another "
                               "driver's, or forgotten)")
        context = active_context()
        scope = in_context(report.scope, context) or report.scope
        where = (report.key, scope)
        with self._lock:  # a verdict stays, whatever the report
            known = self._ended.get(where) or self._counts.get(where)
            if known is not None and (known.passed is not None or known.alone is not None):
                return self._verdict(known, where)
        unchecked = report.scope.startswith("stream:") and budget_stages.classic() is None
        if unchecked and 0 < limit < 1:  # (a count's reports are not checked there)
            return self._alone(where, limit, "Spark Connect reports no stage of a streaming "
                                             "query to its client")
        stage = budget_stages.UNCHECKED if unchecked else self._stages.of(report.stage)
        if stage is None:
            return self._unknown_stage(where, limit, context, report)
        if not stage.runs:
            raise Refused(409, f"stage {report.stage} does not run on this driver now")
        if not 0 <= report.partition < stage.partitions:
            raise Refused(409, f"stage {report.stage} has {stage.partitions} partitions: "
                               f"no partition {report.partition}")
        if stage.scopes is not None and scope not in stage.scopes:
            raise Refused(409, f"stage {report.stage} is not run by {describe(scope)} (or it "
                               f"does not run)")
        with self._lock:
            count = self._counts.get(where)
            if count is None and not self._room(COUNT_BYTES):
                return self._alone(where, limit, "no room for its count")
            if count is None:
                count = self._counts[where] = Count(limit, scope)
                self._bytes += count.nbytes
            self._counts.move_to_end(where)
            count.touched = time.monotonic()
            if count.passed is not None or count.alone is not None:
                return self._verdict(count, where)
            answer = self._count(count, where, report, stage.tasks)
            if answer is not None:
                return answer
            answer = {"reasons": len(count.reasons) < QUOTED_REASONS}
            if not count.fraction:
                if count.over():
                    return {**answer, "passed": self.decide(count, "so far")}
                if report.final and count.every_row_invalid(report.stage, stage.tasks):
                    self.warn_all_invalid(where, count)
                return answer
            return self.fractions.answer(self, count, report, stage, answer)

    def _count(self, count: Count, where: tuple[str, str], report: Report,
               tasks: int) -> dict[str, Any] | None:
        """Add ``report`` to ``count``; an answer if it cannot be (under the lock)."""
        before = count.nbytes
        if count.new_partition(report):
            stage = count.stages.get(report.stage)
            if stage is not None and len(stage.best) >= tasks:
                raise Refused(409, f"stage {report.stage} has {tasks} tasks: partition "
                                   f"{report.partition} is one too many")
            if not self._room(PARTITION_BYTES):
                count.alone = "no room for its count"
                count.compact()
                self._bytes += count.nbytes - before
                return self._verdict(count, where)
        count.add(report)
        self._bytes += count.nbytes - before
        return None

    def decide(self, count: Count, when: str) -> str:
        """``count`` passed (under the lock)."""
        before = count.nbytes
        passed = count.decide(when)
        self._bytes += count.nbytes - before
        return passed

    def count_of(self, key: str, scope: str) -> Count | None:
        """Budget ``key``'s count in ``scope`` (under the lock)."""
        return self._counts.get((key, scope))

    def _room(self, needed: int) -> bool:
        """True if ``needed`` more bytes fit, once the counts of ended actions went (under
        the lock)."""
        if self._bytes + needed <= MAX_BYTES:
            return True
        now, checks = time.monotonic(), ROOM_CHECKS  # under the lock: a bounded number of JVM calls
        for where, count in list(self._counts.items()):  # the least recently reported first
            if self._bytes + needed <= MAX_BYTES or now - count.touched < IDLE or not checks:
                break
            checks -= 1
            if self._stages.runs_any(count.seen):
                continue
            del self._counts[where]
            self._bytes -= count.nbytes
            if count.passed is None and count.alone is None:
                count.alone = "its action had ended: its count went to make room"
            count.compact()
            self._end(where, count)
            self.fractions.forget(where)
        return self._bytes + needed <= MAX_BYTES

    def _end(self, where: tuple[str, str], count: Count) -> None:
        self._ended[where] = count
        while len(self._ended) > MAX_ENDED:
            self._ended.popitem(last=False)

    def _unknown_stage(self, where: tuple[str, str], limit: float, context: str | None,
                       report: Report) -> dict[str, Any]:
        """The answer to a report whose stage is not known yet: not counted; a last
        report waits for it :data:`STAGE_COUNT_WAIT` seconds at most, then counts alone."""
        if not report.final:
            return {"pending": PENDING_RETRY}
        with self._lock:
            since = self._unknown.setdefault((context, report.stage), time.monotonic())
            self._unknown.move_to_end((context, report.stage))
            while len(self._unknown) > budget_stages.StageTasks.KEEP:
                self._unknown.popitem(last=False)
        if time.monotonic() - since <= STAGE_COUNT_WAIT:
            return {"pending": PENDING_RETRY}
        return self._alone(where, limit, f"stage {report.stage} was not known within "
                                         f"{STAGE_COUNT_WAIT:.0f} s", keep=False)

    def _alone(self, where: tuple[str, str], limit: float, why: str,
               keep: bool = True) -> dict[str, Any]:
        """Its tasks count alone: ``why`` (kept as its verdict if ``keep``)."""
        count = Count(limit, where[1])
        count.alone = why
        if keep:
            with self._lock:
                self._end(where, count)
        return self._verdict(count, where)

    def _verdict(self, count: Count, where: tuple[str, str]) -> dict[str, Any]:
        if count.passed is not None:
            return {"reasons": False, "passed": count.passed}
        why = count.alone or "its count went"
        self.warn_alone(where, count.limit, why)
        return {"alone": why}

    def warn_all_invalid(self, where: tuple[str, str], count: Count) -> None:
        """Warn, once per budget and scope, that every row its stage scored was invalid
        (almost never what a user wants; under its limit, nothing else says it)."""
        if _first_time(self._warned_all_invalid, where):
            first = f"; the first: {count.reasons[0]}" if count.reasons else ""
            logger.warning("every row (%d) scored by the tasks of %s was invalid (max_invalid=%r "
                           "let them pass): its predictions are all null%s", count.rows,
                           describe(where[1]), count.limit, first)

    def warn_alone(self, where: tuple[str, str], limit: float, why: str) -> None:
        """Warn, once per budget and scope, that its tasks count alone."""
        if _first_time(self._warned, where):
            logger.warning("max_invalid=%r cannot be judged over %s: %s; its tasks count their "
                           "own rows (max_invalid_scope='task')", limit, describe(where[1]), why)


def _first_time(seen: set[tuple[str, str]], where: tuple[str, str]) -> bool:
    """Whether ``where`` is new to ``seen`` (added; at most :data:`MAX_ENDED` kept)."""
    if where in seen:
        return False
    if len(seen) >= MAX_ENDED:
        seen.clear()
    seen.add(where)
    return True


stage_tasks = budget_stages.stage_tasks
ledger = Ledger()


def answer(query: dict[str, str], scope: str | None, handle: str | None = None) -> dict[str, Any]:
    """The channel's answer to ``GET /invalid`` (``scope`` checked), sent with the
    budget's token or ``handle``'s."""
    return ledger.answer(Report.parse(query, scope), handle)
