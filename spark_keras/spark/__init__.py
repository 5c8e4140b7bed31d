"""Spark integration: BroadcastModel and its scoring helpers."""

from .._deps import require

require("pyspark", "spark_keras.spark (BroadcastModel)")
from .broadcast import BroadcastModel  # noqa: E402

__all__ = ["BroadcastModel"]
