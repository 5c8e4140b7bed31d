"""Every error spark_keras raises on purpose derives from :class:`SparkKerasError`."""

from __future__ import annotations

__all__ = ["SparkKerasError", "PayloadError", "ModelInputError"]


class SparkKerasError(Exception):
    """Base class of all spark_keras errors."""


class PayloadError(SparkKerasError, ValueError):
    """A model payload is corrupted, truncated, incompatible or cannot be written."""


class ModelInputError(SparkKerasError, ValueError):
    """Data handed to a model does not match its inputs (column, shape, dtype, nulls)."""
