"""The state module of a Keras runtime: how its models' config and state are captured
and rebuilt (:mod:`.keras3_state` for Keras 3, :mod:`.tf_keras_state` for tf-keras).

Both modules offer the same functions (``check_model_type``, ``serialize_config``,
``capture_state``, ``rebuild``, ``has_default_config``, ``quiet_autograph``); each is
imported on first use, as it imports its Keras.
"""

from __future__ import annotations

from types import ModuleType

from spark_keras import flavour
from spark_keras.errors import PayloadError


def of(runtime: flavour.Runtime) -> ModuleType:
    """The state module of ``runtime`` (picked by its flavour name).

    Raises:
        PayloadError: no state module serves the runtime's flavour.
    """
    if runtime.name == flavour.KERAS3:
        from spark_keras.payload import keras3_state

        return keras3_state
    if runtime.name == flavour.TF_KERAS:
        from spark_keras.payload import tf_keras_state

        return tf_keras_state
    raise PayloadError(f"no model state module for Keras flavour {runtime.name!r}")


def current() -> ModuleType:
    """The state module of this process's Keras (:func:`spark_keras.flavour.current`)."""
    return of(flavour.current())
