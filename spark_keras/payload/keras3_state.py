"""Capture and restore a Keras 3 model's state exactly as the ``.keras`` format does.

The traversal is Keras's own (``saving_lib._save_state`` / ``_load_state``), so every
variable, every layer's ``save_own_variables`` extras and every asset (adapted
vocabularies, ...) is covered, and ``finalize_state`` runs where Keras runs it. Only the
stores differ: an in-memory store of numpy arrays instead of an HDF5 file.

Rebuilding skips the work Keras's pickle path wastes: variables created while a model is
rebuilt are filled with zeros instead of running their (random) initializers, because
the payload overwrites them. Any variable the payload does not overwrite gets its real
initializer afterwards, so the result matches ``keras.saving.load_model``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from typing import Any, Iterator

import numpy as np
from keras.src import backend, initializers
from keras.src.saving import saving_lib
from keras.src.saving.serialization_lib import (
    ObjectSharingScope,
    deserialize_keras_object,
    serialize_keras_object,
)

Entries = dict[str, dict[str, np.ndarray]]  # saveable path -> {variable key: array}
Assets = dict[str, bytes]  # relative file path -> contents


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

    def keys(self):  # type: ignore[override]
        return self._group().keys()

    def __contains__(self, key: object) -> bool:
        return key in self._group()

    def __getitem__(self, key: str) -> np.ndarray:
        return self._group()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        array = np.asarray(backend.convert_to_numpy(value))
        if not array.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            array = array.copy(order="C")
        self.entries.setdefault(self._path, {})[key] = array

    def __delitem__(self, key: str) -> None:
        del self.entries[self._path][key]


def serialize_config(model: Any) -> dict[str, Any]:
    with ObjectSharingScope():
        return serialize_keras_object(model)


def capture_state(model: Any, *, include_optimizer: bool) -> tuple[Entries, Assets]:
    """All of ``model``'s saved state: variables by path, and asset files."""
    visited: set[int] = set()
    optimizer = getattr(model, "optimizer", None)
    if not include_optimizer and optimizer is not None:
        visited.add(id(optimizer))
    store = MemoryStore("w")
    with tempfile.TemporaryDirectory(prefix="spark_keras_assets_") as tmp:
        assets_store = saving_lib.DiskIOStore(tmp, mode="r")  # "r": use tmp as-is
        assets_store.mode = "w"
        saving_lib._save_state(model, weights_store=store, assets_store=assets_store,
                               inner_path="", visited_saveables=visited)
        assets = _read_tree(tmp)
    return store.entries, assets


def _read_tree(root: str) -> Assets:
    out: Assets = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root).replace(os.sep, "/")] = f.read()
    return out


# --- rebuilding without running initializers ---------------------------------------

_local = threading.local()
_patch_lock = threading.Lock()
_patched = False


def _install_initializer_patch() -> None:
    """Make variable creation consult a thread-local 'skip initializers' switch."""
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
            return original_init(self, zeros)

        def assign(self, value):
            pending = getattr(_local, "pending", None)
            if pending:
                pending.pop(id(self), None)
            return original_assign(self, value)

        variable_cls._initialize_with_initializer = _initialize_with_initializer
        variable_cls.assign = assign
        _patched = True


@contextlib.contextmanager
def _skipping_initializers() -> Iterator[dict[int, tuple[Any, Any]]]:
    _install_initializer_patch()
    outer = getattr(_local, "pending", None)
    pending: dict[int, tuple[Any, Any]] = {}
    _local.pending = pending
    try:
        yield pending
    finally:
        _local.pending = outer


def rebuild(config: dict[str, Any], entries: Entries, assets: Assets, *,
            custom_objects: dict[str, Any] | None, safe_mode: bool) -> Any:
    """A model from its serialized config and captured state. ``config`` is consumed."""
    with _skipping_initializers() as pending:
        with ObjectSharingScope():
            model = deserialize_keras_object(config, custom_objects=custom_objects,
                                             safe_mode=safe_mode)
        store = MemoryStore("r", entries)
        with contextlib.ExitStack() as stack:
            assets_store = None
            if assets:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="spark_keras_assets_"))
                _write_tree(tmp, assets)
                assets_store = saving_lib.DiskIOStore(tmp, mode="r")
            saving_lib._load_state(model, weights_store=store, assets_store=assets_store,
                                   inner_path="", visited_saveables=set())
        leftovers = list(pending.values())
    # Variables the payload did not cover get what Keras would have given them.
    for variable, initializer in leftovers:
        variable.assign(initializer(variable.shape, dtype=variable.dtype))
    return model


def _write_tree(root: str, assets: Assets) -> None:
    real_root = os.path.realpath(root)
    for rel, data in assets.items():
        full = os.path.realpath(os.path.join(root, rel))
        if not full.startswith(real_root + os.sep):
            from ..errors import PayloadError

            raise PayloadError(f"payload corrupted: asset path {rel!r} escapes the asset folder")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)


# --- checks used by dumps --------------------------------------------------------------

def check_model_type(model: Any) -> None:
    import keras

    if not isinstance(model, keras.Model):
        from ..errors import PayloadError

        raise PayloadError(
            f"expected a Keras 3 keras.Model, got {type(model).__module__}."
            f"{type(model).__qualname__} (tf-keras models need TF_USE_LEGACY_KERAS=1)"
        )


def relies_on_auto_config(model: Any) -> bool:
    """A subclassed model using Keras's auto-config, whose constructor takes arguments."""
    import inspect

    from keras.src.models.functional import Functional
    from keras.src.models.sequential import Sequential
    from keras.src.utils import python_utils

    if isinstance(model, (Functional, Sequential)):
        return False
    if not python_utils.is_default(model.get_config):
        return False
    params = inspect.signature(type(model).__init__).parameters.values()
    return any(p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


def sample_inputs(model: Any) -> Any:
    """Random inputs shaped like the model's recorded build input shape."""
    import keras

    build_config = model.get_build_config() or {}
    shape = build_config.get("input_shape")
    if shape is None:
        raise ValueError("the model records no input shape (was it built?)")
    rng = np.random.default_rng(0)

    def make(s):
        dims = [2 if d is None else int(d) for d in s]
        return rng.standard_normal(dims).astype(keras.backend.floatx())

    def is_shape(s):
        return isinstance(s, (list, tuple)) and all(d is None or isinstance(d, int) for d in s)

    if is_shape(shape):
        return make(shape)
    if isinstance(shape, dict):
        return {k: make(v) for k, v in shape.items()}
    return [make(s) for s in shape]


def same_outputs(a: Any, b: Any, x: Any) -> bool:
    import keras

    out_a = keras.tree.flatten(a(x, training=False))
    out_b = keras.tree.flatten(b(x, training=False))
    return len(out_a) == len(out_b) and all(
        np.shape(u) == np.shape(v)
        and np.allclose(keras.ops.convert_to_numpy(u), keras.ops.convert_to_numpy(v),
                        atol=1e-6, equal_nan=True)
        for u, v in zip(out_a, out_b))
