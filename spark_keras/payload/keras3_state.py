"""Capture and restore a Keras 3 model's state exactly as the ``.keras`` format does.

The traversal is Keras's own (``saving_lib._save_state`` / ``_load_state``), so every
variable, every layer's ``save_own_variables`` extras and every asset (adapted
vocabularies, ...) is covered, and ``finalize_state`` runs where Keras runs it. Only the
stores differ: an in-memory store of numpy arrays instead of an HDF5 file.

Rebuilding skips the work Keras's pickle path wastes: variables created while a model is
rebuilt do not run their (random) initializers and are not even allocated until the
payload assigns them, because the payload overwrites them anyway. Any variable the
payload does not cover gets its real initializer afterwards, so the result matches
``keras.saving.load_model``.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from typing import Any, Iterator

import numpy as np
from keras.src import backend, initializers
from keras.src.saving import saving_lib
from keras.src.saving.object_registration import CustomObjectScope
from keras.src.saving.serialization_lib import (
    ObjectSharingScope,
    SafeModeScope,
    deserialize_keras_object,
    serialize_keras_object,
)
from keras.src.utils.backend_utils import in_tf_graph

from spark_keras.errors import PayloadError
from spark_keras.payload.assets import Assets, asset_store, read_tree
from spark_keras.payload.mapped import shared_tensor

Entries = dict[str, dict[str, np.ndarray]]  # saveable path -> {variable key: array}


class MemoryStore(saving_lib.H5IOStore):
    """A dict-backed stand-in for ``H5IOStore`` (Keras type-checks its stores)."""

    def __init__(self, mode: str, entries: Entries | None = None) -> None:  # noqa: D107
        # H5IOStore.__init__ opens an HDF5 file; this store keeps numpy arrays instead.
        self.mode = mode
        self.entries: Entries = {} if entries is None else entries
        self._path = ""
        self._prefixes = {p.rsplit("/", i)[0] for p in self.entries for i in range(p.count("/") + 1)}

    def make(self, path: str, metadata: dict | None = None) -> "MemoryStore":
        self._path = path
        return self

    def get(self, path: str) -> "MemoryStore":
        self._path = path
        return self

    def has_path(self, path: str) -> bool:
        return path in self._prefixes

    def close(self) -> None:
        pass

    def __bool__(self) -> bool:
        return True

    def _group(self) -> dict[str, np.ndarray]:
        return self.entries.get(self._path, {})

    def __len__(self) -> int:
        return len(self._group())

    def keys(self):
        return self._group().keys()

    def __contains__(self, key: object) -> bool:
        return key in self._group()

    def __getitem__(self, key: str) -> np.ndarray:
        return self._group()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        array = _host_array(value)
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            array = array.copy(order="C")
        self.entries.setdefault(self._path, {})[key] = array

    def __delitem__(self, key: str) -> None:
        del self.entries[self._path][key]


def _host_array(value: Any) -> np.ndarray:
    """A variable's value as numpy: with TensorFlow, a read-only view of the variable's
    own buffer where it lives in host memory (no copy: a payload of a large model costs
    no second copy of its weights; TensorFlow copies the buffer before any later write
    to the variable, so the view never changes); else a copy."""
    if backend.backend() == "tensorflow" and isinstance(value, backend.Variable):
        import tensorflow as tf

        tensor = tf.convert_to_tensor(value.value)
        if "CPU" in tensor.device.upper() or not tensor.device:
            view = tensor._numpy()  # TensorFlow's zero-copy view (keeps the tensor alive)
            if isinstance(view, np.ndarray):  # (a 0-d variable gives a numpy scalar)
                view.flags.writeable = False
                return view
    return np.asarray(backend.convert_to_numpy(value))


def serialize_config(model: Any) -> dict[str, Any]:
    with ObjectSharingScope():
        return serialize_keras_object(model)


def capture_state(model: Any, *, include_optimizer: bool) -> tuple[Entries, Assets]:
    """All of ``model``'s saved state: variables by path, and asset files."""
    visited: set[int] = set()
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not (include_optimizer and optimizer.built):
        visited.add(id(optimizer))  # an unbuilt optimizer has no state worth carrying
    store = MemoryStore("w")
    _cache_attr_skipsets()
    with tempfile.TemporaryDirectory(prefix="spark_keras_assets_") as tmp:
        assets_store = saving_lib.DiskIOStore(tmp, mode="r")  # "r": use tmp as-is
        assets_store.mode = "w"
        saving_lib._save_state(model, weights_store=store, assets_store=assets_store,
                               inner_path="", visited_saveables=visited)
        assets = read_tree(tmp)
    return store.entries, assets


# --- rebuilding without running initializers ---------------------------------------

_local = threading.local()
_patch_lock = threading.Lock()
_patched = False


