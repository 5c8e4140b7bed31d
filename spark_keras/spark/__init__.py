"""Spark integration: BroadcastModel and its scoring helpers.

Importing this package imports nothing heavy: ``python -m spark_keras.executor.daemon`` must
start with no other thread (pyarrow's allocator starts one when it loads), so
:class:`BroadcastModel` and PySpark load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BroadcastModel"]


def __getattr__(name: str) -> Any:
    if name == "BroadcastModel":
        from spark_keras._deps import require

        require("pyspark", "spark_keras.spark (BroadcastModel)")
        from spark_keras.spark.broadcast import BroadcastModel

        return BroadcastModel
    raise AttributeError(f"module 'spark_keras.spark' has no attribute {name!r}")
