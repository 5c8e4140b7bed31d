"""spark_keras: ship Keras models to Spark, Dask and multiprocessing workers fast and safely.

Importing this package does not import TensorFlow or PySpark; they load on first use.
"""

from __future__ import annotations

from ._version import __version__

from .cache import cache_info, configure_cache  # noqa: E402
from .errors import (  # noqa: E402
    ArgumentError,
    ArgumentTypeError,
    ModelError,
    MissingDependencyError,
    ModelInputError,
    PayloadError,
    PreprocessError,
    SparkKerasError,
    StorageError,
)
from .payload import dumps, is_payload, load, loads, make_picklable, save  # noqa: E402

__all__ = [
    "__version__",
    "dumps",
    "loads",
    "save",
    "load",
    "is_payload",
    "make_picklable",
    "BroadcastModel",
    "cache_info",
    "configure_cache",
    "SparkKerasError",
    "PayloadError",
    "StorageError",
    "ModelInputError",
    "PreprocessError",
    "MissingDependencyError",
    "ModelError",
    "ArgumentError",
    "ArgumentTypeError",
]


def __getattr__(name: str):
    # BroadcastModel needs PySpark; import it only when asked for.
    if name == "BroadcastModel":
        from .spark import BroadcastModel

        return BroadcastModel
    raise AttributeError(f"module 'spark_keras' has no attribute {name!r}")
