"""The Params of :class:`spark_keras.ml.KerasTransformer` and their converters."""

from __future__ import annotations

from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasInputCols, HasOutputCol

from ..errors import ArgumentError
from ..inference.engine import ON_INVALID
from ..inference.predictor import DEFAULT_BATCH_SIZE

__all__ = ["KerasTransformerParams", "to_batch_size", "to_on_invalid"]


def to_batch_size(value: Any) -> int:
    """``value`` as a batch size: a positive integer.

    Raises:
        TypeError: not an integer (as Spark's int params).
        ArgumentError: not positive.
    """
    size = TypeConverters.toInt(value)
    if size <= 0:
        raise ArgumentError(f"batchSize must be a positive integer, got {size}")
    return size


def to_on_invalid(value: Any) -> str:
    """``value`` as an ``onInvalid`` policy (``"error"`` or ``"null"``).

    Raises:
        ArgumentError: another string.
    """
    text = TypeConverters.toString(value)
    if text not in ON_INVALID:
        raise ArgumentError(f"onInvalid must be one of {', '.join(map(repr, ON_INVALID))}, "
                            f"got {text!r}")
    return text


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
