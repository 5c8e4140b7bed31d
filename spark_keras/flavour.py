"""Which Keras this process runs: Keras 3 or legacy tf-keras 2.x.

The flavour is fixed when Keras is first imported (``TF_USE_LEGACY_KERAS=1`` selects
tf-keras), so it is read once and recorded in every payload header.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

KERAS3 = "keras3"
TF_KERAS = "tf_keras"


@dataclass(frozen=True)
class Flavour:
    name: str  # KERAS3 or TF_KERAS
    version: str
    backend: str
    module: ModuleType


def legacy_requested() -> bool:
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


@functools.lru_cache(maxsize=None)
def current() -> Flavour:
    """The Keras flavour of this process (imports Keras on first call)."""
    if legacy_requested():
        import tf_keras

        return Flavour(TF_KERAS, tf_keras.__version__, "tensorflow", tf_keras)
    import keras

    return Flavour(KERAS3, keras.__version__, keras.backend.backend(), keras)


def how_to_match(flavour_name: str) -> str:
    """A one-line hint telling how to make this process use ``flavour_name``."""
    if flavour_name == TF_KERAS:
        return (
            "set TF_USE_LEGACY_KERAS=1 and install tf-keras in this process (on Spark: "
            "spark.executorEnv.TF_USE_LEGACY_KERAS=1 and spark.yarn.appMasterEnv / driver env)"
        )
    return (
        "unset TF_USE_LEGACY_KERAS (or set it to 0) so Keras 3 is used (on Spark: "
        "spark.executorEnv.TF_USE_LEGACY_KERAS=0)"
    )


def flatten(structure: Any) -> list[Any]:
    """The leaves of a nested structure of tensors (dicts in sorted-key order)."""
    fl = current()
    if fl.name == TF_KERAS:
        import tensorflow as tf

        return tf.nest.flatten(structure)
    return fl.module.tree.flatten(structure)


def to_numpy(tensor: Any) -> np.ndarray:
    """A backend tensor (or array) as a numpy array."""
    fl = current()
    if fl.name == TF_KERAS:
        return np.asarray(tensor)
    return np.asarray(fl.module.ops.convert_to_numpy(tensor))


def dtype_name(dtype: Any) -> str:
    """``"float32"`` for a Keras 3 dtype string or a ``tf.DType`` alike."""
    return dtype if isinstance(dtype, str) else str(getattr(dtype, "name", dtype))
