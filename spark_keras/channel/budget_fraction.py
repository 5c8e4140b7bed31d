"""On the driver: when a fraction ``max_invalid`` (``0 < max_invalid < 1``) counted over an
action is judged (the counts: :mod:`.budget_ledger`).

A fraction is judged on the whole action, at the last report of a task of a stage: once
every task of the stage reported its last batch with that budget, or once every other
task of the stage ended (the stage's completed tasks, :mod:`.budget_stages`): a stage
some of whose tasks do not score with that budget (a ``union`` of scored and unscored
rows, of two ``transform`` calls) is judged on the tasks that did. Only a running task
can fail the action, so when a stage's count is over so far at a task's last report
and no other task scoring with a fraction in that stage is running (each reports as it
begins), that task waits (``pending``) until the stage can be judged, the count is no
longer over, or another such task runs: one task per stage, the first, waits for all of
its budgets, and fails with the first that passed. It waits :data:`HOLD_WAIT` seconds at
most, then counts alone (warned).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from spark_keras.channel.budget_stages import PENDING_RETRY

if TYPE_CHECKING:
    from spark_keras.channel.budget_count import Count, Report
    from spark_keras.channel.budget_stages import Stage



class Ledger(Protocol):
    """What a fraction's judgement uses of the ledger (:class:`.budget_ledger.Ledger`)."""

    def count_of(self, key: str, scope: str) -> Count | None: ...

    def decide(self, count: Count, when: str) -> str: ...

    def warn_alone(self, where: tuple[str, str], limit: float, why: str) -> None: ...


HOLD_WAIT = 60.0  # seconds a task waits for the other tasks of its stage to end
STALE = 5.0  # seconds after which a waiting task that stopped asking waits no more


class _Held:
    """The fraction budgets of one stage of an action."""

    __slots__ = ("keys", "running", "holder", "since", "polled")

    def __init__(self) -> None:
        self.keys: set[str] = set()  # budgets with a count in this stage
        self.running: set[tuple[str, int]] = set()  # (budget, partition): begun, not ended
        self.holder: tuple[str, int] | None = None  # the task that waits
        self.since = self.polled = 0.0


class Fractions:
    """The fraction budgets' stages (under the ledger's lock)."""

    def __init__(self) -> None:
        self._stages: dict[tuple[str, int], _Held] = {}  # (scope, stage)

    def answer(self, ledger: Ledger, count: Count, report: Report, stage: Stage,
               answer: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``report`` (counted in ``count``) of a task of ``stage``."""
        held = self._stages.setdefault((count.scope, report.stage), _Held())
        held.keys.add(report.key)
        me = (report.key, report.partition)
        if not report.final:
            held.running.add(me)
            return answer
        held.running.discard(me)
        counts = [c for key in held.keys if (c := ledger.count_of(key, count.scope)) is not None
                  and c.passed is None and c.alone is None]
        newly = [self._judge(ledger, c, report.stage, stage) for c in counts]
        passed = count.passed or next((p for p in newly if p is not None), None)
        over = [c for c in counts if c.passed is None and c.over()]
        now = time.monotonic()
        if passed is not None or not over or any(p != report.partition for _, p in held.running):
            if held.holder == me:
                held.holder = None
            return answer if passed is None else {**answer, "passed": passed}
        if held.holder not in (None, me) and now - held.polled <= STALE:
            return answer  # another task of the stage waits for it
        if held.holder != me:
            held.holder, held.since = me, now
        held.polled = now
        if now - held.since <= HOLD_WAIT:
            return {**answer, "pending": PENDING_RETRY}
        held.holder = None
        why = f"the other tasks of stage {report.stage} did not end within {HOLD_WAIT:.0f} s"
        ledger.warn_alone((report.key, count.scope), count.limit, why)
        return {"alone": why}

    @staticmethod
    def _judge(ledger: Ledger, count: Count, number: int, stage: Stage) -> str | None:
        """Pass ``count`` if it is over and stage ``number`` can be judged now (the task
        reporting is the only one left)."""
        finals = count.finals(number)
        if not (finals >= stage.tasks or stage.completed + 1 >= stage.tasks) or not count.over():
            return None
        if finals >= stage.tasks:
            return ledger.decide(count, f"in all (the {stage.tasks} tasks of stage {number} scored)")
        return ledger.decide(count, f"in all (the {finals} of the {stage.tasks} tasks of stage "
                                    f"{number} that scored with it)")

    def forget(self, where: tuple[str, str]) -> None:
        """The count of budget and scope ``where`` went."""
        key, scope = where
        for at in [at for at in self._stages if at[0] == scope]:
            held = self._stages[at]
            held.keys.discard(key)
            held.running = {r for r in held.running if r[0] != key}
            if not held.keys:
                del self._stages[at]