def _install_initializer_patch() -> None:
    """Make variable creation consult a thread-local 'skip initializers' switch.

    While a model is rebuilt, a new variable is left unmaterialized, like Keras's own
    deferred variables: reading it yields zeros (computed on the fly), and its first
    ``assign`` (the payload's value) materializes it, so each weight is allocated once.
    """
    global _patched
    with _patch_lock:
        if _patched:
            return
        variable_cls = backend.Variable
        original_init = variable_cls._initialize_with_initializer
        original_assign = variable_cls.assign
        zeros = initializers.Zeros()

        def _initialize_with_initializer(self, initializer):
            pending = getattr(_local, "pending", None)
            if pending is None:
                return original_init(self, initializer)
            pending[id(self)] = (self, initializer)
            self._value = None
            self._initializer = zeros  # what `.value` returns until assigned

        def assign(self, value):
            pending = getattr(_local, "pending", None)
            if pending and id(self) in pending and self._value is None and in_tf_graph():
                # a layer's call assigning its own state (a counter's assign_add) while
                # Keras traces it to learn its output shape: a symbolic value cannot be a
                # buffer; the variable gets its initializer's value now, outside the trace
                # (as Keras gives it), and the payload's when its turn comes
                _, initializer = pending.pop(id(self))
                self._initializer = None
                with _outside_traces():
                    original_init(self, initializer)
                return original_assign(self, value)
            if pending and pending.pop(id(self), None) is not None and self._value is None:
                tensor = shared_tensor(value, self._dtype) if getattr(_local, "share", False) \
                    else None
                if tensor is None:
                    tensor = self._convert_to_tensor(value, dtype=self._dtype)
                if tuple(tensor.shape) != tuple(self._shape):
                    raise PayloadError(
                        f"payload value for {self.path} has shape {tuple(tensor.shape)}, "
                        f"the variable has shape {tuple(self._shape)}")
                self._initialize(tensor)
                self._initializer = None
                return tensor
            return original_assign(self, value)

        variable_cls._initialize_with_initializer = _initialize_with_initializer
        variable_cls.assign = assign
        _patched = True


def _outside_traces() -> Any:
    """TensorFlow's ``init_scope`` (eager, outside any function being traced) where the
    backend is TensorFlow's, else a scope that does nothing."""
    if backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.init_scope()
    return contextlib.nullcontext()


_SAVEABLE_TYPES = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss")


def _cache_attr_skipsets() -> None:
    """Keras 3 computes a skip set per visited object (instantiating a Layer each time)
    because it caches under one key and reads another; cache under the key it reads."""
    from keras.src.backend.common import global_state

    for obj_type in _SAVEABLE_TYPES:
        key = f"saving_attr_skiplist_{obj_type}"
        if global_state.get_global_attribute(key, None) is None:
            global_state.set_global_attribute(key, saving_lib.get_attr_skipset(obj_type))


@contextlib.contextmanager
def _skipping_initializers(share: bool) -> Iterator[dict[int, tuple[Any, Any]]]:
    """Within: new variables wait for their payload value; with ``share``, a value
    that is a suitable view of a mapped file becomes the variable's buffer itself."""
    _install_initializer_patch()
    outer = getattr(_local, "pending", None), getattr(_local, "share", False)
    pending: dict[int, tuple[Any, Any]] = {}
    _local.pending, _local.share = pending, share
    try:
        yield pending
    finally:
        _local.pending, _local.share = outer


def rebuild(config: dict[str, Any], entries: Entries, assets: Assets, *,
            custom_objects: dict[str, Any] | None, safe_mode: bool,
            before_state: Any = None, share_weights: bool = False) -> Any:
    """A model from its serialized config and captured state. ``config`` is consumed.

    ``before_state`` (if given) is called once the model is built, before any state is
    loaded into it (the payload checksum is verified there). With ``share_weights``,
    variables adopt the arrays of ``entries`` as their buffers where that is safe
    (:mod:`.mapped`); the arrays must then outlive the model (views of a mapping do).
    """
    _cache_attr_skipsets()
    compile_config = config.pop("compile_config", None)
    visited: set[int] = set()
    with contextlib.ExitStack() as stack:
        assets_store = stack.enter_context(asset_store(assets, saving_lib))
        store = MemoryStore("r", entries)
        with _skipping_initializers(share_weights) as pending:
            with ObjectSharingScope():
                model = deserialize_keras_object(config, custom_objects=custom_objects,
                                                 safe_mode=safe_mode)
            if before_state is not None:
                before_state()
            saving_lib._load_state(model, weights_store=store, assets_store=assets_store,
                                   inner_path="", visited_saveables=visited)
            leftovers = list(pending.values())
        # Variables the payload did not cover get what Keras would have given them.
        for variable, initializer in leftovers:
            variable._initializer = None
            variable._initialize_with_initializer(initializer)
        if compile_config:
            # Compile (which builds the optimizer) once the variables are real, then
            # load what only exists in a compiled model: optimizer slots, metrics.
            with CustomObjectScope(custom_objects or {}), SafeModeScope(safe_mode):
                model.compile_from_config(compile_config)
            model.compiled = True
            visited.discard(id(model))
            if not store.has_path("optimizer"):  # it was saved unbuilt: nothing to load
                visited.add(id(model.optimizer))
            saving_lib._load_state(model, weights_store=store, assets_store=assets_store,
                                   inner_path="", visited_saveables=visited)
    return model


# --- checks used by dumps --------------------------------------------------------------

def quiet_autograph(objects: Any) -> None:
    """Nothing to do: Keras 3 does not convert a layer's ``call`` with AutoGraph (tf-keras
    does; its state module quiets it for shipped classes)."""


def check_model_type(model: Any) -> None:
    import keras

    if not isinstance(model, keras.Model):
        raise PayloadError(
            f"expected a Keras 3 keras.Model, got {type(model).__module__}."
            f"{type(model).__qualname__} (tf-keras models need TF_USE_LEGACY_KERAS=1)"
        )


def has_default_config(model: Any) -> bool:
    """A subclassed model whose ``get_config`` is Keras's auto-config."""
    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential
    from keras.src.utils import python_utils

    if isinstance(model, (Functional, Sequential)):
        return False
    return python_utils.is_default(model.get_config)
