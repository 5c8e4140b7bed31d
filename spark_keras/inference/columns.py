"""Every input kind, as one representation: named Arrow columns.

One adapter per source (Arrow arrays, pandas columns and frames, numpy arrays, Python
rows) turns data into :class:`Column` s, zero-copy where the layout allows; then
:func:`assign` decides which columns feed which model input:

* one column per input, in order, or matched by name when the column names are the
  model's input names;
* several scalar columns stacked as the features of a single-input model;
* a struct column (``struct(*cols)``, not an ML Vector) counts as its fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_keras.errors import ModelInputError
from spark_keras.inference.signature import Signature, TensorSpec
from spark_keras.inference.walk import kind


@dataclass(frozen=True)
class Column:
    """One input column: ``name`` for errors and for matching model inputs by name."""

    name: str
    array: pa.Array
    # a block of scalar columns read as one (n, k) array column: their names, for errors
    parts: tuple[str, ...] = ()


# A model input fed by one column, or by scalar columns stacked as its features.
Assigned = tuple[TensorSpec, list[Column]]

# What the engine accepts: columns to assign, or columns already grouped by input name.
Columns = Sequence[Column] | Mapping[str, Sequence[Column]]


def flat(columns: Columns) -> list[Column]:
    """Every column of ``columns``, in order (the groups of a mapping one after another)."""
    if isinstance(columns, Mapping):
        return [c for group in columns.values() for c in group]
    return list(columns) if isinstance(columns, Iterable) else []


# --- adapters ------------------------------------------------------------------------

def from_arrow(names: Sequence[str], arrays: Sequence[pa.Array | pa.ChunkedArray]) -> list[Column]:
    """Arrow arrays (a record batch's columns, an Arrow UDF's arguments)."""
    return [Column(n, a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a)
            for n, a in zip(names, arrays)]


# Arrow types of an ML Vector's fields: a pandas column where every row is null loses it
_VECTOR_FIELD_TYPES = {"type": pa.int8(), "size": pa.int32(), "indices": pa.list_(pa.int32()),
                       "values": pa.list_(pa.float64())}


def pandas_to_arrow(name: str, series: Any) -> pa.Array:
    """A pandas column as Arrow: numbers zero-copy, array cells as lists, a struct (a
    DataFrame, as pandas UDFs receive structs and ML Vectors) as a struct, pyspark ML
    Vector objects as lists. None and ``pd.NA`` become nulls; NaN stays a (NaN) value."""
    if hasattr(type(series), "columns"):  # a DataFrame (checked on the class: fast)
        fields = [str(c) for c in series.columns]
        children = [pandas_to_arrow(f"{name}.{c}", series[c]) for c in series.columns]
        children = [pa.nulls(len(a), _VECTOR_FIELD_TYPES[f])
                    if pa.types.is_null(a.type) and f in _VECTOR_FIELD_TYPES else a
                    for f, a in zip(fields, children)]
        missing = series.isna().all(axis=1).to_numpy()  # a null struct: every field null
        return pa.StructArray.from_arrays(children, names=fields,
                                          mask=pa.array(missing) if missing.any() else None)
    dtype = series.dtype
    if not isinstance(dtype, np.dtype) and getattr(dtype, "kind", "") in "iuf":
        # pandas nullable numbers (Int64, Float32...): pd.NA is a null, not NaN
        return pa.array(series.array)
    values = series.to_numpy()
    if values.dtype.kind in "iuf":  # numbers: zero-copy, NaN stays NaN
        return pa.array(values)
    if values.dtype == object and len(values):
        first = next((v for v in values if v is not None), None)
        if hasattr(first, "toArray"):  # pyspark.ml.linalg vectors
            return _cells_to_arrow(name, [None if v is None else v.toArray() for v in values])
        if isinstance(first, np.ndarray) and first.ndim > 1:
            return _cells_to_arrow(name, list(values))
    try:  # NaN stays NaN (as in Spark and numpy data); None and pd.NA are nulls
        arr = pa.array(series, from_pandas=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        arr = _missing_as_nulls(name, values, exc)
    return arr  # every row missing, or no row: Arrow's null type, read as null rows by any input


def _missing_as_nulls(name: str, values: np.ndarray, exc: Exception) -> pa.Array:
    """An object column of text, bytes or arrays whose missing cells are NaN (as
    ``pd.read_csv`` leaves them): those cells as nulls. NaN is a value only among numbers."""
    missing = np.fromiter((isinstance(v, float) and v != v for v in values), bool, len(values))
    if missing.any() and not missing.all():
        cells = values.copy()
        cells[missing] = None
        try:
            return pa.array(cells, from_pandas=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    types = sorted({type(v).__name__ for v in values if v is not None})
    raise ModelInputError(
        f"column {name!r} cannot be read as one column: it holds values of types "
        f"{', '.join(types[:6])} (a column holds numbers, text, bytes or arrays, not a mix; "
        f"{exc})") from exc


def from_pandas(names: Sequence[str], series: Sequence[Any]) -> list[Column]:
    """pandas Series (or DataFrames, for struct columns), one per name."""
    return [Column(n, pandas_to_arrow(n, s)) for n, s in zip(names, series)]


def from_numpy(arrays: Any, signature: Signature) -> list[Column]:
    """Arrays for the model's inputs: one array (single input), a list in input order or a
    dict keyed by input name. Rows along axis 0; each row is flattened (zero-copy for
    contiguous numeric arrays) and reshaped to the input's shape when read."""
    specs = signature.inputs
    if isinstance(arrays, Mapping):
        missing = [s.name for s in specs if s.name not in arrays]
        if missing:
            raise ModelInputError(f"inputs {missing} missing; the model has inputs "
                                  f"{[s.name for s in specs]}, got {list(arrays)}")
        arrays = [arrays[s.name] for s in specs]
    elif not isinstance(arrays, (list, tuple)):
        arrays = [arrays]
    if len(arrays) != len(specs):
        raise ModelInputError(f"got {len(arrays)} input arrays; the model has inputs "
                              f"{[s.name for s in specs]}")
    return [Column(s.name, _ndarray_to_arrow(s.name, np.asarray(a))) for a, s in zip(arrays, specs)]


