"""Capture and restore a legacy tf-keras 2.x model's state as its ``.keras`` format does.

Used when the process runs tf-keras (``TF_USE_LEGACY_KERAS=1``). The traversal is
tf-keras's own (``saving_lib._save_state`` / ``_load_state``, with its "v3 saving" switch
on, as ``model.save("x.keras")`` sets it), so variables, ``save_own_variables`` extras and
assets are covered; only the stores differ (dicts of numpy arrays instead of HDF5).

One improvement over tf-keras's ``load_model``: it restores a compiled model's optimizer
slots (tf-keras builds optimizers lazily, so its loader skips them with a warning).

Another: classes that arrived by value (cloudpickled from the driver's ``__main__``) do not
make AutoGraph warn that their source code cannot be found (:func:`quiet_autograph`).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import tempfile
from typing import Any, Iterator, Mapping

import numpy as np
from tf_keras.src.saving import saving_lib
from tf_keras.src.saving.object_registration import CustomObjectScope
from tf_keras.src.saving.serialization_lib import (
    ObjectSharingScope,
    SafeModeScope,
    deserialize_keras_object,
    serialize_keras_object,
)

from spark_keras.errors import PayloadError
from spark_keras.payload.assets import Assets, asset_store, read_tree

logger = logging.getLogger("spark_keras")

Entries = dict[str, dict[str, np.ndarray]]  # trackable path -> {variable key: array}
_OPTIMIZER_PATH = "optimizer"


class _Group(dict):
    """One trackable's variables; values are stored as C-contiguous numpy arrays."""

    def __setitem__(self, key: str, value: Any) -> None:
        array = np.asarray(value)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        super().__setitem__(key, array)


class MemoryStore:
    """The weights store tf-keras's traversal writes to and reads from, in memory."""

    def __init__(self, entries: Entries | None = None) -> None:
        self.entries: Entries = {} if entries is None else entries

    def make(self, path: str) -> _Group:
        group = _Group()
        self.entries[path] = group
        return group

    def get(self, path: str) -> dict[str, np.ndarray]:
        return self.entries.get(path, {})


@contextlib.contextmanager
def _v3_saving() -> Iterator[None]:
    """What ``model.save("x.keras")`` switches on around serialization."""
    flag = saving_lib._SAVING_V3_ENABLED
    before = getattr(flag, "value", False)
    flag.value = True
    try:
        yield
    finally:
        flag.value = before


def serialize_config(model: Any) -> dict[str, Any]:
    with _v3_saving(), ObjectSharingScope():
        return serialize_keras_object(model)


def capture_state(model: Any, *, include_optimizer: bool) -> tuple[Entries, Assets]:
    """All of ``model``'s saved state: variables by path, and asset files."""
    visited: set[int] = set()
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not (include_optimizer and getattr(optimizer, "_built", False)):
        visited.add(id(optimizer))  # an unbuilt optimizer has no state worth carrying
    store = MemoryStore()
    with _v3_saving(), tempfile.TemporaryDirectory(prefix="spark_keras_assets_") as tmp:
        assets_store = saving_lib.DiskIOStore(tmp, mode="r")  # "r": use tmp as-is
        assets_store.mode = "w"
        saving_lib._save_state(model, weights_store=store, assets_store=assets_store,
                               inner_path="", visited_trackables=visited)
        assets = read_tree(tmp)
    return {path: dict(group) for path, group in store.entries.items() if group}, assets


def rebuild(config: dict[str, Any], entries: Entries, assets: Assets, *,
            custom_objects: dict[str, Any] | None, safe_mode: bool,
            before_state: Any = None) -> Any:
    """A model from its serialized config and captured state. ``config`` is consumed.

    ``before_state`` (if given) is called once the model is built, before any state is
    loaded into it (the payload checksum is verified there).
    """
    compile_config = config.pop("compile_config", None)
    quiet_autograph(custom_objects)
    visited: set[int] = set()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_v3_saving())
        assets_store = stack.enter_context(asset_store(assets, saving_lib))
        store = MemoryStore(entries)
        model = _from_config(config, custom_objects, safe_mode)
        if before_state is not None:
            before_state()
        saving_lib._load_state(model, weights_store=store, assets_store=assets_store,
                               inner_path="", visited_trackables=visited)
        if compile_config:
            with CustomObjectScope(custom_objects or {}), SafeModeScope(safe_mode):
                model.compile_from_config(compile_config)
            _restore_optimizer(model, store, assets_store, visited)
    return model


