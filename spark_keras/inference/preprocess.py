"""A user's Python preprocessing (decoding, tokenizing...) run in the worker before the
model: ``preprocess=fn`` on :class:`~spark_keras.BroadcastModel`, ``KerasTransformer``,
``spark_keras.dask.ship`` and ``pool_predict``.

``fn(batch)`` receives a pandas DataFrame of the input columns of one batch (binary
values as ``bytes``, strings as ``str``, arrays as numpy arrays, nulls as ``None``) and
returns what the model takes: an array (one input), a list in input order, a dict keyed
by input name, or a DataFrame whose columns feed the inputs as a DataFrame would; one row
per row of the batch. The engine then checks what it returned like any other input, so
``on_invalid`` applies to it. The function travels by value (cloudpickle), so one defined
in the driver's ``__main__`` works in the workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, cast

from spark_keras.errors import ArgumentTypeError, PreprocessError
from spark_keras.inference.isolation import Ranges, columns_text, first_failure, isolate, reason_text
from spark_keras.inference.rows import RowNames

if TYPE_CHECKING:  # pandas and Arrow load where batches are scored, not with every handle
    import pandas as pd  # (the preloading daemon imports handles before Arrow may load)
    import pyarrow as pa

    from spark_keras.inference.columns import Column, Columns
    from spark_keras.inference.specs import Signature


class Preprocess:
    """``fn`` with its name (for errors), pickled by value once, unpickled in a worker
    at first use."""

    def __init__(self, fn: "Callable[[pd.DataFrame], Any]") -> None:
        import cloudpickle

        if not callable(fn):
            raise ArgumentTypeError(f"preprocess must be a function of a pandas DataFrame, "
                                    f"not {type(fn).__name__}")
        self.name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        self._pickled = cloudpickle.dumps(fn)
        self._fn: "Callable[[pd.DataFrame], Any] | None" = fn

    @classmethod
    def of(cls, fn: "Callable[[pd.DataFrame], Any] | Preprocess | None") -> "Preprocess | None":
        """``fn`` wrapped (None stays None)."""
        return fn if fn is None or isinstance(fn, Preprocess) else cls(fn)

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "_pickled": self._pickled, "_fn": None}

    @property
    def fn(self) -> "Callable[[pd.DataFrame], Any]":
        if self._fn is None:
            import pickle

            try:
                self._fn = pickle.loads(self._pickled)
            except Exception as exc:
                raise PreprocessError(f"the preprocess function {self.name} cannot be "
                                      f"unpickled here: {type(exc).__name__}: {exc}") from exc
        return self._fn

    def apply(self, columns: Columns, signature: Signature, names: RowNames | None = None, *,
              failures: dict[int, BaseException] | None = None) -> Columns:
        """The model's input columns made by ``fn`` from ``columns`` (one batch).

        If ``fn`` raises, the batch is retried in parts (:mod:`.isolation`): with
        ``failures`` (a dict) the rows it raises on alone are recorded there (row ->
        exception) and come out as null rows; without it, a :class:`PreprocessError`
        names the first such row."""
        from spark_keras.inference.columns import flat

        every = flat(columns)
        n = len(every[0].array) if every else 0
        as_read = _AsRead(every)

        def call(ranges: Ranges) -> Any:  # one range: isolate is not given a split
            ((a, b),) = ranges
            return self.fn(as_read(a, b))

        try:
            result = self.fn(to_frame(every))
        except Exception as exc:  # a row fn cannot take, perhaps: find it
            if failures is None:
                raise self._raised(call, n, exc, [c.name for c in every],
                                   names or RowNames()) from None
            found = isolate(call, 0, n, exc)
        else:
            return self._made(result, n, signature)
        failures.update(found.failures)
        return _stitched([(a, b, self._made(r, b - a, signature)) for a, b, r in found.parts],
                         n, signature, self._misfit, failures)

    def _made(self, result: Any, n: int, signature: Signature) -> Columns:
        import pandas as pd

        from spark_keras.inference.columns import flat, from_frame, from_numpy

        made = from_frame(result, None, signature) if isinstance(result, pd.DataFrame) \
            else from_numpy(result, signature)
        for col in flat(made):
            if len(col.array) != n:
                raise PreprocessError(
                    f"the preprocess function {self.name} returned {len(col.array)} rows for "
                    f"input {col.name!r}, from a batch of {n} rows: it must return one row per row")
        return made

    def _misfit(self, name: str, kind: pa.DataType, others: pa.DataType) -> PreprocessError:
        """Why rows for which ``fn`` made input ``name`` of type ``kind`` are left out,
        the other rows' being ``others``."""
        return PreprocessError(
            f"the preprocess function {self.name} made input {name!r} of type {kind} for "
            f"these rows, which does not go with the {others} it made for the other rows "
            f"(called on parts of the batch, as it raised on the batch)")

    def _raised(self, call: Callable[[Ranges], Any], n: int, exc: Exception,
                columns: list[Any], names: RowNames) -> PreprocessError:
        """The error naming the first row ``fn`` raises on alone (the batch's rows when
        no single row fails)."""
        first = first_failure(call, 0, n, exc)
        row, cause = first if first is not None else (None, exc)
        rows = names.at(row) if row is not None else names.span(n)
        error = PreprocessError(
            f"the preprocess function {self.name} raised on {rows} "
            f"({columns_text(columns)}): {reason_text(cause)}")
        error.__cause__ = cause
        return error


