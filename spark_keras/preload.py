"""What a worker imports before its first task: Keras (tf-keras under
``TF_USE_LEGACY_KERAS=1``, with the backend ``KERAS_BACKEND`` selects) and the modules
named in ``SPARK_KERAS_PRELOAD`` (comma-separated: the modules defining your custom
layers and models). Used by the Dask preload hook and the Spark daemon."""

from __future__ import annotations

import importlib
import os

from spark_keras import flavour
from spark_keras.errors import SparkKerasError

PRELOAD_ENV = "SPARK_KERAS_PRELOAD"


def preload_names() -> list[str]:
    """The modules ``SPARK_KERAS_PRELOAD`` names, in order."""
    return [n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(",") if n.strip()]


def preload() -> list[str]:
    """Import Keras and the ``SPARK_KERAS_PRELOAD`` modules; the names imported.

    Raises:
        SparkKerasError: a listed module cannot be imported.
    """
    flavour.current()  # imports Keras (or tf-keras), and its backend, quietly
    names = preload_names()
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise SparkKerasError(f"cannot preload {name!r} (from {PRELOAD_ENV}): "
                                  f"{type(exc).__name__}: {exc}") from exc
    return names
