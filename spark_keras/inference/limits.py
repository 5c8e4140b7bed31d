"""``max_invalid``: how many invalid rows a task may give before scoring aborts (the
option itself is checked by :func:`.options.check_max_invalid`).

Invalid rows are those the input checks refuse and those the model or the preprocess
function raised on alone (:mod:`.isolation`). A limit of 1 or more is a count, checked
after every batch; a fraction below 1 is checked when the task's last batch is scored,
against all of the task's rows (an early batch with a few bad rows does not abort a task
that would have stayed under it). Counting is per task (a Spark task's partition, a
Dask partition, a ``pool_predict`` call): a limit per query would need a count shared by
every task of a query, which Spark Connect cannot give a Python worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import InvalidRowsError

if TYPE_CHECKING:
    from .engine import Scored

# how many of the first reasons an InvalidRowsError quotes
QUOTED_REASONS = 3


class InvalidBudget:
    """The invalid rows one task has given so far, against ``max_invalid`` (see the module
    docstring). ``add`` each scored batch; ``finish`` after the last."""

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
        raise :class:`InvalidRowsError` once a count limit is passed."""
        if self.limit is None:
            return
        self.rows += scored.rows
        invalid = scored.invalid
        if invalid is None:
            return
        bad = int(np.count_nonzero(invalid))
        if not bad:
            return
        self.invalid += bad
        if len(self.reasons) < QUOTED_REASONS and scored.reasons is not None:
            found = (r for r, b in zip(scored.reasons, invalid) if b and r is not None)
            self.reasons += [r for _, r in zip(range(QUOTED_REASONS - len(self.reasons)), found)]
        if self.limit >= 1 and self.invalid > self.limit:
            raise self._error("so far")

    def finish(self) -> None:
        """Raise :class:`InvalidRowsError` if a fraction limit is passed by the task."""
        if self.limit is not None and self.limit < 1 and self.rows \
                and self.invalid > self.limit * self.rows:
            raise self._error("in all")

    def _error(self, when: str) -> InvalidRowsError:
        share = f"{self.invalid} of {self.rows} rows ({self.invalid / max(self.rows, 1):.2%})"
        first = "; ".join(self.reasons) if self.reasons else "no reasons recorded"
        return InvalidRowsError(f"{self.option}={self.limit!r} passed: {share} of this task "
                                f"were invalid {when}; the first: {first}")