def _ndarray_to_arrow(name: str, a: np.ndarray) -> pa.Array:
    if a.ndim == 0:
        raise ModelInputError(f"input {name!r} is a scalar; pass one row per element of axis 0")
    if a.dtype == object:
        return _cells_to_arrow(name, list(a))
    if a.ndim == 1:
        return _arrow_of(name, a)
    flat = np.ascontiguousarray(a).reshape(-1)
    width = int(np.prod(a.shape[1:], dtype=np.int64))
    if width == 0:  # rows of no values (Arrow has no fixed-size list of 0): empty lists,
        offsets = pa.array(np.zeros(len(a) + 1, dtype=np.int32))  # which the input check
        return pa.ListArray.from_arrays(offsets, _arrow_of(name, flat))  # refuses by shape
    return pa.FixedSizeListArray.from_arrays(_arrow_of(name, flat), width)


def _arrow_of(name: str, values: np.ndarray) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise ModelInputError(f"column {name!r} of dtype {values.dtype} cannot be read as "
                              f"numbers: {exc}") from exc


def _cells_to_arrow(name: str, cells: list[Any], first_row: int = 0,
                    where: str = "batch") -> pa.Array:
    """Per-row values (numbers, lists, arrays of any shape, None) as one Arrow column."""
    cells = [c.reshape(-1) if isinstance(c, np.ndarray) and c.ndim > 1 else c for c in cells]
    try:
        # every row None (or no row): of Arrow's null type, which any input reads as null rows
        return pa.array(cells)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
            ValueError):
        pass
    for i, cell in enumerate(cells):  # find the row at fault
        try:
            pa.array([cell])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                ValueError) as exc:
            raise ModelInputError(f"column {name!r}: row {first_row + i} of this {where} cannot "
                                  f"be read as numbers ({type(cell).__name__}: {exc})") from exc
    raise ModelInputError(f"column {name!r}: rows of different kinds (numbers, arrays) in one "
                          f"{where}, first at row {first_row}")


