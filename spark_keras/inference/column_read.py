"""The read of one Arrow input column for one model input (:class:`ColumnRead`: its
values and the rows that cannot be scored, each with its :class:`Problem`), the kinds of
column there are (:func:`kind`), and the null and row helpers the readers share.

The readers are :mod:`.walk` (numbers, nested lists, ML Vectors; it dispatches by kind)
and :mod:`.images` (rows of Spark's image data source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from spark_keras.errors import ModelInputError
from spark_keras.inference.rows import RowNames
from spark_keras.inference.specs import TensorSpec

VECTOR_FIELDS = frozenset({"type", "size", "indices", "values"})
IMAGE_FIELDS = frozenset({"height", "width", "nChannels", "mode", "data"})  # Spark's image rows
NULL_POLICY_HINT = "on_invalid='null' gives such rows a null prediction"


def kind(t: pa.DataType) -> str:
    """``"list"``, ``"vector"`` (an ML Vector), ``"image"`` (a row of Spark's image data
    source), ``"struct"``, ``"number"``, ``"string"``
    (text or binary: both feed ``tf.string`` inputs) or ``"other"``."""
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_struct(t):
        if {f.name for f in t} >= VECTOR_FIELDS:
            return "vector"
        return "image" if {f.name for f in t} >= IMAGE_FIELDS else "struct"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "string"
    return "other"


def leaf_kind(spec: TensorSpec) -> str:
    """The kind of value an input takes: ``"string"`` for ``tf.string`` inputs (text or
    bytes), else ``"number"``."""
    return "string" if spec.dtype == "string" else "number"


# the classes of input problems (a reason's class is ``"input: <kind>"``, see
# :meth:`ColumnRead.reason_class`)
NULL, NAN, SHAPE = "null", "NaN", "shape"
IMAGE_MODE, IMAGE_DATA, IMAGE_SIZE = "image mode", "image data", "image size"


@dataclass
class Problem:
    """One way rows of a column cannot be scored: which rows, how to say it for one, and
    its class (``kind``: :data:`NULL`, :data:`NAN`, :data:`SHAPE`, an image's...)."""

    rows: np.ndarray  # bool, True = this problem affects the row
    describe: Callable[[int, str], str]  # (row index, "row 5 of this batch") -> text
    kind: str


@dataclass
class ColumnRead:
    """The result of reading one column for one model input."""

    name: str
    spec: TensorSpec
    n: int
    leaf: np.ndarray  # flat values (a view of the Arrow buffers where possible)
    starts: np.ndarray | None  # first value of each row in ``leaf``; None: row i at i * size
    problems: list[Problem] = field(default_factory=list)
    column_note: str = ""  # appended to row errors (e.g. "expects 3 features")
    parts: tuple[str, ...] = ()  # the scalar columns this one stands for (a block of them)
    # (rows, ndim) per-row shapes, for an input with unknown dimensions (``spec.variable``)
    shapes: np.ndarray | None = None

    @property
    def invalid(self) -> np.ndarray | None:
        """True for rows that cannot be scored; None when every row is valid."""
        if not self.problems:
            return None
        mask = self.problems[0].rows.copy()
        for p in self.problems[1:]:
            mask |= p.rows
        return mask if mask.any() else None

    def values(self, keep: np.ndarray | None = None) -> np.ndarray:
        """``(rows, *spec.shape)`` for all rows, or the rows where ``keep`` is True, cast to
        the input dtype (zero-copy when every row is kept and the layout allows)."""
        if self.shapes is not None:
            return self._rows(keep)
        # no per-row shapes: the input's dimensions are all known
        shape = self.spec.known_shape
        size = math.prod(shape)
        if self.starts is None:
            flat = self.leaf[: self.n * size].reshape((self.n, size))
            if keep is not None:
                flat = flat[keep]
        else:
            flat = _rows_at(self.leaf, self.starts if keep is None else self.starts[keep], size)
        flat = flat.reshape((len(flat), *shape))
        return flat if leaf_kind(self.spec) == "string" else flat.astype(self.spec.dtype, copy=False)

    def _rows(self, keep: np.ndarray | None) -> np.ndarray:
        """An input with unknown dimensions: an object array of one array per row, each of
        its own shape (views of the column's values, not yet cast: rows of one shape are
        stacked and cast together when the model is called)."""
        shapes, starts = self.shapes, self.starts
        assert shapes is not None and starts is not None  # rows of their own shapes have starts
        rows = np.flatnonzero(keep) if keep is not None else np.arange(self.n)
        out = np.empty(len(rows), dtype=object)
        for k, r in enumerate(rows):
            shape = tuple(int(d) for d in shapes[r])
            start = int(starts[r])
            out[k] = self.leaf[start:start + math.prod(shape)].reshape(shape)
        return out

    def _culprit(self, row: int) -> str:
        return _culprit_in(self, row) if self.parts else self.name

    def _what(self, row: int, names: RowNames) -> str:
        """What is wrong with the invalid ``row``: its column and the first problem."""
        problem = next(p for p in self.problems if p.rows[row])
        return f"column {self._culprit(row)!r}: {problem.describe(row, names.at(row))}"

    def _expected(self) -> str:
        return (f"the model input {self.spec.name!r} expects {self.spec.describe()} "
                f"per row{self.column_note}")

    def error(self, names: RowNames) -> ModelInputError:
        """The error for this column's first invalid row (call when :attr:`invalid`),
        named as ``names`` name it."""
        mask = self.invalid
        assert mask is not None
        row = int(np.argmax(mask))
        count = int(mask.sum())
        return ModelInputError(
            f"{self._what(row, names)} ({count} invalid row(s) in this {names.where}); "
            f"{self._expected()} ({NULL_POLICY_HINT})")

    def reason(self, row: int, names: RowNames) -> str:
        """Why the invalid ``row`` cannot be scored, in the words of :meth:`error` (the
        column, what is wrong, what the input expects), for ``on_invalid="null"``."""
        return f"{self._what(row, names)}; {self._expected()}"

    def reason_class(self, row: int) -> str:
        """The class of :meth:`reason` (``"input: NaN"``): what is wrong, without where."""
        return f"input: {next(p for p in self.problems if p.rows[row]).kind}"


def _rows_at(leaf: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """``(len(starts), size)``: the ``size`` values from each start, copied run by run
    (rows that follow each other in ``leaf`` are one slice), so the peak is the result
    itself, not an index as large as it."""
    out = np.empty((len(starts), size), dtype=leaf.dtype)
    for a, b, first in runs(starts, size):
        out[a:b] = leaf[first:first + (b - a) * size].reshape((b - a, size))
    return out


def runs(starts: np.ndarray, size: int) -> Iterator[tuple[int, int, int]]:
    """``(a, b, first)`` per run of rows ``a:b`` of ``size`` values each that follow each
    other in the buffer from ``first`` (rows given by their ``starts``): one slice each."""
    if not len(starts):
        return
    breaks = np.flatnonzero(np.diff(starts) != size) + 1
    for a, b in zip(np.concatenate(([0], breaks)), np.concatenate((breaks, [len(starts)]))):
        yield int(a), int(b), int(starts[a])


def _culprit_in(read: "ColumnRead", row: int) -> str:
    """The column of a block (``parts``) whose value in ``row`` is not a finite number."""
    size = read.spec.size
    assert size is not None  # a block of scalar columns has a fixed size
    start = int(read.starts[row]) if read.starts is not None else row * size
    values = read.leaf[start:start + size]
    bad = np.flatnonzero(~np.isfinite(values)) if values.dtype.kind == "f" else np.zeros(0, int)
    return read.parts[int(bad[0])] if len(bad) else read.name


def _all_finite(values: np.ndarray) -> bool:
    """Whether every value is a finite number, without a temporary array as large as
    ``values`` (NaN propagates through min and max, an infinity is one of them): under
    Dask, whose workers hand large blocks back to the OS at once, each such temporary
    costs page faults (3 ms for 50,000 x 64 float32 values)."""
    if values.dtype.kind != "f" or values.size == 0:
        return True
    return bool(np.isfinite(values.min()) and np.isfinite(values.max()))


def nonfinite_mask(leaf: np.ndarray, arr: pa.Array) -> np.ndarray | None:
    """The NaN/infinite values of ``leaf`` (``arr`` as numpy), None when there are none;
    nulls, which numpy reads as NaN, are not counted (they are a problem of their own)."""
    if _all_finite(leaf):
        return None
    nonfinite = ~np.isfinite(leaf)
    if arr.null_count:
        nonfinite &= ~nulls(arr)
    return nonfinite


def describe_nonfinite(row: int, at: str) -> str:
    """:attr:`Problem.describe` of rows holding NaN or infinity."""
    return f"NaN or infinite value(s), first at {at}"


def any_in(flags: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """For each row's range [lo, hi) of elements: is any flag set?"""
    counts = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    return counts[hi] > counts[lo]


def nulls(arr: pa.Array) -> np.ndarray:
    """True for the null elements of ``arr`` (a numpy bool array)."""
    return np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def null_rows(arr: pa.Array) -> list[Problem]:
    """The problem of null rows, if ``arr`` has any."""
    if not arr.null_count:
        return []
    return [Problem(nulls(arr), lambda r, at: f"null value(s), first at {at}", NULL)]
