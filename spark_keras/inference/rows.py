"""How errors and reasons name a row: by an id column's value when there is one
(``id_col=``: a record an operator can look up), else by its number in the batch or
partition ("row 10 of this batch")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RowNames:
    """The names of a batch's rows. ``ids``: one value per row (an Arrow array or a
    sequence) of the column ``id_name``; rows are numbered from ``first_row`` within
    ``where`` ("batch", "partition", "input") otherwise. ``positions``: when the rows are
    taken from a larger batch (KeyedModels' rows of one key), each row's number in it."""

    where: str = "batch"
    first_row: int = 0
    id_name: str | None = None
    ids: Any = None
    positions: Any = None

    @classmethod
    def of(cls, where: str = "batch", first_row: int = 0,
           ids: tuple[str, Any] | None = None, positions: Any = None) -> "RowNames":
        """The names for ``ids`` (``(column name, values)``), or by number."""
        id_name, values = ids if ids is not None else (None, None)
        return cls(where, first_row, id_name, values, positions)

    def _number(self, row: int) -> int:
        return self.first_row + (row if self.positions is None else int(self.positions[row]))

    def _id(self, row: int) -> str:
        value = self.ids[row]
        value = value.as_py() if hasattr(value, "as_py") else value  # an Arrow scalar
        if value is None:  # no id to look up: its number, and why
            return f"{self._number(row)} of this {self.where} ({self.id_name} is null)"
        return f"{self.id_name}={value!r}"

    def at(self, row: int) -> str:
        """Row ``row`` of the batch: ``"row id=17"``, ``"row 10 of this batch"``, or
        ``"row 10 of this batch (id is null)"`` for a row whose id is null."""
        if self.ids is not None:
            return f"row {self._id(row)}"
        return f"row {self._number(row)} of this {self.where}"

    def span(self, n: int) -> str:
        """All ``n`` rows of the batch."""
        if self.ids is not None and n:
            return f"rows {self._id(0)} to {self._id(n - 1)}"
        if self.positions is None or not n:
            return f"rows {self.first_row}-{self.first_row + n - 1} of this {self.where}"
        first, last = self._number(0), self._number(n - 1)  # positions ascend
        if last - first == n - 1:
            return f"rows {first}-{last} of this {self.where}"
        shown = ", ".join(str(self._number(row)) for row in range(min(n, 10)))
        return f"rows {shown}{', ...' if n > 10 else ''} of this {self.where}"
