"""Scoring Spark data with a BroadcastModel: the UDF, the mapInArrow transform and the
mapPartitions helper. All three share one path: columns -> numpy inputs -> compiled
model call in batches -> Arrow/numpy outputs."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa

from ..errors import ModelInputError
from ..inference.arrow_tensors import (
    check_on_invalid,
    columns_to_inputs,
    is_scalar_output,
    outputs_to_arrow,
)
from ..inference.predictor import Predictor
from .types import prediction_type

if TYPE_CHECKING:
    from .broadcast import BroadcastModel


def predict_arrow(predictor: Predictor, names: Sequence[str], arrays: Sequence[pa.Array],
                  batch_size: int, on_invalid: str = "error") -> pa.Array:
    """Predictions for one Arrow batch of input columns, as one Arrow column (null for
    invalid rows when ``on_invalid="null"``; the row count never changes)."""
    sig = predictor.signature
    inputs, invalid = columns_to_inputs(names, arrays, sig, on_invalid)
    if len(inputs[0]) == 0:
        outputs = [np.zeros((0, *s.shape), dtype="float32") for s in sig.outputs]
    else:
        outputs = predictor(inputs, batch_size)
    return outputs_to_arrow(outputs, sig, invalid)


def _column_name(col: Any) -> str:
    if isinstance(col, str):
        return col
    text = str(col)  # Column<'features'>
    return text[8:-2] if text.startswith("Column<'") and text.endswith("'>") else text


class PredictUDF:
    """Callable like a UDF: ``udf("features")`` or ``udf("a", "b", "c")`` gives a Column.

    The column names are bound when it is called, so input errors raised on executors
    name the column at fault.
    """

    def __init__(self, handle: "BroadcastModel", *, return_type: Any = None,
                 batch_size: int, on_invalid: str = "error") -> None:
        check_on_invalid(on_invalid)
        self.handle = handle
        self.returnType = return_type if return_type is not None else prediction_type(handle.signature)
        self.batch_size = int(batch_size)
        self.on_invalid = on_invalid

    def __call__(self, *cols: Any) -> Any:
        if not cols:
            raise ModelInputError("predict_udf needs at least one input column")
        names = [_column_name(c) for c in cols]
        score = functools.partial(predict_arrow, batch_size=self.batch_size, on_invalid=self.on_invalid)
        return _make_udf(self.handle, names, self.returnType, score)(*cols)


def _make_udf(handle: "BroadcastModel", names: list[str], return_type: Any, score: Callable):
    try:
        from pyspark.sql.pandas.functions import arrow_udf
    except ImportError:  # PySpark < 4.1: pandas UDF
        return _make_pandas_udf(handle, names, return_type, score)

    def predict(batches):
        predictor = handle.predictor
        for batch in batches:
            arrays = list(batch) if isinstance(batch, (tuple, list)) else [batch]
            yield score(predictor, names, arrays)

    # arrow_udf reads the UDF kind from type hints (iterator of arrays, or of tuples)
    item = pa.Array if len(names) == 1 else Tuple[pa.Array, ...]
    predict.__annotations__ = {"batches": Iterator[item], "return": Iterator[pa.Array]}
    return arrow_udf(predict, return_type)


def _make_pandas_udf(handle: "BroadcastModel", names: list[str], return_type: Any,
                     score: Callable):
    import operator

    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import StructType

    def predict(batches):
        predictor = handle.predictor
        for batch in batches:
            series = list(batch) if isinstance(batch, (tuple, list)) else [batch]
            arrays = [_series_to_arrow(name, s) for name, s in zip(names, series)]
            out = score(predictor, names, arrays)
            if isinstance(out, pa.StructArray):
                yield pa.Table.from_arrays(out.flatten(), names=[f.name for f in out.type]).to_pandas()
            else:
                yield out.to_pandas()

    # an iterator-of-batches pandas UDF, told by type hints (a struct column, such as an
    # ML Vector, arrives as a DataFrame)
    column = Union[pd.Series, pd.DataFrame]
    item = column if len(names) == 1 else Tuple[column, ...]
    predict.__annotations__ = {"batches": Iterator[item], "return": Iterator[pd.Series]}
    udf = pandas_udf(predict, return_type)
    if not isinstance(udf.returnType, StructType):
        return udf

    def struct_or_null(*cols):
        # a pandas UDF cannot return a null struct: an invalid row comes back with every
        # field null (a valid one never has a null field), so make that row null
        col = udf(*cols)
        every_null = functools.reduce(operator.and_, [col[f.name].isNull() for f in udf.returnType.fields])
        return F.when(every_null, F.lit(None).cast(udf.returnType)).otherwise(col)

    return struct_or_null


# Arrow types of an ML Vector's fields: a pandas column where every row is null loses it
_VECTOR_FIELD_TYPES = {"type": pa.int8(), "size": pa.int32(), "indices": pa.list_(pa.int32()),
                       "values": pa.list_(pa.float64())}


def _series_to_arrow(name: str, series: Any) -> pa.Array:
    """A pandas UDF input column as Arrow (ML Vectors become dense lists)."""
    if hasattr(series, "columns"):  # a struct column (an ML Vector) arrives as a DataFrame
        fields = [str(c) for c in series.columns]
        children = [_series_to_arrow(f"{name}.{c}", series[c]) for c in series.columns]
        children = [pa.nulls(len(a), _VECTOR_FIELD_TYPES[f])
                    if pa.types.is_null(a.type) and f in _VECTOR_FIELD_TYPES else a
                    for f, a in zip(fields, children)]
        missing = series.isna().all(axis=1).to_numpy()  # a null struct: every field null
        return pa.StructArray.from_arrays(children, names=fields,
                                          mask=pa.array(missing) if missing.any() else None)
    values = series.to_numpy()
    if values.dtype == object and len(values):
        first = next((v for v in values if v is not None), None)
        if hasattr(first, "toArray"):  # pyspark.ml.linalg vectors
            return pa.array([None if v is None else v.toArray() for v in values])
    try:
        arr = pa.Array.from_pandas(series)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ModelInputError(f"column {name!r} cannot be read as numbers: {exc}") from exc
    if pa.types.is_null(arr.type):  # every row null: an array column lost its type
        return pa.nulls(len(arr), pa.list_(pa.float64()))
    return arr


def transform(handle: "BroadcastModel", df: Any, input_cols: str | Sequence[str],
              output_col: str, *, batch_size: int, on_invalid: str = "error") -> Any:
    from pyspark.sql.types import StructField, StructType

    check_on_invalid(on_invalid)
    names = [input_cols] if isinstance(input_cols, str) else list(input_cols)
    missing = [c for c in names if c not in df.columns]
    if missing:
        raise ModelInputError(f"input column(s) {missing} not in the DataFrame; it has {df.columns}")
    if output_col in df.columns:
        raise ModelInputError(f"output column {output_col!r} already exists in the DataFrame")
    schema = StructType(df.schema.fields + [StructField(output_col, prediction_type(handle.signature))])

    def score(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        predictor = handle.predictor
        for batch in batches:
            arrays = [batch.column(c) for c in names]
            prediction = predict_arrow(predictor, names, arrays, batch_size, on_invalid)
            yield pa.RecordBatch.from_arrays([*batch.columns, prediction],
                                             names=[*batch.schema.names, output_col])

    return df.mapInArrow(score, schema)


def predict_rows(handle: "BroadcastModel", rows: Iterable[Any], *, batch_size: int,
                 on_invalid: str = "error") -> Iterator[Any]:
    check_on_invalid(on_invalid)
    predictor = handle.predictor
    buffer: list[Any] = []
    position = 0
    for row in rows:
        buffer.append(row)
        if len(buffer) >= batch_size:
            yield from _predict_row_batch(predictor, buffer, position, batch_size, on_invalid)
            position += len(buffer)
            buffer = []
    if buffer:
        yield from _predict_row_batch(predictor, buffer, position, batch_size, on_invalid)


def _row_parts(row: Any, n_inputs: int, input_names: Sequence[str]) -> list[Any]:
    if isinstance(row, dict) or hasattr(row, "asDict"):
        mapping = row if isinstance(row, dict) else row.asDict()
        if all(name in mapping for name in input_names):
            return [mapping[name] for name in input_names]
        row = list(mapping.values())
    if hasattr(row, "toArray"):  # an ML Vector
        return [row.toArray()]
    if isinstance(row, (tuple, list)) and n_inputs > 1:
        return list(row)
    if isinstance(row, (tuple, list)) and len(row) == 1 and not np.isscalar(row[0]):
        part = row[0]
        return [part.toArray() if hasattr(part, "toArray") else part]
    return [row]


def _row_inputs(parts: list[Any], sig: Any, where: str) -> list[np.ndarray]:
    """One row's model inputs; raises ModelInputError saying what is wrong."""
    names = [spec.name for spec in sig.inputs]
    if len(parts) != len(sig.inputs):
        raise ModelInputError(f"{where} has {len(parts)} parts; the model has inputs {names}")
    arrays = []
    for value, spec in zip(parts, sig.inputs):
        if value is None:
            raise ModelInputError(f"{where}: input {spec.name!r} is null; expected {spec.describe()}")
        try:
            arr = np.asarray(value, dtype=spec.dtype)
        except (TypeError, ValueError) as exc:
            raise ModelInputError(f"{where}: input {spec.name!r} is not numeric ({exc}); "
                                  f"expected {spec.describe()}") from exc
        if arr.size != spec.size:
            raise ModelInputError(f"{where}: input {spec.name!r} has {arr.size} values, "
                                  f"expected {spec.describe()}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ModelInputError(f"{where}: input {spec.name!r} has NaN or infinite values")
        arrays.append(arr.reshape(spec.shape))
    return arrays


def _predict_row_batch(predictor: Predictor, rows: list[Any], start: int, batch_size: int,
                       on_invalid: str) -> Iterator[Any]:
    sig = predictor.signature
    names = [s.name for s in sig.inputs]
    converted: list[list[np.ndarray] | None] = []
    for j, row in enumerate(rows):
        try:
            converted.append(_row_inputs(_row_parts(row, len(names), names), sig,
                                         f"row {start + j} of this partition"))
        except ModelInputError:
            if on_invalid == "error":
                raise
            converted.append(None)
    valid = [c for c in converted if c is not None]
    outputs = predictor([np.stack(parts) for parts in zip(*valid)], batch_size) if valid else []
    k = 0
    for parts in converted:
        if parts is None:
            yield None
            continue
        values = [_row_value(o[k], s) for o, s in zip(outputs, sig.outputs)]
        k += 1
        yield dict(zip(sig.output_names, values)) if sig.output_names else values[0]


def _row_value(value: np.ndarray, spec: Any) -> Any:
    return value.reshape(()).item() if is_scalar_output(spec) else value
