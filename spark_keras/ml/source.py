"""A :class:`~spark_keras.ml.KerasTransformer`'s model: what it was built from, shared by
the stage's copies, and the :class:`~spark_keras.BroadcastModel` shipping it."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Mapping

from spark_keras import storage
from spark_keras.errors import ArgumentTypeError, PayloadError, StorageError
from spark_keras.executor.transport import is_connect

if TYPE_CHECKING:
    from spark_keras.spark.broadcast import BroadcastModel

__all__ = ["ModelSource", "PAYLOAD_FILE"]

logger = logging.getLogger("spark_keras")

PAYLOAD_FILE = "payload.skp"  # a stage's payload file, in its saved folder


class ModelSource:
    """A stage's model, shared by the stage's copies: what it was built from, and the
    BroadcastModel that ships it (created on first use, for one session at a time)."""

    def __init__(self, *, model: Any = None, location: str | None = None,
                 payload: bytes | None = None, handle: "BroadcastModel | None" = None,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 share_weights: bool = True, preprocess: Any = None,
                 saved_at: str | None = None) -> None:
        self._model = model
        self._location = location
        self._payload = payload
        self._given = handle
        self._options = {"custom_objects": custom_objects, "safe_mode": safe_mode,
                         "share_weights": share_weights, "preprocess": preprocess}
        self._saved_at = saved_at  # the stage folder this source was loaded from
        self._handle: "BroadcastModel | None" = None
        self._owner: tuple | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, model: Any, *, custom_objects: Mapping[str, Any] | None = None,
           safe_mode: bool = True, share_weights: bool = True,
           preprocess: Any = None) -> "ModelSource":
        """The source of ``model``, as ``KerasTransformer(model=...)`` takes it.

        Raises:
            StorageError: a model file that does not exist.
            PayloadError: bytes that are not a payload.
            ArgumentTypeError: anything else that is not a Keras model.
        """
        from spark_keras.payload import codec
        from spark_keras.spark.broadcast import BroadcastModel

        options = {"custom_objects": custom_objects, "safe_mode": safe_mode,
                   "share_weights": share_weights, "preprocess": preprocess}
        if isinstance(model, BroadcastModel):
            return cls(handle=model, **options)
        if isinstance(model, (str, os.PathLike)):
            location = os.fspath(model)
            if not storage.is_uri(location) and not os.path.isfile(location):
                raise StorageError(f"model file {location!r} does not exist")
            return cls(location=location, **options)
        if isinstance(model, (bytes, bytearray, memoryview)):
            if not codec.is_payload(model):
                raise PayloadError("model bytes are not a spark_keras payload (spark_keras.dumps)")
            return cls(payload=bytes(model), **options)
        if not (hasattr(model, "get_config") and callable(model)):
            raise ArgumentTypeError(
                f"model must be a Keras model, a .keras or payload file path or URI, payload "
                f"bytes or a BroadcastModel; got {type(model).__name__}")
        return cls(model=model, **options)

    def __deepcopy__(self, memo: dict) -> "ModelSource":
        return self  # the model is shared, never copied

    # --- shipping -------------------------------------------------------------------------

    def handle_for(self, spark: Any, uid: str) -> "BroadcastModel":
        """The BroadcastModel for ``spark``'s executors: the one given, else the one made
        for this session (or SparkContext) earlier, else a new one."""
        if self._given is not None:
            return self._given
        owner = _owner(spark)
        with self._lock:
            if self._handle is None or self._owner != owner:
                if self._handle is not None:
                    logger.info("%s: a DataFrame of another Spark session; shipping the "
                                "model again", uid)
                self._handle, self._owner = self._ship(spark), owner
                logger.info("%s: model shipped as %s", uid, self._handle.key)
            return self._handle

    def _ship(self, spark: Any) -> "BroadcastModel":
        try:
            return self._new_handle(spark)
        except PayloadError as exc:
            if self._saved_at is None:
                raise
            raise PayloadError(
                f"the model of the KerasTransformer saved at {self._saved_at!r} cannot be "
                f"rebuilt here. A loaded stage rebuilds with safe_mode=True, and its "
                f"custom classes must be registered (@keras.saving."
                f"register_keras_serializable) in a module imported before it transforms "
                f"data. {exc}") from exc

    def _new_handle(self, spark: Any) -> "BroadcastModel":
        from spark_keras.spark.broadcast import BroadcastModel

        if self._model is not None:
            return BroadcastModel(spark, self._model, **self._options)
        if self._location is not None:
            return BroadcastModel(spark, self._location, **self._options)
        # payload bytes: through a file, so that the BroadcastModel ships these very bytes
        assert self._payload is not None  # a source holds one of a model, location or payload
        with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:
            path = os.path.join(tmp, PAYLOAD_FILE)
            with open(path, "wb") as f:
                f.write(self._payload)
            return BroadcastModel(spark, path, **self._options)

    # --- the model and its payload on the driver -------------------------------------------

    def model(self) -> Any:
        """The Keras model, on the driver (built from the payload or file if need be)."""
        from spark_keras.payload import codec
        from spark_keras.payload.stored import open_model

        if self._model is not None:
            return self._model
        handle = self._given if self._given is not None else self._handle
        if handle is not None:
            return handle.value
        loads_options = {"custom_objects": self._options["custom_objects"],
                         "safe_mode": self._options["safe_mode"]}
        if self._payload is not None:
            return codec.loads(self._payload, **loads_options)
        return open_model(self._location, **loads_options)[0]

    def payload(self) -> bytes:
        """The model's payload, for saving: the bytes or payload file given as is; a
        model (or a BroadcastModel's) and a ``.keras`` file serialized here."""
        from spark_keras.payload import codec
        from spark_keras.payload.stored import open_model

        if self._payload is not None:
            return self._payload
        if self._location is not None:
            data = storage.read(self._location)
            if codec.is_payload(data):
                return data
            return open_model(self._location,  # a .keras file, converted
                              custom_objects=self._options["custom_objects"],
                              safe_mode=self._options["safe_mode"])[1]
        if self._model is not None:
            return codec.dumps(self._model, custom_objects=self._options["custom_objects"])
        assert self._given is not None  # none of the others: the source is a BroadcastModel
        recipe = getattr(self._given, "_recipe", None)
        objects = recipe.custom_objects() if recipe is not None else None
        return codec.dumps(self._given.value, custom_objects=objects)


def _owner(spark: Any) -> tuple:
    """What a BroadcastModel belongs to: a Connect session, or a SparkContext (which
    every classic session of the application shares)."""
    if is_connect(spark):
        return ("connect", spark.session_id)
    return ("classic", getattr(spark, "sparkContext", spark))
