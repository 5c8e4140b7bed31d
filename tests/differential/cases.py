"""A generated case, as data that prints as Python (a shrunk failure pastes into a
regression test as it is): a model :class:`~.recipes.Recipe`, the rows (one cell per
column: Python numbers, lists, strings, bytes, None), the name of a preprocess function
(:data:`PREPROCESS`) and the engine's :class:`Options`.

The preprocess functions are ordinary user functions of a pandas batch: they raise on
some rows, edit their batch in place, return rows of other widths, or pad each call to
its longest row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd
import pyarrow as pa

from tests.differential.recipes import Recipe

MARK = -2.0  # a raw value the preprocess functions refuse (ordinary values lie above it)


@dataclass(frozen=True)
class Options:
    """Every option the engine takes for a batch (``score``'s keywords, ``max_invalid``
    through the per-task budget) and the front-end's conversion of its outputs:
    ``"arrow"`` (Spark), ``"numpy"`` (pools, Dask arrays) or ``"rows"``
    (``rdd.mapPartitions``). ``ids``: one id per row (rows are then named by it)."""

    batch_size: int = 64
    on_invalid: str = "null"
    reasons: bool = True
    where: str = "batch"
    first_row: int = 0
    ids: tuple[Any, ...] | None = None
    buckets: int | tuple[int, ...] | None = None
    max_invalid: float | int | None = None
    frontend: str = "arrow"


@dataclass
class Case:
    recipe: Recipe
    rows: list[list[Any]]
    preprocess: str | None = None
    options: Options = field(default_factory=Options)

    @property
    def n(self) -> int:
        return len(self.rows)

    def columns(self) -> list[tuple[str, str]]:
        """``(name, kind)`` of each raw column: the model's inputs, or the one column a
        preprocess function reads (``raw``)."""
        if self.preprocess is None:
            return list(self.recipe.inputs)
        return [("raw", "tokens" if self.recipe.family == "tokens" else "vector")]

    def arrays(self) -> list[pa.Array]:
        """The raw columns as Arrow arrays."""
        return [column_array([row[j] for row in self.rows], kind)
                for j, (_, kind) in enumerate(self.columns())]

    @property
    def composition(self) -> bool:
        """Whether a call may raise on rows none of which raises alone: a guard of the
        batch's composition, or a preprocess stacking rows of several widths."""
        if self.recipe.composition:
            return True
        if self.preprocess in STACKING:
            widths = {len(r[0]) for r in self.rows if isinstance(r[0], list)}
            return len(widths) > 1
        return False


_TYPES = {"vector": pa.list_(pa.float64()), "features": pa.list_(pa.float64()),
          "sequence": pa.list_(pa.list_(pa.float32())), "steps2": pa.list_(pa.list_(pa.float32())),
          "tokens": pa.list_(pa.int32())}


def column_array(cells: list[Any], kind: str) -> pa.Array:
    """One column's cells as Arrow: text as strings, or binary when a cell is bytes."""
    if kind == "text":
        if any(isinstance(c, bytes) for c in cells):
            return pa.array([c.encode() if isinstance(c, str) else c for c in cells], pa.binary())
        return pa.array(cells, pa.string())
    return pa.array(cells, _TYPES[kind])


# --- preprocess functions --------------------------------------------------------------------

def _row(value: Any) -> np.ndarray:
    """One raw row as floats: a null row and a row holding MARK raise."""
    if value is None:
        raise TypeError("a null row")
    row = np.asarray(value, dtype="float32")
    if (row <= MARK).any():
        raise ValueError(f"refused value {MARK} in a row")
    return row


def doubled(batch: pd.DataFrame) -> np.ndarray:
    """Every value doubled: one array (rows of several widths cannot be stacked: the
    whole call raises, though no row does alone)."""
    return np.stack([_row(v) for v in batch["raw"]]) * 2


def doubled_in_place(batch: pd.DataFrame) -> np.ndarray:
    """:func:`doubled`, the usual pandas way: the batch's column replaced first, then
    read (a row given this twice is doubled twice, and refused past 2 * MARK)."""
    batch["raw"] = batch["raw"].map(lambda v: None if v is None else np.asarray(v, dtype="float32") * 2)
    rows = []
    for v in batch["raw"]:
        if v is None:
            raise TypeError("a null row")
        if (v <= 2 * MARK).any():
            raise ValueError(f"refused value {2 * MARK} in a doubled row")
        rows.append(v)
    return np.stack(rows)


def doubled_rows(batch: pd.DataFrame) -> np.ndarray:
    """:func:`doubled`, one array per row: a row of another width stays so (the engine's
    checks then refuse it)."""
    out = np.empty(len(batch), dtype=object)
    out[:] = [_row(v) * 2 for v in batch["raw"]]
    return out


def padded(batch: pd.DataFrame) -> np.ndarray:
    """Token ids padded with 0 to the call's longest row (one int32 array: its width
    changes from call to call); a null row or id, an empty row or a negative id raises (an
    empty row padded beside longer ones would be a row of padding, no longer empty: the
    engine could not tell, and the oracle, padding each row alone, would differ)."""
    rows = []
    for v in batch["raw"]:
        if v is None:
            raise TypeError("a null row")
        if len(v) == 0:
            raise ValueError("an empty row")
        values = np.asarray(v, dtype="float64")  # (a null id: NaN, as pandas reads it)
        if np.isnan(values).any():
            raise TypeError("a null id")
        ids = values.astype("int32")
        if (ids < 0).any():
            raise ValueError("a negative token id")
        rows.append(ids)
    longest = max((len(r) for r in rows), default=0)
    out = np.zeros((len(rows), longest), dtype="int32")
    for k, r in enumerate(rows):
        out[k, :len(r)] = r
    return out


PREPROCESS: dict[str, Callable[[pd.DataFrame], Any]] = {
    "doubled": doubled, "doubled_in_place": doubled_in_place, "doubled_rows": doubled_rows,
    "padded": padded,
}
STACKING = ("doubled", "doubled_in_place")  # one array of all rows: one width per call
FOR_VECTORS = ("doubled", "doubled_in_place", "doubled_rows")  # dense, one input
FOR_TOKENS = ("padded",)  # tokens, masked, a pooled output (padding changes nothing)
