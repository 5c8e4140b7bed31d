"""Every error spark_keras raises on purpose derives from :class:`SparkKerasError`."""

from __future__ import annotations

__all__ = ["SparkKerasError", "PayloadError", "PayloadChangedError", "StorageError",
           "LocalWriteError", "ModelInputError", "ModelCallError", "InvalidRowsError",
           "ModelError", "ArgumentError", "ArgumentTypeError", "PreprocessError",
           "MissingDependencyError", "ChannelError", "ChannelTrustError",
           "WorkersPythonError"]


class SparkKerasError(Exception):
    """Base class of all spark_keras errors."""


class PayloadError(SparkKerasError, ValueError):
    """A model payload is corrupted, truncated, incompatible or cannot be written."""


class PayloadChangedError(PayloadError):
    """A model file in storage is no longer the one the driver read (replaced since)."""


class StorageError(SparkKerasError, OSError):
    """A model file cannot be read from where it is stored (missing, unreachable, denied)."""


class LocalWriteError(StorageError):
    """A payload file cannot be written in this host's folder (disk full, read-only,
    permission denied): the folder is at fault, not the payload or where it comes from."""


class ModelInputError(SparkKerasError, ValueError):
    """Data handed to a model does not match its inputs (column, shape, dtype, nulls)."""


class PreprocessError(ModelInputError):
    """A user's ``preprocess`` function failed or returned something the model cannot take."""


class ModelCallError(ModelInputError):
    """The model raised on one row alone (a corrupt image its graph decodes, a failed
    ``tf.debugging`` assertion, a sequence longer than it allows): the message names the
    row, its input column(s) and the model's own message."""


class InvalidRowsError(ModelInputError):
    """More rows were invalid than ``max_invalid`` allows."""


class ModelError(SparkKerasError, ValueError):
    """A model spark_keras cannot work with as it is (not built, unknown input shape)."""


class MissingDependencyError(SparkKerasError, ImportError):
    """A part of spark_keras needs a package that is not installed; the message names
    the ``pip install 'spark-keras[extra]'`` that installs it."""


class ArgumentError(SparkKerasError, ValueError):
    """An argument has a value spark_keras does not accept."""


class ArgumentTypeError(SparkKerasError, TypeError):
    """An argument is of a type spark_keras does not accept."""


class WorkersPythonError(SparkKerasError):
    """Spark's Python workers cannot run spark_keras: their interpreter lacks the package
    or has another PySpark major.minor than the driver's. Nothing was scored."""


class ChannelError(SparkKerasError):
    """The driver's channel failed in transit (driver unreachable, connection reset or
    timed out, an answer cut short): not a local disk error; trying again may work."""


class ChannelTrustError(SparkKerasError):
    """The driver's channel could not be trusted: the server showed another certificate
    than the driver's, pinned in the handle (something on the path intercepts it, or
    another process holds the driver's port). Nothing was sent to it."""
