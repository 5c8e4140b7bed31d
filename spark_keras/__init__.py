"""spark_keras: ship Keras models to Spark, Dask and multiprocessing workers fast and safely.

Importing this package does not import TensorFlow or PySpark; they load on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import ModelInputError, PayloadError, SparkKerasError  # noqa: E402
from .payload import dumps, is_payload, load, loads, make_picklable, save  # noqa: E402

__all__ = [
    "__version__",
    "dumps",
    "loads",
    "save",
    "load",
    "is_payload",
    "make_picklable",
    "SparkKerasError",
    "PayloadError",
    "ModelInputError",
]
