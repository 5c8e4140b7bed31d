"""Predictions (a :class:`~.engine.Scored` batch) shaped for each front-end: an Arrow
column (Spark), numpy arrays (pools, Dask arrays), a pandas frame (Dask DataFrames) or
one Python value per row (``rdd.mapPartitions``). Invalid rows are null: a null Arrow
value, NaN in numpy arrays and pandas frames (other dtypes become floats), None."""

from __future__ import annotations

from typing import Any, Container, Iterator, Sequence, cast

import numpy as np
import pyarrow as pa

from spark_keras.errors import ModelError
from spark_keras.inference.engine import Scored
from spark_keras.inference.specs import Signature, TensorSpec, model_outputs

# numpy dtype an output column is stored with (Spark has no float16/bfloat16/unsigned)
_STORED_AS = {"float64": np.float64, "int64": np.int64, "int32": np.int32, "int16": np.int16,
              "int8": np.int8, "uint8": np.int16, "uint16": np.int32, "uint32": np.int64,
              "bool": np.bool_}


def stored_dtype(dtype: str) -> np.dtype:
    """The numpy dtype an output of ``dtype`` is stored with: object (``str``) for
    ``tf.string`` outputs, a type Spark has for numbers."""
    return np.dtype(object) if dtype == "string" else np.dtype(_STORED_AS.get(dtype, np.float32))


def _decoded_values(values: np.ndarray) -> np.ndarray:
    """Bytes as ``str`` (other values as they are); raises ``UnicodeDecodeError``."""
    return np.frompyfunc(lambda v: v.decode() if isinstance(v, bytes) else v, 1, 1)(values) \
        .astype(object, copy=False) if values.size else values.astype(object)


def as_text(values: np.ndarray) -> np.ndarray:
    """A ``tf.string`` output (bytes) as ``str`` objects (Spark string columns hold UTF-8).
    The predictor decodes each row (:func:`text_rows`), so bytes that are not UTF-8 make
    their row invalid; any that come here raise :class:`ModelError`."""
    try:
        return _decoded_values(values)
    except UnicodeDecodeError as exc:
        raise ModelError(f"the model returned bytes that are not UTF-8 text ({exc}); a string "
                         f"output must hold text") from exc


def text_rows(values: np.ndarray, variable: bool, skip: Container[int] = ()
              ) -> tuple[np.ndarray, dict[int, UnicodeDecodeError]]:
    """A ``tf.string`` output's rows (bytes; with ``variable``, one array per row) as
    ``str``, and the rows that are not UTF-8 text (row -> error), which are left as they
    were, as are the rows of ``skip``."""
    if not variable:
        try:
            return _decoded_values(values), {}
        except UnicodeDecodeError:
            pass  # which rows: one by one
    out = np.empty(len(values), dtype=object) if variable else np.array(values, dtype=object)
    bad: dict[int, UnicodeDecodeError] = {}
    for i, row in enumerate(values):
        try:
            out[i] = row if i in skip else row.decode() if isinstance(row, bytes) \
                else _decoded_values(row) if isinstance(row, np.ndarray) else row
        except UnicodeDecodeError as exc:
            bad[i] = exc
            out[i] = row
    return out, bad


def _decoded(scored: Scored) -> list[np.ndarray]:
    """The valid rows' outputs, text outputs as ``str``."""
    return [as_text(o) if s.dtype == "string" else o
            for o, s in zip(scored.outputs, scored.signature.outputs)]


def _stored(values: np.ndarray, spec: TensorSpec) -> np.ndarray:
    if spec.dtype == "string":
        return np.asarray(as_text(np.asarray(values)), dtype=object)
    return np.ascontiguousarray(values, dtype=stored_dtype(spec.dtype))


def is_scalar_output(spec: TensorSpec) -> bool:
    """Single-unit outputs ((), (1,)) become a scalar column; others nested arrays."""
    return spec.size == 1 and len(spec.shape) <= 1


def nullable_dtype(dtype: Any) -> np.dtype:
    """The dtype that can hold NaN for a null row: floats keep theirs, objects (text) hold None."""
    if np.dtype(dtype) == object:
        return np.dtype(object)
    return np.result_type(np.dtype(dtype), np.float32)


def _full(values: np.ndarray, invalid: np.ndarray) -> np.ndarray:
    """``values`` of the valid rows spread over all rows, invalid rows NaN (an Arrow
    column masks them; elsewhere non-float outputs become floats, text None)."""
    dtype = nullable_dtype(values.dtype)
    full = np.full((len(invalid), *values.shape[1:]), None if dtype.kind == "O" else np.nan,
                   dtype=dtype)
    full[~invalid] = values
    return full


# --- Arrow ---------------------------------------------------------------------------

