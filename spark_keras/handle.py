"""What Spark's BroadcastModel and Dask's DaskModel share: a model that is the original
object on the driver and, in a worker process, the rebuild cached by :mod:`spark_keras.cache`."""

from __future__ import annotations

import uuid
from typing import Any

from .cache import model_cache
from .inference.predictor import Predictor, predictor_for
from .inference.preprocess import Preprocess
from .inference.signature import Signature, signature_of


class ModelHandle:
    """Subclasses set ``_key`` (from :meth:`new_key`), ``_nbytes``, ``_model`` (None in
    workers) and ``_signature``, and implement :meth:`_build`."""

    _key: str
    _nbytes: int
    _model: Any
    _signature: Signature | None
    _preprocess: Preprocess | None = None

    @property
    def preprocess(self) -> Preprocess | None:
        """The Python function run on each batch before the model (``preprocess=``)."""
        return self._preprocess

    @staticmethod
    def new_key(model: Any, prefix: str = "") -> str:
        """A cache key unique to one shipment of ``model``: every front-end's keys are
        made here, so they never collide in a process's cache."""
        return f"{prefix}{type(model).__name__}-{uuid.uuid4().hex[:12]}"

    @property
    def key(self) -> str:
        """The cache key (unique per handle)."""
        return self._key

    @property
    def nbytes(self) -> int:
        """Size of the shipped payload in bytes."""
        return self._nbytes

    @property
    def value(self) -> Any:
        """The Keras model: the original on the driver; in a worker, built once per
        process and cached."""
        if self._model is not None:
            return self._model
        self._check_usable()
        return model_cache.get_or_build(self._key, self._build).value

    @property
    def predictor(self) -> Predictor:
        """The model's compiled inference function (one per model and process)."""
        return predictor_for(self.value)

    @property
    def signature(self) -> Signature:
        """The model's inputs and outputs (names, per-row shapes, dtypes)."""
        if self._signature is None:
            self._signature = signature_of(self._model) if self._model is not None \
                else self.predictor.signature
        return self._signature

    def _check_usable(self) -> None:
        """Called before each use in a worker: raise if this handle can no longer give a
        model (released, say), and release what the driver said to release."""

    def _build(self) -> tuple[Any, int]:
        """``(model, nbytes)`` rebuilt from what was shipped to this process."""
        raise NotImplementedError