def from_frame(frame: Any, columns: Sequence[Any] | Mapping[str, Sequence[Any]] | Any | None,
               signature: Signature | None) -> Columns:
    """Columns of a pandas DataFrame or an Arrow Table/RecordBatch: ``columns`` names
    them (default: every column), or maps each model input name to its columns. pandas
    labels need not be strings (``pd.DataFrame(array)`` has 0, 1, 2...): the frame is
    indexed by its own labels; names are their ``str()``, for errors and matching. Without
    a ``signature`` (raw columns for a ``preprocess`` function) columns are read one by one,
    and a mapping gives every column it names, once each (the function sees them all)."""
    labels = list(frame.column_names if hasattr(frame, "column_names") else frame.columns)
    by_name = {str(label): label for label in labels}

    def take(given: Sequence[Any]) -> list[Column]:
        absent = [str(c) for c in given if str(c) not in by_name]
        if absent:
            raise ModelInputError(f"column(s) {absent} not in the data; it has {list(by_name)}")
        chosen = [by_name[str(c)] for c in given]
        names = [str(c) for c in chosen]
        if hasattr(frame, "column_names"):
            return from_arrow(names, [frame.column(c) for c in chosen])
        block = _number_block(frame, chosen, signature) if signature is not None else None
        if block is not None:
            return [block]
        return from_pandas(names, [frame[c] for c in chosen])

    if isinstance(columns, Mapping):
        if signature is None:
            # for a preprocess function, which makes the model's inputs itself: every
            # column the mapping names, each once, in the order named
            named = [c for v in columns.values() for c in ([v] if _is_label(v) else list(v))]
            return take(list({str(c): c for c in named}.values()))
        inputs = [s.name for s in signature.inputs]
        if set(columns) != set(inputs):
            raise ModelInputError(f"columns= must map each model input {inputs} to its "
                                  f"columns; got keys {list(columns)}")
        return {k: take([v] if _is_label(v) else list(v)) for k, v in columns.items()}
    if columns is None:
        return take(labels)
    return take([columns] if _is_label(columns) else list(columns))


def _is_label(value: Any) -> bool:
    """One column label (a string, a number...), not a list of them."""
    return isinstance(value, (str, bytes)) or np.isscalar(value)


def from_data(data: Any, columns: Sequence[str] | Mapping[str, Sequence[str]] | str | None,
              signature: Signature) -> Columns:
    """Columns of a pandas DataFrame or an Arrow Table/RecordBatch (see :func:`from_frame`),
    or of numpy arrays (see :func:`from_numpy`; ``columns`` must then be None)."""
    if hasattr(data, "column_names") or (hasattr(data, "columns") and hasattr(data, "iloc")):
        return from_frame(data, columns, signature)
    if columns is not None:
        raise ModelInputError("columns= selects columns of a DataFrame or an Arrow table, "
                              f"not of {type(data).__name__}")
    return from_numpy(data, signature)


def _number_block(frame: Any, labels: list[Any], signature: Signature) -> Column | None:
    """The features of a single-input model, as pandas number columns: one array column
    over the frame's 2-D values (no copy when pandas holds them in one block), whose
    errors still name the column at fault (``parts``). Only plain numpy dtypes: nullable
    columns (``Int64``, ``Float32``, which hold ``pd.NA``) are read column by column."""
    inputs = signature.inputs
    if len(labels) < 2 or len(inputs) != 1 or inputs[0].size != len(labels):
        return None
    selected = frame[labels] if list(frame.columns) != labels else frame
    if not all(isinstance(t, np.dtype) and t.kind in "iuf" for t in selected.dtypes.to_numpy()):
        return None
    names = [str(c) for c in labels]
    values = np.ascontiguousarray(selected.to_numpy())
    flat = pa.array(values.reshape(-1))
    return Column(", ".join(names), pa.FixedSizeListArray.from_arrays(flat, len(names)),
                  tuple(names))


def from_rows(rows: Sequence[Any], signature: Signature, first_row: int = 0) -> list[Column]:
    """Python rows (``rdd.mapPartitions``): a feature array/list/ML Vector, a tuple or Row
    with one value per model input, or a dict keyed by input name."""
    names = [s.name for s in signature.inputs]
    labels = _labels(rows, names)
    if len(names) > 1 and labels != names:  # fields not named as the inputs: in order
        _check_order(labels, names, "fields")
    parts = [_row_parts(row, len(names), names, first_row + i) for i, row in enumerate(rows)]
    return [Column(label, _cells_to_arrow(label, [p[j] for p in parts], first_row, "partition"))
            for j, label in enumerate(labels)]


def _labels(rows: Sequence[Any], input_names: list[str]) -> list[str]:
    """Column names for errors: the Rows' (or dicts') own field names, unless they are
    keyed by the input names (as :func:`_row_parts` then reads them) or are not one per
    input."""
    first: Any = rows[0] if rows else None
    keys = list(first.asDict() if hasattr(first, "asDict") else
                first if isinstance(first, dict) else [])
    if len(keys) != len(input_names) or all(name in keys for name in input_names):
        return input_names
    return [str(k) for k in keys]


