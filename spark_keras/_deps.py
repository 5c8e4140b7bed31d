"""Optional dependencies: one clear error naming the extra that installs a missing one.

The base install (``pip install spark-keras``) brings Keras but no TensorFlow and no
PySpark, so that a cluster keeps its own (a GPU ``tensorflow``, a Databricks runtime's
PySpark). Each part imports what it needs through :func:`require`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from spark_keras.errors import MissingDependencyError

__all__ = ["MissingDependencyError", "EXTRAS", "require"]

# top-level module -> the extra of spark-keras that installs it
EXTRAS: dict[str, str] = {
    "pyspark": "spark",
    "py4j": "spark",
    "grpc": "connect",
    "grpc_status": "connect",
    "google": "connect",
    "zstandard": "connect",
    "tensorflow": "tensorflow",  # or tensorflow-cpu: both install the `tensorflow` module
    "tf_keras": "legacy",
    "dask": "dask",
    "distributed": "dask",
    "keras_hub": "hub",
    "PIL": "images",
    "keras": "tensorflow",  # in the base install; a broken one is reinstalled with it
}


def _advice(extra: str | None, missing: str) -> str:
    if extra is None:
        return f"pip install {missing}"
    if extra == "tensorflow":
        return ("pip install 'spark-keras[tensorflow]' (or 'spark-keras[tensorflow-cpu]'; "
                "or keep the TensorFlow your cluster already has)")
    return f"pip install 'spark-keras[{extra}]'"


def require(module: str, needed_by: str | None = None, extra: str | None = None) -> ModuleType:
    """Import ``module`` (a dotted name) and return it.

    ``extra`` names the extra that installs what ``module`` needs when that is not the
    extra of its top-level package (``pyspark.sql.connect`` needs ``connect``).

    Raises:
        MissingDependencyError: ``module``, or a package it imports (TensorFlow under
            Keras), is not installed or cannot be imported; the message names the
            package, what needs it and the extra that installs it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise _missing(module, needed_by, extra, exc) from exc


def _missing(module: str, needed_by: str | None, extra: str | None,
             exc: ImportError) -> MissingDependencyError:
    if isinstance(exc, ModuleNotFoundError):
        missing = (exc.name or module).split(".")[0]
        via = "" if missing == module.split(".")[0] else f" (imported by {module})"
        reason = f"the Python package {missing!r}{via}, which is not installed"
    else:  # a package's own check (PySpark's, of Spark Connect's gRPC packages...)
        missing = module.split(".")[0]
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = f"{module!r}, which cannot be imported ({first})"
    advice = _advice(extra or EXTRAS.get(missing), missing)
    return MissingDependencyError(f"{needed_by or f'`import {module}`'} needs {reason}: "
                                  f"{advice}", name=missing)