def tensor_to_arrow(values: np.ndarray, spec: TensorSpec, invalid: np.ndarray | None = None
                    ) -> pa.Array:
    """A (n, *shape) output as an Arrow column: a scalar column or nested lists. With an
    ``invalid`` mask (over all rows; ``values`` holds the valid ones), invalid rows are null."""
    if spec.variable:
        return _ragged_to_arrow(values, spec, invalid)
    values = _stored(values, spec)
    if invalid is not None:  # the nulls' values are hidden by the mask
        full = np.zeros((len(invalid), *values.shape[1:]), dtype=values.dtype)
        if values.dtype == object:
            full.fill("")
        full[~invalid] = values
        values = full
    n = values.shape[0]
    mask = pa.array(invalid) if invalid is not None else None
    text = pa.string() if spec.dtype == "string" else None
    if is_scalar_output(spec):
        return pa.array(values.reshape(n), type=text, mask=invalid)
    arr: pa.Array = pa.array(values.reshape(-1), type=text)
    for level, width in enumerate(reversed(spec.known_shape)):
        count = len(arr) // width
        offsets = pa.array(np.arange(0, (count + 1) * width, width, dtype=np.int32))
        outermost = level == len(spec.shape) - 1
        arr = pa.ListArray.from_arrays(offsets, arr, mask=mask if outermost else None)
    return arr


def _ragged_to_arrow(values: np.ndarray, spec: TensorSpec, invalid: np.ndarray | None) -> pa.Array:
    """An output with unknown dimensions (one array per row, each of its own shape) as
    nested lists."""
    leaf: pa.DataType = pa.string() if spec.dtype == "string" else \
        pa.from_numpy_dtype(stored_dtype(spec.dtype))
    for _ in spec.shape:
        leaf = pa.list_(leaf)
    rows = iter(values)
    cells = []
    for bad in (invalid if invalid is not None else np.zeros(len(values), bool)):
        row = None if bad else next(rows)
        cells.append(None if row is None else
                     _stored(np.asarray(row), TensorSpec(spec.name, row.shape, spec.dtype)).tolist())
    return pa.array(cells, type=leaf)


def outputs_to_arrow(outputs: Sequence[np.ndarray], signature: Signature,
                     invalid: np.ndarray | None = None) -> pa.Array:
    """One Arrow column of predictions (a struct for multi-output models)."""
    if signature.output_names is None:
        return tensor_to_arrow(outputs[0], signature.outputs[0], invalid)
    arrays = [tensor_to_arrow(o, s, invalid) for o, s in zip(outputs, signature.outputs)]
    mask = pa.array(invalid) if invalid is not None else None
    return pa.StructArray.from_arrays(arrays, names=list(signature.output_names), mask=mask)


def to_arrow(scored: Scored) -> pa.Array:
    return outputs_to_arrow(scored.outputs, scored.signature, scored.invalid)


# --- numpy ---------------------------------------------------------------------------

def full_outputs(scored: Scored) -> list[np.ndarray]:
    """One array per output over all rows; invalid rows NaN (:func:`nullable_dtype`)."""
    outputs = _decoded(scored)
    if scored.invalid is None:
        return outputs
    return [_full(values, scored.invalid) for values in outputs]


def to_numpy(scored: Scored) -> Any:
    """One array for a single-output model, else a dict keyed by output name."""
    return model_outputs(full_outputs(scored), scored.signature)


def flat_columns(signature: Signature) -> list[str]:
    """Column names of :func:`flat_outputs`: the output's name for a single value,
    ``<name>_<i>`` for each value of a vector output."""
    ragged = [out.name for out in signature.outputs if out.variable]
    if ragged:
        raise ModelError(f"output(s) {ragged} have unknown dimensions: rows differ in shape and "
                         f"cannot be flattened into columns of one width")
    return [n for out in signature.outputs
            for n in ([out.name] if out.size == 1 else
                      [f"{out.name}_{i}" for i in range(cast(int, out.size))])]  # none ragged


def flat_dtype(signature: Signature, nullable: bool = False) -> np.dtype:
    """The common dtype of every output value (float when rows may be null)."""
    dtype = np.result_type(*[stored_dtype(out.dtype) if out.dtype == "string" else np.dtype(out.dtype)
                             for out in signature.outputs])
    return nullable_dtype(dtype) if nullable else dtype


def flat_outputs(scored: Scored, nullable: bool = False) -> np.ndarray:
    """``(rows, values)``: every output flattened, side by side, in signature order, of
    :func:`flat_dtype`; invalid rows NaN (they need ``nullable``, a float dtype)."""
    dtype = flat_dtype(scored.signature, nullable)
    flat = np.concatenate([o.reshape(len(o), cast(int, s.size)) for o, s in
                           zip(_decoded(scored), scored.signature.outputs)], axis=1).astype(
        dtype, copy=False)
    return flat if scored.invalid is None else _full(flat, scored.invalid)


# --- Python rows ---------------------------------------------------------------------

def to_rows(scored: Scored) -> Iterator[Any]:
    """One value per row: a float for single-unit outputs, an array otherwise, a dict for
    multi-output models; None for invalid rows."""
    sig = scored.signature
    k = 0
    invalid = scored.invalid if scored.invalid is not None else np.zeros(scored.rows, bool)
    decoded = _decoded(scored)
    for bad in invalid:
        if bad:
            yield None
            continue
        values = [o[k:k + 1].reshape(()).item() if is_scalar_output(s) else o[k]
                  for o, s in zip(decoded, sig.outputs)]
        k += 1
        yield dict(zip(sig.output_names, values)) if sig.output_names else values[0]
