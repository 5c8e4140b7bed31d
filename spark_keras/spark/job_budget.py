"""``max_invalid`` over every task of an action (``max_invalid_scope="action"``; what the
limit means: :mod:`spark_keras.inference.limits`): made on the driver, carried in the
plan, counted in the tasks and reported to the driver's ledger (:mod:`.budget_ledger`).

On the driver :func:`limit_for` turns ``max_invalid`` into an :class:`ActionLimit`: the
limit, a key of its own (one per ``transform`` or UDF column), registered with its limit
in the driver's ledger, and the address of the driver's channel with a token for that
budget alone (its host, port, token and certificate fingerprint: it travels in the plan
as the handle's does, :mod:`.channel_client`). ``predict_partition``'s budget is made in
the task (:func:`partition_limit`): ``p.<handle>.<limit>``, reported with the handle's
token. In a task :func:`budget_of` makes the task's :class:`ActionBudget`, which counts
the task's rows as :class:`~spark_keras.inference.limits.InvalidBudget` does and reports
them:

* for a count, after a batch with new invalid rows, at most every :data:`REPORT_EVERY`
  seconds (the rows not reported then go with the next batch, or the last), and at once
  when the task's own rows pass it; for a fraction, as the task begins; after the last
  batch in any case (a fraction's verdict may make the task wait for the other tasks of
  its stage: :data:`VERDICT_WAIT` at most);
* the driver's ``passed`` answer raises :class:`~spark_keras.errors.InvalidRowsError`
  with its text (the action's counts and first reasons);
* a driver that cannot be reached, or that cannot judge (``alone``), leaves the task
  counting its own rows (warned once per process and budget); a driver that refuses the
  report (a partition or stage not the task's, a forgotten budget: a token holder's
  forged reports may be why) fails the task, which never counts alone then.

A task reports nothing when ``max_invalid`` is None or counted per task, and otherwise
nothing but its last report (and a fraction's first) while it meets no invalid row.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from typing import Any, Union

from spark_keras.channel import (
    budget_count,
    budget_fraction,
    budget_ledger,
    budget_stages,
)
from spark_keras.channel import (
    client as channel_client,
)
from spark_keras.errors import ArgumentError, ChannelError, InvalidRowsError, SparkKerasError
from spark_keras.inference.limits import InvalidBudget

logger = logging.getLogger("spark_keras")

SCOPES = ("action", "task")
REPORT_EVERY = 0.25
VERDICT_WAIT = budget_fraction.HOLD_WAIT + 2 * budget_ledger.STAGE_COUNT_WAIT
_REASONS_BYTES = 3000  # of a report's reasons, URL-encoded (a request head is 8 KiB at most)
_warned: set[str] = set()


@dataclasses.dataclass(frozen=True)
class ActionLimit:
    """``max_invalid`` counted over every task of an action: ``limit``, the budget's
    ``key`` and where the driver's ledger answers (``address``)."""

    limit: float
    key: str
    address: Any  # channel_client.Address


MaxInvalid = Union[float, ActionLimit, None]


def check_scope(scope: Any) -> str:
    """``max_invalid_scope``: ``"action"`` or ``"task"``."""
    if scope not in SCOPES:
        raise ArgumentError(f"max_invalid_scope must be 'action' (every task of the action "
                            f"or micro-batch) or 'task' (each task alone), not {scope!r}")
    return scope


def limit_for(handle: Any, max_invalid: float | None, scope: str = "action",
              session: Any = None) -> MaxInvalid:
    """``max_invalid`` (checked) as the plan carries it, on the driver: under
    ``scope="action"``, where a driver's channel answers (the handle's, or this
    process's), a new budget registered with its limit (:class:`ActionLimit`), else the
    number (counted per task). ``session``: the DataFrame's, whose stages the driver
    checks reports against (Spark Connect: its progress is watched)."""
    check_scope(scope)
    if max_invalid is None or scope == "task":
        return max_invalid
    from spark_keras.channel import version_server
    from spark_keras.channel.credentials import budget_scope

    server = getattr(handle, "_server", None) or version_server._server
    if server is None or server.closed:
        return max_invalid
    key = uuid.uuid4().hex
    budget_ledger.ledger.register(key, max_invalid)
    _watch_stages(session)
    return ActionLimit(max_invalid, key, server.address_for(budget_scope(key)))


def partition_limit(handle: Any, max_invalid: float | None, scope: str = "action") -> MaxInvalid:
    """``max_invalid`` of ``handle``'s ``predict_partition`` (checked), in a task: every
    task of the action that scores with this handle and limit counts together
    (``p.<handle>.<limit>``, reported with the handle's token); a handle without a
    driver's channel counts each task alone."""
    check_scope(scope)
    address, name = getattr(handle, "_versions", None), getattr(handle, "_name", None)
    if max_invalid is None or scope == "task" or address is None or name is None:
        return max_invalid
    return ActionLimit(max_invalid, f"p.{name}.{max_invalid!r}", address)