def _stitched(parts: list[tuple[int, int, Columns]], n: int, signature: Signature,
              misfit: Callable[[str, pa.DataType, pa.DataType], BaseException],
              failures: dict[int, BaseException]) -> Columns:
    """The columns ``fn`` made for the parts of a batch that it did not raise on, put back
    in row order with null rows where it raised (every input null if it raised on all).

    Pieces of different types are put in one column of the type the whole batch would
    have made (:func:`_promoted`: widths relaxed, numbers widened as numpy would); the rows
    of a piece that cannot be (text beside numbers...) are ``failures``, with
    ``misfit(input, its type, the column's type)`` as their exception."""
    import pyarrow as pa

    from spark_keras.inference.columns import Column

    if not parts:
        return [Column(spec.name, pa.nulls(n)) for spec in signature.inputs]
    # the parts are of one kind: _made reads each of fn's results the same way
    first = parts[0][2]
    groups = {key: len(group) for key, group in first.items()} \
        if isinstance(first, Mapping) else None  # (each input's columns, by key)

    def columns(made: Columns) -> list[Column]:
        if isinstance(made, Mapping):
            return [col for key in cast("dict[str, int]", groups) for col in made[key]]
        return list(made)

    pieces = [(a, b, columns(made)) for a, b, made in parts]
    width = len(pieces[0][2])
    kinds = [_common_type([made[i].array.type for a, b, made in
                           sorted(pieces, key=lambda p: p[0] - p[1])])  # most rows first
             for i in range(width)]
    kept: list[tuple[int, int, list[pa.Array]]] = []
    for a, b, made in pieces:
        arrays = [_cast(col.array, kind) for col, kind in zip(made, kinds)]
        wrong = next((i for i, array in enumerate(arrays) if array is None), None)
        if wrong is None:
            kept.append((a, b, arrays))
        else:
            col = made[wrong]
            failures.update(dict.fromkeys(range(a, b),
                                          misfit(col.name, col.array.type, kinds[wrong])))

    def stitch(i: int) -> Column:
        kind, arrays, at = kinds[i], [], 0
        for a, b, made in kept:
            if a > at:
                arrays.append(pa.nulls(a - at, kind))
            arrays.append(made[i])
            at = b
        if at < n:
            arrays.append(pa.nulls(n - at, kind))
        col = pieces[0][2][i]
        return Column(col.name, pa.concat_arrays(arrays), col.parts)

    stitched = [stitch(i) for i in range(width)]
    if groups is None:
        return stitched
    out: dict[str, list[Column]] = {}
    for key, size in groups.items():
        out[key], stitched = stitched[:size], stitched[size:]
    return out


def _cast(array: pa.Array, kind: pa.DataType) -> pa.Array | None:
    """``array`` as ``kind`` if that holds its values (:func:`_promoted`), else None."""
    import pyarrow as pa

    if array.type == kind:
        return array
    if _promoted(array.type, kind) != kind:
        return None
    try:
        return array.cast(kind)  # safe: a value it cannot hold raises
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _common_type(kinds: list[pa.DataType]) -> pa.DataType:
    """The type the pieces' ``kinds`` make together (:func:`_promoted`), leaving out a kind
    that makes none with the ones before it (the first being of the most rows)."""
    out = kinds[0]
    for kind in kinds[1:]:
        out = _promoted(out, kind) or out
    return out


