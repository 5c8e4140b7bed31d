"""``--max-invalid`` over a ``--resume`` job: one budget for the job, across its commits
and across the runs that resume it (the committed groups' invalid rows count), not one
per commit.

* **A count** ``N``: each group's Spark job is given what is left of it (``N`` less the
  invalid rows committed so far, by this run and those before), so a group that passes it
  stops within about a batch, as a plain job does; groups in flight together may pass it
  between them, so each commit is checked too: a group whose invalid rows would take the
  committed ones past ``N`` is not committed and the job stops (exit 2). ``0``: no invalid
  row at all, a count.
* **A fraction** ``F``: judged on the job's rows, as a plain job's is on its action's:
  once every group is committed, before ``_SUCCESS`` is written (one group 40% invalid in
  a job 5% invalid passes). A job past it stops (exit 2) without ``_SUCCESS``; its
  committed groups stay, and a rerun judges them again.
"""

from __future__ import annotations

import collections

from spark_keras.errors import InvalidRowsError
from spark_keras.jobs.score.verdict import check_not_all_invalid

__all__ = ["JobBudget"]


def _share(invalid: int, rows: int) -> str:
    return f"{100 * invalid / rows:.2f}%" if rows else "n/a"


class JobBudget:
    """``max_invalid`` (None, a count >= 1 or a fraction in [0, 1), as checked) over the
    groups ``committed`` before this run and those it commits (:meth:`add`)."""

    def __init__(self, max_invalid: float | None, committed: dict[int, dict]) -> None:
        self.max_invalid = max_invalid
        self.rows = sum(int(r["rows"]) for r in committed.values())
        self.invalid = sum(int(r["invalid_rows"]) for r in committed.values())
        self.by_reason: collections.Counter[str] = collections.Counter()
        for record in committed.values():
            self.by_reason.update(record.get("invalid_by_reason", {}))

    @property
    def _count(self) -> bool:
        return self.max_invalid is not None and (self.max_invalid >= 1 or self.max_invalid == 0)

    def action_limit(self) -> float | None:
        """What the next group's Spark job is given: the count left (0: no invalid row at
        all), or None (no budget, or a fraction: judged on the job's rows at its end)."""
        if not self._count:
            return None
        return max(0, int(self.max_invalid) - self.invalid)  # type: ignore[arg-type]

    def check(self, group: int, record: dict) -> None:
        """Raise :class:`InvalidRowsError` if committing ``record`` (group ``group``'s
        figures) would take the committed invalid rows past a count."""
        invalid = self.invalid + int(record["invalid_rows"])
        if self._count and invalid > int(self.max_invalid):  # type: ignore[arg-type]
            rows = self.rows + int(record["rows"])
            raise InvalidRowsError(
                f"--max-invalid {int(self.max_invalid)} passed: {invalid} of {rows} rows "  # type: ignore[arg-type]
                f"({_share(invalid, rows)}) of the job's commits (this run's and those it "
                f"resumes, group {group + 1} with {record['invalid_rows']}) were invalid; "
                f"group {group + 1} is not committed")

    def add(self, record: dict) -> None:
        """Count a committed group."""
        self.rows += int(record["rows"])
        self.invalid += int(record["invalid_rows"])
        self.by_reason.update(record.get("invalid_by_reason", {}))

    def judge(self) -> None:
        """Once every group is committed: raise :class:`InvalidRowsError` if the job's
        invalid rows pass a fraction of its rows, or if every row was invalid without a
        ``--max-invalid`` (:func:`~spark_keras.jobs.score.verdict.check_not_all_invalid`)."""
        check_not_all_invalid(self.rows, self.invalid, self.by_reason, self.max_invalid,
                              "the output stays without _SUCCESS")
        if self.max_invalid is None or self._count:
            return
        if self.invalid > self.max_invalid * self.rows:
            raise InvalidRowsError(
                f"--max-invalid {self.max_invalid:g} passed: {self.invalid} of {self.rows} "
                f"rows ({_share(self.invalid, self.rows)}) of the job's commits (this run's "
                f"and those it resumes) were invalid; the output stays without _SUCCESS")
