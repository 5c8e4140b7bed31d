"""``max_invalid``: how many invalid rows scoring may give before it aborts (the option
itself is checked by :func:`.options.check_max_invalid`).

Invalid rows are those the input checks refuse and those the model or the preprocess
function raised on alone (:mod:`.isolation`). A limit of 1 or more is a *count*; a limit
below 1 is a *fraction* of the rows (0: no invalid row at all, judged at the first one).

What the rows are counted over, on Spark (``max_invalid_scope``):

* ``"action"`` (the default): every task of the action (a micro-batch, for streams),
  classic and Spark Connect. Each task reports its rows, invalid rows and first reasons
  to the driver over the driver's channel (:mod:`spark_keras.spark.job_budget`). The
  driver keeps the furthest count of each partition of each stage (a retried task or a
  speculative copy scores a partition again: it counts once) and sums them per stage;
  the action's count is its largest stage's (a sort's sampling job, or a filter on the
  prediction that Spark evaluates twice, scores rows again: they count once). A count is
  passed as soon as that sum passes it: the task whose report passes it fails, and so
  does every later report of the action, so the job aborts within a batch or so (the
  retries Spark makes fail at once). A fraction is judged once every task of a stage
  that scored has reported its last batch, or the stage's other tasks (which do not score
  with it: a ``union``) ended (:mod:`spark_keras.channel.budget_fraction`; Spark's tasks of
  the stage: classic Spark's status tracker; on Connect the execution progress the server
  sends the client every ``spark.connect.progress.reportInterval``, 2 s by default: the
  last tasks of a stage shorter than that wait for it), against the action's rows: one
  bad partition in a clean job passes, the last task of the stage fails when the job is
  over it. The limit is the driver's, registered as it made the budget; reports naming a
  stage that does not run are refused. Where the driver cannot tell (the driver
  unreachable or refusing, a fraction in a stream on Connect, progress that never comes,
  a ledger full: :data:`~spark_keras.channel.budget_ledger.MAX_BYTES`) a task falls back to
  counting alone, as with ``"task"`` (warned once), never to a count started again.
  An action that scores its partitions in several jobs (``take``, ``show``, ``limit``)
  counts its largest job's.
* ``"task"``: each task alone (its partition), with no request to the driver: a count as
  soon as the task passes it, a fraction against all of the task's rows once its last
  batch is scored (an early batch with a few bad rows does not abort a task that would
  have stayed under it).

Elsewhere (a handle used outside a Spark task) the rows of one call are counted, as with
``"task"``. :class:`InvalidBudget` is the task's own count; the Spark front-ends extend
it with the reports to the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from spark_keras.errors import InvalidRowsError

if TYPE_CHECKING:
    from spark_keras.inference.engine import Scored

# how many of the first reasons an InvalidRowsError quotes
QUOTED_REASONS = 3


def passed_message(option: str, limit: float, invalid: int, rows: int, reasons: list[str],
                   where: str) -> str:
    """The text of the :class:`InvalidRowsError` of a passed limit: ``option=limit``, the
    invalid rows of the rows seen ``where`` (``"of this task were invalid so far"``...)
    and the first reasons."""
    share = f"{invalid} of {rows} rows ({invalid / max(rows, 1):.2%})"
    first = "; ".join(reasons) if reasons else "no reasons recorded"
    return f"{option}={limit!r} passed: {share} {where}; the first: {first}"


class InvalidBudget:
    """The invalid rows one task (or call) has given so far, against ``max_invalid`` (see
    the module docstring). ``add`` each scored batch; ``finish`` after the last."""

    def __init__(self, max_invalid: float | int | None, option: str = "max_invalid") -> None:
        self.limit = max_invalid
        self.option = option
        self.rows = 0
        self.invalid = 0
        self.reasons: list[str] = []

    @property
    def active(self) -> bool:
        return self.limit is not None

    def add(self, scored: Scored) -> None:
        """Count a scored batch (its invalid rows and their reasons, when it has them);
        raise :class:`InvalidRowsError` once the limit is passed."""
        if self.limit is None:
            return
        self.rows += scored.rows
        invalid = scored.invalid
        bad = 0 if invalid is None else int(np.count_nonzero(invalid))
        if invalid is not None and bad:
            self.invalid += bad
            if len(self.reasons) < QUOTED_REASONS and scored.reasons is not None:
                found = (r for r, b in zip(scored.reasons, invalid) if b and r is not None)
                self.reasons += [r for _, r in zip(range(QUOTED_REASONS - len(self.reasons)), found)]
        self.check(bad, final=False)

    def finish(self) -> None:
        """After the last batch: raise :class:`InvalidRowsError` if the limit is passed
        (a fraction is judged here)."""
        if self.limit is not None:
            self.check(0, final=True)

    def check(self, new: int, final: bool) -> None:
        """Raise if the limit is passed (``new`` invalid rows were just counted; ``final``:
        the last batch was): here, by this task's rows alone."""
        self.check_alone(final)

    def over_alone(self) -> bool:
        """True if this task's own rows pass a count (or a fraction of 0): then so does
        any count that includes them."""
        assert self.limit is not None
        return (self.limit >= 1 or self.limit == 0) and self.invalid > self.limit

    def check_alone(self, final: bool) -> None:
        """Raise if this task's own rows pass the limit (a fraction only once ``final``)."""
        if self.over_alone():
            raise InvalidRowsError(self.message("so far"))
        assert self.limit is not None
        if final and self.limit < 1 and self.rows and self.invalid > self.limit * self.rows:
            raise InvalidRowsError(self.message("in all"))

    def message(self, when: str) -> str:
        assert self.limit is not None
        return passed_message(self.option, self.limit, self.invalid, self.rows, self.reasons,
                              f"of this task were invalid {when}")
