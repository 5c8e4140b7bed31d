"""What Spark's BroadcastModel, Dask's DaskModel and the pool's PoolModel share: a model
that is the original object on the driver and, in a worker process, the rebuild cached by
:mod:`spark_keras.cache`; the extension point for another front-end."""

from __future__ import annotations

import uuid
from typing import Any, Callable

from spark_keras.cache import model_cache
from spark_keras.inference.predictor import Predictor, predictor_for
from spark_keras.inference.preprocess import Preprocess
from spark_keras.inference.signature import Signature, signature_of


class ModelHandle:
    """A model shipped to worker processes, as the scoring engine
    (:func:`spark_keras.inference.engine.score`) and the Spark front-ends take it.

    A new front-end (another cluster, another way of carrying the payload) subclasses it:

    * ``__init__`` calls ``super().__init__(key, nbytes, model=model, preprocess=...)``
      with a key from :meth:`new_key` and the payload's size; ``model`` is the Keras
      model on the driver and ``None`` in a worker (a handle unpickled there).
    * :meth:`build_model` (required): in a worker, rebuild the model from what was
      shipped to this process, for instance with
      :meth:`~spark_keras.payload.shipment.Shipment.build` or
      :meth:`~spark_keras.payload.shipment.Shipment.build_shared`; it returns
      ``(model, nbytes)`` or ``(model, nbytes, memory)`` (see
      :meth:`~spark_keras.cache.ModelCache.get_or_build`).
    * :meth:`check_usable` (optional): raise if the handle can no longer give a model
      (released, say); it runs in a worker before each use of the model.
    * Pickling is the subclass's: what a task carries must not hold the driver's model
      (``model=None`` once unpickled), only what :meth:`build_model` needs to find the
      payload in the worker (the payload itself, or where it waits).

    In return the subclass gets :attr:`key`, :attr:`nbytes`, :attr:`preprocess`,
    :attr:`value` (the driver's model, or the worker's rebuild: built once per process
    and key, and cached), :attr:`predictor` (the compiled inference function the engine
    calls) and :attr:`signature` (the driver's, or read from the rebuilt model).

    Args:
        key: the cache key, unique per shipment (:meth:`new_key`).
        nbytes: the size of the shipped payload in bytes.
        model: the Keras model, on the driver; ``None`` in a worker.
        signature: the model's signature if known (else read from the model on use).
        preprocess: a function run on each batch before the model (``preprocess=``).
    """

    _key: str
    _nbytes: int
    _model: Any
    _signature: Signature | None
    _preprocess: Preprocess | None = None
    # how image columns of another size than the model's input are resized (None: such
    # rows are invalid); see spark_keras.inference.images
    resize: str | None = None

    def __init__(self, key: str, nbytes: int, *, model: Any = None,
                 signature: Signature | None = None,
                 preprocess: Callable[[Any], Any] | Preprocess | None = None) -> None:
        self._key, self._nbytes, self._model = key, nbytes, model
        self._signature = signature
        self._preprocess = Preprocess.of(preprocess)

    def build_model(self) -> tuple:
        """In a worker: rebuild the model from what was shipped to this process. Called
        once per process and key (again after a cache eviction).

        Returns:
            ``(model, nbytes)`` or ``(model, nbytes, memory)`` (see
            :meth:`~spark_keras.cache.ModelCache.get_or_build`).

        Raises:
            NotImplementedError: the subclass did not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} implements build_model()")

    def check_usable(self) -> None:
        """Called in a worker before each use of the model: raise if this handle can no
        longer give one (released, say), and release what the driver said to release."""

    def for_task(self) -> "ModelHandle":
        """This handle as the version the running task scores with.

        Returns:
            The handle of that version (a front-end with versions); by default the
            handle itself.
        """
        return self

    @property
    def version(self) -> str:
        """The label of the model version this handle scores with."""
        return "1"

    @property
    def preprocess(self) -> Preprocess | None:
        """The Python function run on each batch before the model (``preprocess=``)."""
        return self._preprocess

    @staticmethod
    def new_key(model: Any, prefix: str = "") -> str:
        """A cache key unique to one shipment of ``model``: every front-end's keys are
        made here, so they never collide in a process's cache.

        Args:
            model: the model shipped (its class names the key).
            prefix: put before the key (a front-end's own mark).

        Returns:
            ``<prefix><model class>-<12 hex digits>``.
        """
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
        process (:meth:`build_model`) and cached."""
        if self._model is not None:
            return self._model
        self.check_usable()
        return model_cache.get_or_build(self._key, self.build_model).value

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
