"""spark_keras: ship Keras models to Spark, Dask and multiprocessing workers fast and safely.

Importing this package does not import TensorFlow or PySpark; they load on first use.
"""

from __future__ import annotations

from spark_keras import errors as _errors
from spark_keras._version import __version__
from spark_keras.cache import cache_info, configure_cache
from spark_keras.errors import *  # noqa: F401,F403  (every error class, as errors.__all__ lists them)
from spark_keras.payload import dumps, is_payload, load, loads, make_picklable, save

__all__ = [
    "__version__",
    "dumps",
    "loads",
    "save",
    "load",
    "is_payload",
    "make_picklable",
    "cache_info",
    "configure_cache",
    *_errors.__all__,
]


def _has_pyspark() -> bool:
    """Whether PySpark can be found, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec("pyspark") is not None
    except (ImportError, ValueError):  # blocked, or a None placeholder in sys.modules
        return False


# `from spark_keras import *` gives BroadcastModel where PySpark (the `spark` extra) is
# installed, and works without it
if _has_pyspark():
    __all__.append("BroadcastModel")
    __all__.append("KeyedModels")


def __getattr__(name: str):
    # BroadcastModel and KeyedModels need PySpark; import them only when asked for.
    if name == "BroadcastModel":
        from spark_keras.spark import BroadcastModel

        return BroadcastModel
    if name == "KeyedModels":
        from spark_keras.spark.keyed import KeyedModels

        return KeyedModels
    raise AttributeError(f"module 'spark_keras' has no attribute {name!r}")
