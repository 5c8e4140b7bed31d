"""The Params of :class:`spark_keras.ml.KerasTransformer` and their converters."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasInputCols, HasOutputCol

from spark_keras.inference.options import (
    DEFAULT_BATCH_SIZE,
    ML_PARAMS,
    check_batch_size,
    check_buckets,
    check_max_invalid,
    check_on_invalid,
)

__all__ = ["KerasTransformerParams", "to_batch_size", "to_on_invalid", "to_max_invalid", "to_buckets"]


def to_batch_size(value: Any) -> int:
    """``value`` as a batch size: a positive integer.

    Raises:
        TypeError: not an integer (as Spark's int params).
        ArgumentError: not positive.
    """
    return check_batch_size(TypeConverters.toInt(value), ML_PARAMS)


def to_on_invalid(value: Any) -> str:
    """``value`` as an ``onInvalid`` policy (``"error"`` or ``"null"``).

    Raises:
        ArgumentError: another string.
    """
    return check_on_invalid(TypeConverters.toString(value), ML_PARAMS)


def to_max_invalid(value: Any) -> float:
    """``value`` as a ``maxInvalid`` limit: a count (>= 1) or a fraction (< 1), kept as a
    float (Spark's params store numbers as doubles).

    Raises:
        TypeError: not a number.
        ArgumentError: negative, or a count that is not whole.
    """
    limit = check_max_invalid(TypeConverters.toFloat(value), "null", ML_PARAMS)
    return float(limit)  # type: ignore[arg-type]


def to_buckets(value: Any) -> int | list[int] | None:
    """``value`` as ``buckets``: a count of lengths (an int >= 1) or bucket lengths (a
    strictly increasing list of positive ints, kept as a list: Params are saved as JSON).

    Raises:
        ArgumentError: anything else.
    """
    buckets = check_buckets(value, ML_PARAMS)
    return list(buckets) if isinstance(buckets, tuple) else buckets


class KerasTransformerParams(HasInputCol, HasInputCols, HasOutputCol):
    """Params of :class:`~spark_keras.ml.KerasTransformer`."""

    batchSize: "Param[int]" = Param(
        Params._dummy(), "batchSize",
        "rows per model call on a worker (> 0); each Arrow batch is scored in calls of "
        "at most this many rows",
        typeConverter=to_batch_size)
    onInvalid: "Param[str]" = Param(
        Params._dummy(), "onInvalid",
        "how to handle a row the model cannot take (a null, NaN/inf or wrongly shaped "
        "value): 'error' fails the task naming the column and row, 'null' gives the row a "
        "null prediction",
        typeConverter=to_on_invalid)
    errorCol: "Param[str]" = Param(
        Params._dummy(), "errorCol",
        "a string column added with, for each invalid row, why the model cannot take it "
        "(null for scored rows); needs onInvalid='null'",
        typeConverter=TypeConverters.toString)
    maxInvalid: "Param[float]" = Param(
        Params._dummy(), "maxInvalid",
        "the most invalid rows a task may give (failed checks and rows the model or the "
        "preprocess function raised on): a count (>= 1) or a fraction (< 1) of the task's "
        "rows; beyond it the task fails. Needs onInvalid='null'",
        typeConverter=to_max_invalid)
    idCol: "Param[str]" = Param(
        Params._dummy(), "idCol",
        "a column naming each row (a record id): errors and errorCol reasons name a row "
        "by its value (row id=17) instead of its place in a batch",
        typeConverter=TypeConverters.toString)

    buckets: "Param[Any]" = Param(
        Params._dummy(), "buckets",
        "for a model that masks its variable-length inputs: pad each batch's rows into at "
        "most this many lengths (an int), or to these lengths (a list), one model call per "
        "bucket, each row's prediction its own (see BroadcastModel.predict_udf)",
        typeConverter=to_buckets)
    versionCol: "Param[str]" = Param(
        Params._dummy(), "versionCol",
        "a string column added with the label of the model version that scored each row "
        "(see BroadcastModel.update)",
        typeConverter=TypeConverters.toString)

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(outputCol="prediction", batchSize=DEFAULT_BATCH_SIZE, onInvalid="error")

    def getBatchSize(self) -> int:
        """Gets the value of batchSize or its default value."""
        return self.getOrDefault(self.batchSize)

    def getOnInvalid(self) -> str:
        """Gets the value of onInvalid or its default value."""
        return self.getOrDefault(self.onInvalid)

    def getErrorCol(self) -> str | None:
        """Gets the value of errorCol (None: not set, no error column)."""
        return self.getOrDefault(self.errorCol) if self.isDefined(self.errorCol) else None

    def getIdCol(self) -> str | None:
        """Gets the value of idCol (None: not set, rows named by their place)."""
        return self.getOrDefault(self.idCol) if self.isDefined(self.idCol) else None

    def getVersionCol(self) -> str | None:
        """Gets the value of versionCol (None: not set, no version column)."""
        return self.getOrDefault(self.versionCol) if self.isDefined(self.versionCol) else None

    def getBuckets(self) -> int | list[int] | None:
        """Gets the value of buckets (None: not set, rows grouped by exact shape)."""
        return self.getOrDefault(self.buckets) if self.isDefined(self.buckets) else None

    def getMaxInvalid(self) -> float | int | None:
        """Gets the value of maxInvalid (None: not set, no limit); a count as an int."""
        if not self.isDefined(self.maxInvalid):
            return None
        value = self.getOrDefault(self.maxInvalid)
        return int(value) if value >= 1 else value
