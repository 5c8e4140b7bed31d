"""Spark SQL types implied by a model's outputs."""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from spark_keras.errors import ArgumentError, ArgumentTypeError
from spark_keras.inference.outputs import is_scalar_output, stored_dtype
from spark_keras.inference.signature import Signature, TensorSpec

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


# Spark's DDL names of the simple types, read without asking Spark (no session needed)
_DDL_NAMES = {"boolean": T.BooleanType, "tinyint": T.ByteType, "byte": T.ByteType,
              "smallint": T.ShortType, "short": T.ShortType, "int": T.IntegerType,
              "integer": T.IntegerType, "bigint": T.LongType, "long": T.LongType,
              "float": T.FloatType, "real": T.FloatType, "double": T.DoubleType,
              "string": T.StringType, "binary": T.BinaryType}


def spark_type(value: Any, what: str = "return_type") -> T.DataType:
    """``value`` as a Spark SQL type: a ``DataType`` as it is, a DDL string (``"double"``,
    ``"array<float>"``, ``"score double, label int"``) parsed.

    Args:
        value: a ``pyspark.sql.types.DataType`` or a DDL string.
        what: the argument's name, for errors.

    Returns:
        The ``DataType``.

    Raises:
        ArgumentTypeError: ``value`` is neither.
        ArgumentError: the string is not a type Spark can parse (or, for other than the
            simple type names, no Spark session is active to parse it).
    """
    if isinstance(value, T.DataType):
        return value
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{what} must be a pyspark.sql.types.DataType or a DDL "
                                f"string such as 'double', not {type(value).__name__}")
    simple = _DDL_NAMES.get(value.strip().lower())
    if simple is not None:
        return simple()
    # Spark's own parser, through the active session (classic or Connect)
    from pyspark.sql.types import _parse_datatype_string

    try:
        return _parse_datatype_string(value)
    except Exception as exc:  # ParseException, or no active session to parse with
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ArgumentError(f"{what} {value!r} is not a Spark SQL type Spark can parse "
                            f"(a DDL string such as 'double' or 'array<float>'): "
                            f"{reason}") from exc