def _watch_stages(session: Any) -> None:
    """Have the ledger learn the stages of ``session`` if it is a Spark Connect session
    (None: Connect's default session, if any): classic Spark's it asks at need."""
    import sys

    from spark_keras.channel.scopes import default_connect_session
    from spark_keras.executor.transport import is_connect

    if session is None:
        connect = sys.modules.get("pyspark.sql.connect.session")
        session = None if connect is None else default_connect_session(connect.SparkSession)
    if session is not None and "pyspark.sql.connect.session" in sys.modules \
            and is_connect(session):
        budget_stages.stage_tasks.watch(session)


def budget_of(max_invalid: MaxInvalid) -> InvalidBudget:
    """The running task's budget for ``max_invalid`` (outside a Spark task, or counted per
    task: its own count)."""
    if not isinstance(max_invalid, ActionLimit):
        return InvalidBudget(max_invalid)
    from pyspark import TaskContext

    from spark_keras.executor.task_version import task_scope

    context = TaskContext.get()
    in_task, scope = task_scope()
    if context is None or not in_task or scope is None:
        return InvalidBudget(max_invalid.limit)
    budget = ActionBudget(max_invalid, scope, context.stageId(), context.partitionId(),
                          context.attemptNumber())
    budget.check(0, final=False)  # a fraction reports as it begins
    return budget


class ActionBudget(InvalidBudget):
    """A task's count of invalid rows, reported to the driver's ledger (see the module's
    text)."""

    def __init__(self, spec: ActionLimit, scope: str, stage: int, partition: int,
                 attempt: int) -> None:
        super().__init__(spec.limit)
        self._spec, self._scope = spec, scope
        self._task = f"{stage}.{partition}.{attempt}"
        self._last = -float("inf")  # when the last report was sent
        self._unsent = False  # invalid rows counted since
        self._reasons_sent = 0
        self._reasons_wanted = True
        self._alone = False
        self._begun = not 0 < spec.limit < 1  # a fraction's task reports as it begins

    def check(self, new: int, final: bool) -> None:
        if self._alone:
            return self.check_alone(final)
        self._unsent = self._unsent or bool(new)
        over = self.over_alone()
        counted = not 0 < self._spec.limit < 1  # a fraction is judged on last batches only
        if not (final or over or (time.monotonic() - self._last >= REPORT_EVERY
                                  and (not self._begun or (counted and self._unsent)))):
            return None
        answer = self._report(final)
        waited = time.monotonic()
        while answer is not None and answer.get("pending") and final \
                and time.monotonic() - waited < VERDICT_WAIT:
            time.sleep(min(float(answer["pending"]), 2.0))
            answer = self._report(final)
        if answer is not None and answer.get("passed"):
            raise InvalidRowsError(str(answer["passed"]))
        if answer is None or answer.get("alone") or (final and answer.get("pending")):
            self._alone = True
            return self.check_alone(final)
        self._begun = self._begun or not answer.get("pending")  # (else: not counted yet)
        if over:  # the driver counted less than this task alone: it cannot be
            raise InvalidRowsError(self.message("so far"))
        return None

    def _report(self, final: bool) -> dict[str, Any] | None:
        """The driver's answer to this task's counts; None (warned once) if it cannot be
        reached."""
        fields = {"name": self._spec.key, "scope": self._scope, "task": self._task,
                  "counts": f"{self.rows}.{self.invalid}", "final": "1" if final else "0"}
        reasons = self.reasons[self._reasons_sent:] if self._reasons_wanted else []
        if reasons:
            fields["reasons"] = _reasons_field(reasons)
        try:
            answer = channel_client.report(self._spec.address, fields)
        except ChannelError as exc:
            if self._spec.key not in _warned:
                _warned.add(self._spec.key)
                logger.warning("cannot report invalid rows to the driver (%s): this task counts "
                               "its own rows against max_invalid=%r", exc, self.limit)
            return None
        except SparkKerasError as exc:  # refused: a forger's reports may be why, never alone
            raise SparkKerasError(f"the driver refused this task's report of its invalid rows "
                                  f"against max_invalid={self.limit!r} counted over the action "
                                  f"({exc}); the task does not count its rows alone instead "
                                  f"(max_invalid_scope='task' does)") from exc
        self._last = time.monotonic()
        if not answer.get("pending"):  # counted (else sent again)
            self._unsent, self._reasons_sent = False, len(self.reasons)
            self._reasons_wanted = bool(answer.get("reasons", True))
        return answer


def _reasons_field(reasons: list[str]) -> str:
    """``reasons`` as a report carries them: JSON, each cut to what the driver keeps,
    fewer or shorter if that is too long for a request."""
    cut = budget_count.REASON_CHARS
    while True:
        text = json.dumps([r[:cut] for r in reasons])
        if len(text.encode()) * 3 <= _REASONS_BYTES or cut <= 40:  # URL-encoded, at most 3x
            return text
        cut //= 2
