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

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from ..errors import ArgumentTypeError, PreprocessError

if TYPE_CHECKING:  # pandas and Arrow load where batches are scored, not with every handle
    import pandas as pd  # (the preloading daemon imports handles before Arrow may load)

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

    def apply(self, columns: Columns, signature: Signature, *, where: str = "batch",
              first_row: int = 0) -> Columns:
        """The model's input columns made by ``fn`` from ``columns`` (one batch)."""
        import pandas as pd

        from .columns import from_frame, from_numpy

        frame = to_frame(columns)
        n = len(frame)
        try:
            result = self.fn(frame)
        except Exception as exc:
            raise PreprocessError(
                f"the preprocess function {self.name} raised on rows {first_row}-"
                f"{first_row + n - 1} of this {where}: {type(exc).__name__}: {exc}") from exc
        made = from_frame(result, None, signature) if isinstance(result, pd.DataFrame) \
            else from_numpy(result, signature)
        for col in _flat(made):
            if len(col.array) != n:
                raise PreprocessError(
                    f"the preprocess function {self.name} returned {len(col.array)} rows for "
                    f"input {col.name!r}, from a batch of {n} rows: it must return one row per row")
        return made


def to_frame(columns: Columns) -> pd.DataFrame:
    """Columns as a pandas DataFrame (binary as bytes, strings as str, lists as arrays)."""
    import pandas as pd

    flat = _flat(columns)
    return pd.DataFrame({c.name: c.array.to_pandas(types_mapper=None) for c in flat},
                        index=pd.RangeIndex(len(flat[0].array) if flat else 0))


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


def _flat(columns: Columns) -> list[Column]:
    if isinstance(columns, Mapping):
        return [c for group in columns.values() for c in group]
    return list(columns) if isinstance(columns, Iterable) else []