def _row_parts(row: Any, n_inputs: int, input_names: Sequence[str], index: int) -> list[Any]:
    if isinstance(row, dict) or hasattr(row, "asDict"):
        mapping = row if isinstance(row, dict) else row.asDict()
        if all(name in mapping for name in input_names):
            return [_cell(mapping[name]) for name in input_names]
        row = list(mapping.values())
    if hasattr(row, "toArray"):  # an ML Vector
        parts = [row]
    elif isinstance(row, (tuple, list)) and n_inputs > 1:
        parts = list(row)
    elif isinstance(row, (tuple, list)) and len(row) == 1 and not np.isscalar(row[0]):
        parts = [row[0]]
    else:
        parts = [row]
    if len(parts) != n_inputs:
        raise ModelInputError(f"row {index} of this partition has {len(parts)} parts; the model "
                              f"has inputs {list(input_names)}")
    return [_cell(p) for p in parts]


def _check_order(names: Sequence[str], input_names: Sequence[str], what: str) -> None:
    """Refuse to feed inputs in order when some of ``names`` (not all) are input names
    and order would feed one of them to another input (inputs ``a, b``, columns ``b, x``)."""
    misplaced = [n for i, n in enumerate(names) if n in input_names and input_names[i] != n]
    if misplaced:
        raise ModelInputError(
            f"{what} {list(names)} name only some of the model's inputs {list(input_names)}, "
            f"and in order {misplaced[0]!r} would feed the input "
            f"{input_names[list(names).index(misplaced[0])]!r}: name every {what[:-1]} as "
            f"its input, or give them in input order")


def _cell(value: Any) -> Any:
    return value.toArray() if hasattr(value, "toArray") else value


# --- columns to model inputs -----------------------------------------------------------

def expand_structs(columns: Iterable[Column]) -> list[Column]:
    """Struct columns (not ML Vectors) as their fields; a null struct nulls every field."""
    out: list[Column] = []
    for col in columns:
        if kind(col.array.type) != "struct":
            out.append(col)
            continue
        arr = col.array
        fields = arr.flatten()  # the struct's offset applied
        if arr.null_count:
            nulls = arr.is_null()
            fields = [pc.if_else(nulls, pa.nulls(len(f), f.type), f) for f in fields]
        out += [Column(f.name, a) for f, a in zip(arr.type, fields)]
    return out


def assign(columns: Columns, signature: Signature) -> list[Assigned]:
    """Which columns feed which model input (see the module docstring)."""
    assigned = _assign(columns, signature)
    every = [c for _, group in assigned for c in group]
    lengths = {len(c.array) for c in every}
    if len(lengths) > 1:
        raise ModelInputError("input columns of different lengths: " + ", ".join(
            f"{c.name!r} has {len(c.array)} rows" for c in every))
    return assigned


def _assign(columns: Columns, signature: Signature) -> list[Assigned]:
    inputs = signature.inputs
    if isinstance(columns, Mapping):
        return [(spec, expand_structs(columns[spec.name])) for spec in inputs]
    given = list(columns)
    cols = expand_structs(given)
    names = [c.name for c in cols]
    input_names = [s.name for s in inputs]
    if not cols:
        raise ModelInputError(f"no input columns given; the model has inputs {input_names}")
    if len(inputs) == 1:
        spec = inputs[0]
        if len(cols) == 1:
            return [(spec, cols)]
        if len(cols) != spec.size:
            raise ModelInputError(
                f"{len(cols)} columns {names} given; the model input {spec.name!r} expects "
                f"{spec.describe()}, i.e. {spec.size} scalar columns, or one array column")
        return [(spec, cols)]
    if sorted(names) == sorted(input_names):
        by_name = {c.name: c for c in cols}
        return [(spec, [by_name[spec.name]]) for spec in inputs]
    if len(cols) == len(inputs):
        _check_order(names, input_names, "columns")
        return [(spec, [c]) for spec, c in zip(inputs, cols)]
    raise ModelInputError(
        f"{len(cols)} column(s) {names} given for a model with {len(inputs)} inputs "
        f"{input_names}: pass one column per input (in order, or named as the inputs)")
