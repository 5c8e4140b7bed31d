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

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

from ..errors import ArgumentTypeError, PreprocessError
from .isolation import Ranges, columns_text, first_failure, isolate, reason_text
from .rows import RowNames

if TYPE_CHECKING:  # pandas and Arrow load where batches are scored, not with every handle
    import pandas as pd  # (the preloading daemon imports handles before Arrow may load)
    import pyarrow as pa

    from .columns import Column, Columns
    from .specs import Signature


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
        from .columns import flat

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
                         n, signature)

    def _made(self, result: Any, n: int, signature: Signature) -> Columns:
        import pandas as pd

        from .columns import flat, from_frame, from_numpy

        made = from_frame(result, None, signature) if isinstance(result, pd.DataFrame) \
            else from_numpy(result, signature)
        for col in flat(made):
            if len(col.array) != n:
                raise PreprocessError(
                    f"the preprocess function {self.name} returned {len(col.array)} rows for "
                    f"input {col.name!r}, from a batch of {n} rows: it must return one row per row")
        return made

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


def _stitched(parts: list[tuple[int, int, Columns]], n: int, signature: Signature) -> Columns:
    """The columns ``fn`` made for the parts of a batch that it did not raise on, put back
    in row order with null rows where it raised (every input null if it raised on all)."""
    import pyarrow as pa

    from .columns import Column

    if not parts:
        return [Column(spec.name, pa.nulls(n)) for spec in signature.inputs]

    def stitch(j: int, pieces: list[tuple[int, int, Sequence[Column]]]) -> Column:
        col = pieces[0][2][j]
        # pieces of different widths (fn pads to each call's longest row): lists of any
        # length, which the engine then reads row by row like any list column
        kind = col.array.type
        if any(made[j].array.type != kind for _, _, made in pieces):
            kind = _any_length(kind)
        arrays, at = [], 0
        for a, b, made in pieces:
            if a > at:
                arrays.append(pa.nulls(a - at, kind))
            array = made[j].array
            arrays.append(array if array.type == kind else array.cast(kind))
            at = b
        if at < n:
            arrays.append(pa.nulls(n - at, kind))
        return Column(col.name, pa.concat_arrays(arrays), col.parts)

    # the parts are of one kind: _made reads each of fn's results the same way
    first = parts[0][2]
    if isinstance(first, Mapping):
        maps = [(a, b, cast("Mapping[str, Sequence[Column]]", made)) for a, b, made in parts]
        return {key: [stitch(j, [(a, b, m[key]) for a, b, m in maps])
                      for j in range(len(group))] for key, group in first.items()}
    lists = [(a, b, cast("Sequence[Column]", made)) for a, b, made in parts]
    return [stitch(j, lists) for j in range(len(first))]


def _any_length(kind: pa.DataType) -> pa.DataType:
    """``kind`` with each fixed-size list (at any depth) a list of any length."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(kind) or pa.types.is_list(kind):
        return pa.list_(_any_length(kind.value_type))
    if pa.types.is_large_list(kind):
        return pa.large_list(_any_length(kind.value_type))
    return kind


class _AsRead:
    """Rows of a batch for each call of the search, as they were read: a new frame each
    time, which ``fn`` may edit as it likes (``batch["x"] = ...``, even in place). It is a
    deep copy of rows of a frame made when the search starts, which ``fn`` never gets
    (cheap: bytes and text are shared, being immutable, and so are lists of numbers, which
    pandas gets as read-only views); columns whose cells pandas makes mutable (structs as
    dicts, nested lists as object arrays) are made anew from Arrow."""

    def __init__(self, every: list[Column]) -> None:
        self.every = every
        self.frame: pd.DataFrame | None = None
        self.anew = [c for c in every if not _immutable_cells(c.array.type)]

    def __call__(self, a: int, b: int) -> pd.DataFrame:
        import pandas as pd

        if self.frame is None:
            self.frame = to_frame(self.every)
        rows = self.frame.iloc[a:b].copy(deep=True)
        rows.index = pd.RangeIndex(b - a)
        for c in self.anew:
            rows[c.name] = c.array.slice(a, b - a).to_pandas(types_mapper=None)
        return rows


def _immutable_cells(kind: pa.DataType) -> bool:
    """Whether pandas holds this Arrow type's values as nothing ``fn`` can edit in place
    once copied: numbers, text, bytes, dates, and lists of them (read-only array views)."""
    import pyarrow as pa

    if not pa.types.is_nested(kind):
        return True
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind) \
        or pa.types.is_fixed_size_list(kind)
    return listed and not pa.types.is_nested(kind.value_type)


def to_frame(columns: Columns) -> pd.DataFrame:
    """Columns as a pandas DataFrame (binary as bytes, strings as str, lists as arrays)."""
    import pandas as pd

    from .columns import flat

    every = flat(columns)
    return pd.DataFrame({c.name: c.array.to_pandas(types_mapper=None) for c in every},
                        index=pd.RangeIndex(len(every[0].array) if every else 0))


def columns_of_rows(rows: list[Any]) -> list[Column]:
    """Python rows (``rdd.mapPartitions``) as named columns for ``fn``: a Row's or dict's
    fields, else one column ``value``."""
    import pandas as pd

    from .columns import from_pandas

    first = rows[0] if rows else None
    if hasattr(first, "asDict") or isinstance(first, Mapping):
        frame = pd.DataFrame([r.asDict() if hasattr(r, "asDict") else dict(r) for r in rows])
    else:
        frame = pd.DataFrame({"value": pd.Series(rows, dtype=object)})
    return from_pandas([str(c) for c in frame.columns], [frame[c] for c in frame.columns])
