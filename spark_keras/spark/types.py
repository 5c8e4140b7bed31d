"""Spark SQL types implied by a model's outputs."""

from __future__ import annotations

from pyspark.sql import types as T

from ..inference.outputs import is_scalar_output, stored_dtype
from ..inference.signature import Signature, TensorSpec

_SPARK_TYPES = {"float32": T.FloatType, "float64": T.DoubleType, "int64": T.LongType,
                "int32": T.IntegerType, "int16": T.ShortType, "int8": T.ByteType,
                "bool": T.BooleanType, "object": T.StringType}


def output_type(spec: TensorSpec) -> T.DataType:
    """A scalar type for single-unit outputs, else (nested) arrays of it."""
    dtype: T.DataType = _SPARK_TYPES[stored_dtype(spec.dtype).name]()
    if is_scalar_output(spec):
        return dtype
    for _ in spec.shape:
        dtype = T.ArrayType(dtype)
    return dtype


def prediction_type(signature: Signature) -> T.DataType:
    """One output: its type; several: a struct with one field per output."""
    if signature.output_names is None:
        return output_type(signature.outputs[0])
    return T.StructType([T.StructField(s.name, output_type(s))
                         for s in signature.outputs])
