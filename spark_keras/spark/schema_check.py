"""What the driver can see before any task runs: the DataFrame's schema against the
model's signature. Each input column becomes an empty Arrow array of the type its rows
will arrive in, and the engine's own checks run on them
(:func:`spark_keras.inference.engine.check_inputs`), so the driver refuses exactly what
every batch would, with the same :class:`~spark_keras.errors.ModelInputError`."""

from __future__ import annotations

import logging
from typing import Any, Sequence

import pyarrow as pa

from spark_keras.handle import ModelHandle
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import check_inputs

log = logging.getLogger("spark_keras")


def arrow_type(data_type: Any) -> pa.DataType | None:
    """The Arrow type a Spark column of ``data_type`` reaches the Python workers in (an
    ML Vector or other UDT as its SQL type); None if PySpark has no Arrow form for it."""
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType, UserDefinedType

    def plain(t: Any) -> Any:  # UDTs as their SQL types, all the way down (PySpark 3.5)
        if isinstance(t, UserDefinedType):
            return plain(t.sqlType())
        if isinstance(t, StructType):
            return StructType([StructField(f.name, plain(f.dataType), f.nullable) for f in t])
        if isinstance(t, ArrayType):
            return ArrayType(plain(t.elementType), t.containsNull)
        if isinstance(t, MapType):
            return MapType(plain(t.keyType), plain(t.valueType), t.valueContainsNull)
        return t

    try:
        return to_arrow_type(plain(data_type), timezone="UTC")
    except Exception as exc:  # a type PySpark cannot send as Arrow: the query will say so
        log.debug("no driver-side check for Spark type %s: %s", data_type, exc)
        return None


def check_schema(handle: ModelHandle, schema: Any, names: Sequence[str]) -> None:
    """Refuse (:class:`~spark_keras.errors.ModelInputError`) input columns ``names`` of
    ``schema`` (a ``StructType``) the model cannot take whatever the rows hold. With a
    ``preprocess`` function the model sees its output, not the columns: nothing is checked."""
    if handle.preprocess is not None:
        return
    by_name = {f.name: f for f in schema.fields}
    types = [arrow_type(by_name[n].dataType) for n in names]
    if any(t is None for t in types):
        return
    check_inputs(cols.from_arrow(names, [pa.array([], type=t) for t in types]),
                 handle.signature, handle.resize)