def _promoted(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type holding values of ``a`` and of ``b`` as one numpy array of both would: lists
    of any length where widths differ (fn pads to each call's longest row: the engine then
    reads the lists row by row), numbers of numpy's result type; None if there is none."""
    import numpy as np
    import pyarrow as pa

    if a == b:
        return a
    if pa.types.is_null(a) or pa.types.is_null(b):
        return b if pa.types.is_null(a) else a
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if any(f(a) for f in lists) and any(f(b) for f in lists):
        value = _promoted(a.value_type, b.value_type)
        if value is None:
            return None
        if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b) \
                and a.list_size == b.list_size:
            return pa.list_(value, a.list_size)
        large = pa.types.is_large_list(a) or pa.types.is_large_list(b)
        return pa.large_list(value) if large else pa.list_(value)
    numbers = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    if any(f(a) for f in numbers) and any(f(b) for f in numbers):
        try:
            return pa.from_numpy_dtype(np.result_type(a.to_pandas_dtype(),
                                                      b.to_pandas_dtype()))
        except (TypeError, NotImplementedError, pa.ArrowNotImplementedError):
            return None
    return None


class _AsRead:
    """Rows of a batch for each call of the search, as they were read: a new frame each
    time, which ``fn`` may edit as it likes (``batch["x"] = ...``, even in place). It is a
    deep copy of rows of a frame made when the search starts, which ``fn`` never gets, as
    the frame of ``fn``'s first call was made. pandas' deep copy shares the objects in
    object columns, so in a column holding any cell ``fn`` could edit (a writeable array,
    a dict, an array of arrays: not :func:`_frozen`) each call gets copies of the cells
    (:func:`_fresh`: as writeable as the first call's were). Nothing of this is done
    unless ``fn`` raised."""

    def __init__(self, every: list[Column]) -> None:
        self.every = every
        self.frame: pd.DataFrame | None = None
        self.editable: list[str] = []

    def __call__(self, a: int, b: int) -> pd.DataFrame:
        import numpy as np
        import pandas as pd

        frame = self.frame
        if frame is None:
            self.frame = frame = to_frame(self.every)
            self.editable = [name for name in frame.columns if frame[name].dtype == object
                             and not all(_frozen(v) for v in frame[name])]
        rows = frame.iloc[a:b].copy(deep=True)
        rows.index = pd.RangeIndex(b - a)
        for name in self.editable:
            cells = np.empty(b - a, dtype=object)
            for k, cell in enumerate(frame[name].iloc[a:b]):
                cells[k] = _fresh(cell)
            rows[name] = cells
        return rows


def _frozen(cell: Any) -> bool:
    """Whether ``fn`` cannot edit this cell in place: text, bytes, numbers, dates, None,
    and numpy arrays of such values that are read-only (views of Arrow's buffers)."""
    import datetime
    import decimal

    import numpy as np

    if isinstance(cell, np.ndarray):
        return not cell.flags.writeable and cell.dtype != object
    return cell is None or isinstance(cell, (str, bytes, int, float, complex, np.generic,
                                             datetime.date, datetime.time,
                                             datetime.timedelta, decimal.Decimal))


def _fresh(cell: Any) -> Any:
    """A copy of ``cell`` that ``fn`` may edit without touching ``cell``, each array in it
    as writeable as the one it copies (``fn`` finds read-only what it found read-only)."""
    import copy

    import numpy as np

    if _frozen(cell):
        return cell
    if isinstance(cell, np.ndarray):
        if cell.dtype == object:
            out = np.empty(cell.shape, dtype=object)
            for at, value in np.ndenumerate(cell):
                out[at] = _fresh(value)
        else:
            out = cell.copy()
        out.flags.writeable = cell.flags.writeable
        return out
    if isinstance(cell, dict):
        return {key: _fresh(value) for key, value in cell.items()}
    if isinstance(cell, (list, tuple)):
        return type(cell)(_fresh(value) for value in cell)
    return copy.deepcopy(cell)


def to_frame(columns: Columns) -> pd.DataFrame:
    """Columns as a pandas DataFrame (binary as bytes, strings as str, lists as arrays)."""
    import pandas as pd

    from spark_keras.inference.columns import flat

    every = flat(columns)
    return pd.DataFrame({c.name: c.array.to_pandas(types_mapper=None) for c in every},
                        index=pd.RangeIndex(len(every[0].array) if every else 0))


def columns_of_rows(rows: list[Any]) -> list[Column]:
    """Python rows (``rdd.mapPartitions``) as named columns for ``fn``: a Row's or dict's
    fields, else one column ``value``."""
    import pandas as pd

    from spark_keras.inference.columns import from_pandas

    first = rows[0] if rows else None
    if hasattr(first, "asDict") or isinstance(first, Mapping):
        frame = pd.DataFrame([r.asDict() if hasattr(r, "asDict") else dict(r) for r in rows])
    else:
        frame = pd.DataFrame({"value": pd.Series(rows, dtype=object)})
    return from_pandas([str(c) for c in frame.columns], [frame[c] for c in frame.columns])
