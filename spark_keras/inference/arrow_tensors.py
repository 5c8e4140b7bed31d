"""Arrow columns to model input tensors and model outputs back to Arrow, without per-row
Python objects. Input problems raise :class:`ModelInputError` naming the column, the row
within the batch, the expected shape/dtype and what arrived.

Accepted input columns:
* a scalar numeric column (one feature, or several stacked when the model has one input);
* an array column (``array<float>``, nested ``array<array<...>>``, fixed-size lists),
  reshaped to the model input's shape;
* a ``pyspark.ml.linalg`` Vector column (its Arrow form: struct of type/size/indices/values),
  dense or sparse.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ModelInputError
from .signature import Signature, TensorSpec

_VECTOR_FIELDS = {"type", "size", "indices", "values"}


def _first_null(arr: pa.Array) -> int:
    mask = np.asarray(arr.is_null().to_numpy(zero_copy_only=False))
    return int(np.argmax(mask))


def _kind(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return "list"
    if pa.types.is_struct(t) and {f.name for f in t} >= _VECTOR_FIELDS:
        return "vector"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    return "other"


def _leaf_type(t: pa.DataType) -> pa.DataType:
    """The element type under any nesting of lists (a Vector's values: float64)."""
    if _kind(t) == "vector":
        t = t.field("values").type
    while _kind(t) == "list":
        t = t.value_type
    return t


def _check_no_nulls(name: str, arr: pa.Array, spec: TensorSpec, where: str = "") -> None:
    if arr.null_count:
        raise ModelInputError(
            f"column {name!r}{where}: {arr.null_count} null value(s), first at row "
            f"{_first_null(arr)} of this batch; the model input {spec.name!r} expects "
            f"{spec.describe()} per row with no nulls")


def _numbers(name: str, arr: pa.Array, spec: TensorSpec) -> np.ndarray:
    if _kind(arr.type) != "number":
        raise ModelInputError(
            f"column {name!r} has type {arr.type}; the model input {spec.name!r} expects "
            f"numbers ({spec.describe()} per row)")
    return arr.to_numpy(zero_copy_only=False)


def _list_values(name: str, arr: pa.Array, spec: TensorSpec) -> tuple[np.ndarray, int]:
    """Flatten (nested) list arrays checking every row has the same length; returns the
    flat values and the per-row element count."""
    n = len(arr)
    per_row = 1
    level = 0
    while _kind(arr.type) == "list":
        where = f" (nesting level {level})" if level else ""
        _check_no_nulls(name, arr, spec, where)
        if pa.types.is_fixed_size_list(arr.type):
            width = arr.type.list_size
            start = arr.offset * width
            values = arr.values.slice(start, len(arr) * width)
        else:
            offsets = arr.offsets.to_numpy()
            lengths = np.diff(offsets)
            width = int(lengths[0]) if len(lengths) else 0
            bad = np.flatnonzero(lengths != width)
            if bad.size:
                raise ModelInputError(
                    f"column {name!r}{where}: ragged arrays, row 0 has {width} elements but "
                    f"row {int(bad[0])} of this batch has {int(lengths[bad[0]])}; the model "
                    f"input {spec.name!r} expects {spec.describe()} per row")
            values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        per_row *= width
        arr = values
        level += 1
        if per_row > spec.size and n:
            break
    if _kind(arr.type) != "number":
        raise ModelInputError(
            f"column {name!r} holds arrays of {arr.type}; the model input {spec.name!r} "
            f"expects numbers ({spec.describe()} per row)")
    _check_no_nulls(name, arr, spec, " (array elements)")
    return arr.to_numpy(zero_copy_only=False), per_row


def _vectors(name: str, arr: pa.StructArray, spec: TensorSpec) -> np.ndarray:
    """ML Vectors (type 1 dense, type 0 sparse) as a dense (n, size) float64 matrix."""
    _check_no_nulls(name, arr, spec)
    n = len(arr)
    fields = dict(zip((f.name for f in arr.type), arr.flatten()))  # offsets applied
    kinds = fields["type"].to_numpy(zero_copy_only=False)
    values = fields["values"]
    if np.all(kinds == 1):  # all dense: a list column in disguise
        flat, width = _list_values(name, values, spec)
        return _reshape(name, flat, width, n, spec)
    size = spec.size
    sizes = fields["size"].to_numpy(zero_copy_only=False)
    dense = kinds == 1
    v_off = values.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(v_off)
    bad = np.flatnonzero(np.where(dense, lengths, sizes) != size)
    if bad.size:
        row = int(bad[0])
        what = f"{int(lengths[row])} values" if dense[row] else f"size {int(sizes[row])}"
        raise ModelInputError(
            f"column {name!r}: the {'dense' if dense[row] else 'sparse'} vector at row {row} "
            f"of this batch has {what}; the model input {spec.name!r} expects {size} features")
    rows = np.repeat(np.arange(n), lengths)
    position = np.arange(len(rows)) - np.repeat(v_off[:-1] - v_off[0], lengths)
    cols = position.copy()
    sparse_value = np.repeat(~dense, lengths)
    if sparse_value.any():
        i_off = fields["indices"].offsets.to_numpy().astype(np.int64)
        i_flat = fields["indices"].values.to_numpy(zero_copy_only=False)
        where = (np.repeat(i_off[:-1], lengths) + position)[sparse_value]
        cols[sparse_value] = i_flat[where]
        if np.any((cols < 0) | (cols >= size)):
            row = int(rows[np.flatnonzero((cols < 0) | (cols >= size))[0]])
            raise ModelInputError(f"column {name!r}: sparse vector at row {row} has an index "
                                  f"outside 0..{size - 1}")
    out = np.zeros((n, size), dtype=np.float64)
    out[rows, cols] = values.values.to_numpy(zero_copy_only=False)[v_off[0]: v_off[-1]]
    return out.reshape((n, *spec.shape))


def _reshape(name: str, flat: np.ndarray, per_row: int, n: int, spec: TensorSpec) -> np.ndarray:
    if per_row != spec.size:
        raise ModelInputError(
            f"column {name!r}: each row holds {per_row} values; the model input "
            f"{spec.name!r} expects {spec.describe()} ({spec.size} values) per row")
    return flat.reshape((n, *spec.shape))


def column_to_tensor(name: str, arr: pa.Array, spec: TensorSpec) -> np.ndarray:
    """One Arrow column as the (n, *spec.shape) array of one model input (zero-copy
    where Arrow's layout allows; cast to the input dtype)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    kind = _kind(arr.type)
    n = len(arr)
    if n == 0:  # an empty batch, or every row left out as invalid: only the type can be wrong
        _numbers(name, pa.array([], _leaf_type(arr.type)), spec)
        return np.zeros((0, *spec.shape), dtype=spec.dtype)
    if kind == "list":
        flat, per_row = _list_values(name, arr, spec)
        out = _reshape(name, flat, per_row, n, spec)
    elif kind == "vector":
        out = _vectors(name, arr, spec)
    else:
        _check_no_nulls(name, arr, spec)
        out = _reshape(name, _numbers(name, arr, spec), 1, n, spec)
    _check_finite(name, out, spec)
    return out.astype(spec.dtype, copy=False)


def _check_finite(name: str, values: np.ndarray, spec: TensorSpec) -> None:
    if values.dtype.kind != "f" or np.isfinite(values).all():
        return
    bad_rows = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    row = int(np.argmax(bad_rows))
    raise ModelInputError(
        f"column {name!r}: NaN or infinite value(s) in {int(bad_rows.sum())} row(s), first at row "
        f"{row} of this batch; the model input {spec.name!r} expects finite {spec.describe()} "
        f"(use on_invalid='null' to give such rows a null prediction)")


def invalid_rows(name: str, arr: pa.Array, spec: TensorSpec) -> np.ndarray:
    """Rows that cannot be scored: nulls at any level, a wrong number of values, NaN/inf.

    Column-level problems (a string column, say) are not row problems: they still raise.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    kind = _kind(arr.type)
    bad = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if kind == "vector":
        bad |= _misshapen_vectors(arr, spec.size)
        arr = dict(zip((f.name for f in arr.type), arr.flatten()))["values"]  # dense/sparse values
    rows = np.arange(n)
    counts = np.ones(n, dtype=np.int64)
    while _kind(arr.type) == "list":
        bad |= np.bincount(rows, weights=np.asarray(arr.is_null().to_numpy(zero_copy_only=False)),
                           minlength=n).astype(bool)
        parents = pc.list_parent_indices(arr).to_numpy()
        rows = rows[parents]
        arr = pc.list_flatten(arr)
        counts = np.bincount(rows, minlength=n)
    if _kind(arr.type) != "number":
        _numbers(name, arr, spec)  # raises: not a row problem
    leaf_bad = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    values = arr.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        leaf_bad |= ~np.isfinite(values)
    bad |= np.bincount(rows, weights=leaf_bad, minlength=n).astype(bool)
    if kind != "vector":  # a sparse vector stores fewer values than its size
        bad |= counts != (spec.size if kind == "list" else 1)
    return bad


def _misshapen_vectors(arr: pa.StructArray, size: int) -> np.ndarray:
    """ML Vector rows that do not hold ``size`` features: a dense vector with another
    number of values, a sparse one of another size or with an index outside it."""
    n = len(arr)
    fields = dict(zip((f.name for f in arr.type), arr.flatten()))
    dense = fields["type"].fill_null(1).to_numpy(zero_copy_only=False) == 1
    sizes = fields["size"].fill_null(size).to_numpy(zero_copy_only=False)
    lengths = np.diff(fields["values"].offsets.to_numpy())
    bad = np.where(dense, lengths, sizes) != size
    indices = fields["indices"]
    parents = pc.list_parent_indices(indices).to_numpy()
    flat = pc.list_flatten(indices).fill_null(-1).to_numpy(zero_copy_only=False)
    outside = (flat < 0) | (flat >= size)
    bad |= ~dense & np.bincount(parents, weights=outside, minlength=n).astype(bool)
    return bad


ON_INVALID = ("error", "null")


def check_on_invalid(on_invalid: str) -> None:
    """Refuse an unknown bad-row policy up front (on the driver, not in a task)."""
    if on_invalid not in ON_INVALID:
        raise ValueError(f"on_invalid must be one of {ON_INVALID}, not {on_invalid!r}")


def columns_to_inputs(names: Sequence[str], arrays: Sequence[pa.Array], signature: Signature,
                      on_invalid: str = "error") -> tuple[list[np.ndarray], np.ndarray | None]:
    """Model inputs from columns: one column per input, or scalar columns stacked into
    the features of a single-input model.

    With ``on_invalid="error"`` a bad row raises :class:`ModelInputError`; with ``"null"``
    bad rows are left out and the returned mask (True = invalid) says which they were.
    """
    check_on_invalid(on_invalid)
    if on_invalid == "null" and len(arrays) and len(arrays[0]):
        specs = _column_specs(names, arrays, signature)
        mask = np.zeros(len(arrays[0]), dtype=bool)
        for name, arr, spec in zip(names, arrays, specs):
            mask |= invalid_rows(name, arr, spec)
        if mask.any():
            keep = pa.array(~mask)
            arrays = [a.filter(keep) for a in arrays]
            return _columns_to_inputs(names, arrays, signature), mask
    return _columns_to_inputs(names, arrays, signature), None


def _column_specs(names: Sequence[str], arrays: Sequence[pa.Array],
                  signature: Signature) -> list[TensorSpec]:
    inputs = signature.inputs
    if len(arrays) == len(inputs):
        return list(inputs)
    return [TensorSpec(inputs[0].name, (), inputs[0].dtype)] * len(arrays)


def _columns_to_inputs(names: Sequence[str], arrays: Sequence[pa.Array],
                       signature: Signature) -> list[np.ndarray]:
    inputs = signature.inputs
    if len(arrays) == len(inputs):
        return [column_to_tensor(n, a, s) for n, a, s in zip(names, arrays, inputs)]
    if len(inputs) == 1 and len(arrays) > 1:
        spec = inputs[0]
        if len(arrays) != spec.size:
            raise ModelInputError(
                f"{len(arrays)} columns {list(names)} given; the model input {spec.name!r} "
                f"expects {spec.describe()}, i.e. {spec.size} scalar columns, or one array column")
        scalar = TensorSpec(spec.name, (), spec.dtype)
        for n, a in zip(names, arrays):
            if _kind(a.type) != "number":
                raise ModelInputError(
                    f"column {n!r} has type {a.type}; stacking {len(arrays)} columns as the "
                    f"features of input {spec.name!r} needs one number per column")
        stacked = np.empty((len(arrays[0]), spec.size), dtype=spec.dtype)
        for j, (n, a) in enumerate(zip(names, arrays)):
            stacked[:, j] = column_to_tensor(n, a, scalar)
        return [stacked.reshape((len(arrays[0]), *spec.shape))]
    raise ModelInputError(
        f"{len(arrays)} column(s) {list(names)} given for a model with {len(inputs)} inputs "
        f"{[s.name for s in inputs]}: pass one column per input")


# --- outputs -------------------------------------------------------------------------------

# numpy dtype an output column is stored with (Spark has no float16/bfloat16/unsigned)
_STORED_AS = {"float64": np.float64, "int64": np.int64, "int32": np.int32, "int16": np.int16,
              "int8": np.int8, "uint8": np.int16, "uint16": np.int32, "uint32": np.int64,
              "bool": np.bool_}


def stored_dtype(dtype: str) -> np.dtype:
    return np.dtype(_STORED_AS.get(dtype, np.float32))


def is_scalar_output(spec: TensorSpec) -> bool:
    """Single-unit outputs ((), (1,)) become a scalar column; others nested arrays."""
    return spec.size == 1 and len(spec.shape) <= 1


def tensor_to_arrow(values: np.ndarray, spec: TensorSpec, invalid: np.ndarray | None = None
                    ) -> pa.Array:
    """A (n, *shape) output as an Arrow column: a scalar column or nested lists. With an
    ``invalid`` mask (over all rows; ``values`` holds the valid ones), invalid rows are null."""
    values = np.ascontiguousarray(values, dtype=stored_dtype(spec.dtype))
    if invalid is not None:
        full = np.zeros((len(invalid), *values.shape[1:]), dtype=values.dtype)
        full[~invalid] = values
        values = full
    n = values.shape[0]
    mask = pa.array(invalid) if invalid is not None else None
    if is_scalar_output(spec):
        return pa.array(values.reshape(n), mask=invalid)
    arr: pa.Array = pa.array(values.reshape(-1))
    for level, width in enumerate(reversed(spec.shape)):
        count = len(arr) // width
        offsets = pa.array(np.arange(0, (count + 1) * width, width, dtype=np.int32))
        outermost = level == len(spec.shape) - 1
        arr = pa.ListArray.from_arrays(offsets, arr, mask=mask if outermost else None)
    return arr


def outputs_to_arrow(outputs: Sequence[np.ndarray], signature: Signature,
                     invalid: np.ndarray | None = None) -> pa.Array:
    """One Arrow column of predictions (a struct for multi-output models)."""
    if signature.output_names is None:
        return tensor_to_arrow(outputs[0], signature.outputs[0], invalid)
    arrays = [tensor_to_arrow(o, s, invalid) for o, s in zip(outputs, signature.outputs)]
    mask = pa.array(invalid) if invalid is not None else None
    return pa.StructArray.from_arrays(arrays, names=list(signature.output_names), mask=mask)
