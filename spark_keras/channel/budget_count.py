"""One budget's count in one action (its scope), on the driver (:mod:`.budget_ledger`):
per stage, each partition's furthest count (retries and speculative copies count once)
and their sum; the action's count is its largest stage's. Also the reports it counts
(:class:`Report`, parsed from a request's query string: never a pickle)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time

from spark_keras.channel.protocol import Refused
from spark_keras.inference.limits import QUOTED_REASONS, passed_message

PARTITION_BYTES = 256  # a partition's count (measured: ~230 bytes)
COUNT_BYTES = 1024  # a count without its partitions and reasons
REASON_CHARS = 300
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
    final: bool
    reasons: tuple[str, ...] = ()

    @classmethod
    def parse(cls, query: dict[str, str], scope: str | None) -> "Report":
        """The report of a request's ``query`` (``scope`` checked already; a ``limit``
        field is ignored: the driver's decides).

        Raises:
            Refused: 400, a field missing or malformed.
        """
        key, task, counts = query.get("name", ""), query.get("task", ""), query.get("counts", "")
        final = query.get("final", "")
        if scope is None:
            raise Refused(400, "a report names its task's scope (scope=)")
        if not _KEY.fullmatch(key) or not (t := _TASK.fullmatch(task)) \
                or not (c := _COUNTS.fullmatch(counts)) or final not in ("0", "1"):
            raise Refused(400, "a report has name=<budget>, task=<stage>.<partition>.<attempt>, "
                               "counts=<rows>.<invalid>, final=0|1")
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
                   final == "1", reasons)


def parse_limit(text: str) -> float | None:
    """A ``max_invalid`` written as ``repr`` writes it (None if it is not one)."""
    if not _LIMIT.fullmatch(text):
        return None
    value: float = int(text) if text.isdigit() else float(text)
    return value if math.isfinite(value) and (value < 1 or value == int(value)) else None


def describe(scope: str) -> str:
    """A scope as an operator reads it."""
    kind, _, rest = scope.partition(":")
    number = rest.rpartition(":")[2]
    if kind == "stream":
        query, _, batch = rest.rpartition(":")
        return f"micro-batch {batch} of streaming query {query}"
    return f"SQL execution {number}" if kind == "sql" else f"the job of stage {number}"


class _Stage:
    """One budget's count in one stage of an action."""

    __slots__ = ("best", "rows", "invalid", "finals")

    def __init__(self) -> None:
        self.best: dict[int, tuple[int, int]] = {}  # partition -> furthest (rows, invalid) report
        self.rows = self.invalid = 0
        self.finals: set[int] = set()  # partitions whose last batch was reported


class Count:
    """One budget's count in one scope: per stage, the sum of its partitions' furthest
    counts; the action's count is its largest stage's."""

    def __init__(self, limit: float, scope: str) -> None:
        self.limit, self.scope = limit, scope
        self.stages: dict[int, _Stage] = {}
        self.seen: set[int] = set()  # its stages (kept once its partitions go)
        self.partitions = 0
        self.rows = 0  # the rows of the stage with the most invalid rows (then rows)...
        self.invalid = 0  # ... and its invalid rows
        self.reasons: list[str] = []
        self.passed: str | None = None
        self.alone: str | None = None  # why its tasks count alone
        self.touched = time.monotonic()

    @property
    def fraction(self) -> bool:
        return 0 < self.limit < 1

    @property
    def nbytes(self) -> int:
        return COUNT_BYTES + self.partitions * PARTITION_BYTES + sum(map(len, self.reasons))

    def new_partition(self, report: Report) -> bool:
        stage = self.stages.get(report.stage)
        return stage is None or report.partition not in stage.best

    def add(self, report: Report) -> None:
        """Count ``report`` (room for a new partition made already)."""
        stage = self.stages.get(report.stage)
        if stage is None:
            stage = self.stages[report.stage] = _Stage()
            self.seen.add(report.stage)
        old = stage.best.get(report.partition)
        if old is None:
            self.partitions += 1
            old = (0, 0)
        # the furthest report whole (its invalid rows, then its rows): a partition's rows
        # and invalid rows are one report's, never a forged report's rows beside a task's
        # invalid rows
        new = max(old[::-1], (report.invalid, report.rows))[::-1]
        stage.best[report.partition] = new
        stage.rows += new[0] - old[0]
        stage.invalid += new[1] - old[1]
        # one stage's counts, as they are now (a forged report replaced lowers them)
        self.invalid, self.rows = max((s.invalid, s.rows) for s in self.stages.values())
        for reason in report.reasons:
            if len(self.reasons) < QUOTED_REASONS:
                self.reasons.append(reason)
        if report.final:
            stage.finals.add(report.partition)

    def over(self) -> bool:
        if self.limit >= 1 or self.limit == 0:
            return self.invalid > self.limit
        return self.invalid > self.limit * self.rows

    def every_row_invalid(self, stage: int, tasks: int) -> bool:
        """Whether every one of ``tasks`` partitions of ``stage`` reported its last batch,
        some rows, and only invalid ones."""
        found = self.stages.get(stage)
        return found is not None and len(found.finals) >= tasks and 0 < found.rows == found.invalid

    def finals(self, stage: int) -> int:
        found = self.stages.get(stage)
        return 0 if found is None else len(found.finals)

    def decide(self, when: str) -> str:
        """Pass it (its text, kept for every later report); its partitions go."""
        self.passed = passed_message("max_invalid", self.limit, self.invalid, self.rows,
                                     self.reasons, f"scored by the tasks of "
                                     f"{describe(self.scope)} were invalid {when}")
        self.compact()
        return self.passed

    def compact(self) -> None:
        self.stages, self.partitions = {}, 0