def _from_config(config: dict[str, Any], custom_objects: Any, safe_mode: bool) -> Any:
    """The model (untrained) its config describes; shared objects built once."""
    with ObjectSharingScope():
        return deserialize_keras_object(config, custom_objects=custom_objects,
                                        safe_mode=safe_mode)


def quiet_autograph(objects: Mapping[str, Any] | None) -> None:
    """Let AutoGraph run the shipped classes' methods whose source code this process
    cannot read as they are, without first trying to convert them and warning.

    tf-keras converts a subclassed layer's (or model's) ``call`` with AutoGraph whenever it
    is called in a graph: while a functional model is rebuilt, in ``model.predict``...
    AutoGraph needs the function's source code. A class defined in the driver's
    ``__main__`` arrives by value (cloudpickle), and its source file is usually not on the
    worker (another host, a notebook, ``python -c``, a deleted file), so AutoGraph logs
    "AutoGraph could not transform <bound method ...> and will run it as-is. Cause: Unable
    to locate the source code ..." (or "... could not get source code") once per method
    and process, then calls the method unconverted. Marking such functions as AutoGraph
    artifacts (what ``tf.autograph.experimental.do_not_convert``'s wrapper is) makes it
    call them unconverted straight away: the same computation, no warning, no wrapper
    (the method object and signature are unchanged). Functions whose source is readable
    are left alone, so AutoGraph converts them as it always did. Works in place on the
    classes and functions of ``objects`` (and their non-Keras base classes).
    """
    if not objects:
        return
    api = sys.modules.get("tensorflow.python.autograph.impl.api")
    inspect_utils = sys.modules.get("tensorflow.python.autograph.pyct.inspect_utils")
    if api is None or inspect_utils is None:  # AutoGraph not loaded: nothing will convert
        return
    seen: set[int] = set()
    for obj in objects.values():
        for function in _own_functions(obj):
            if id(function) in seen or api.is_autograph_artifact(function):
                continue
            seen.add(id(function))
            if os.path.isfile(function.__code__.co_filename):
                continue  # a source file to read (the common case, checked cheaply)
            try:
                inspect_utils.getimmediatesource(function)  # what AutoGraph reads
            except OSError:
                api.autograph_artifact(function)
            except Exception:  # noqa: BLE001  (AutoGraph would fail otherwise: leave it)
                pass


_LIBRARY_MODULES = ("tf_keras.", "keras.", "tensorflow.", "builtins")


def _own_functions(obj: Any) -> Iterator[Any]:
    """The plain functions ``obj`` is or defines (a class: its methods and those of its
    bases, Keras's own classes excepted)."""
    if inspect.isfunction(obj):
        yield obj
        return
    if not isinstance(obj, type):
        return
    for klass in obj.__mro__:
        module = getattr(klass, "__module__", "") or ""
        if klass is object or module.startswith(_LIBRARY_MODULES):
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if inspect.isfunction(value):
                yield value


def _restore_optimizer(model: Any, store: MemoryStore, assets_store: Any,
                       visited: set[int]) -> None:
    """Build the freshly compiled model's optimizer and load its saved slots, if any."""
    optimizer = getattr(model, "optimizer", None)
    saved = store.get(_OPTIMIZER_PATH)
    if optimizer is None or not saved:
        return
    optimizer.build(model.trainable_variables)
    if len(saved) != len(optimizer.variables):
        raise PayloadError(
            f"the payload holds {len(saved)} optimizer variables but the rebuilt "
            f"{type(optimizer).__name__} has {len(optimizer.variables)}")
    visited.discard(id(model))
    saving_lib._load_state(model, weights_store=store, assets_store=assets_store,
                           inner_path="", visited_trackables=visited)


# --- checks used by dumps --------------------------------------------------------------

def check_model_type(model: Any) -> None:
    import tf_keras

    if not isinstance(model, tf_keras.Model):
        raise PayloadError(
            f"expected a tf-keras Model (this process runs tf-keras: TF_USE_LEGACY_KERAS=1), "
            f"got {type(model).__module__}.{type(model).__qualname__} (Keras 3 models need "
            f"TF_USE_LEGACY_KERAS unset)"
        )


def has_default_config(model: Any) -> bool:
    """A subclassed model whose ``get_config`` is tf-keras's auto-config."""
    from tf_keras.src.engine.functional import Functional
    from tf_keras.src.utils import generic_utils

    if isinstance(model, Functional):  # Sequential included
        return False
    return generic_utils.is_default(model.get_config)
