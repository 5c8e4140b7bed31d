"""The score job's ``--import MODULE`` (repeatable): the user's own modules, those that
define (and register, ``@keras.saving.register_keras_serializable``) the model's custom
layers and functions.

* On the driver each is imported before the model is loaded (:func:`import_modules`): a
  module name as Python finds it (``PYTHONPATH``, an installed package), or a local
  ``.py`` file or package folder, imported from its path (its folder is not put on
  ``sys.path``: a sibling module it imports is not found, here as on the executors).
* On the executors: a ``.py`` file or package folder is shipped with ``--py-files``
  semantics (:func:`ship_modules`: ``SparkContext.addPyFile``, a package zipped first; on Spark
  Connect ``addArtifacts(..., pyfile=True)``), and the objects the modules registered go
  with the model as its custom objects (by reference: a worker imports their module
  before it builds the model). A module given by name must be importable there already.
* :func:`explain_load_failure`: Keras's text for a class it cannot locate (some 1,500 characters) as
  one short reason naming the class and this option.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from typing import Any, Iterable

from spark_keras.jobs.score.errors import JobError
from spark_keras.private_folder import user_name

__all__ = ["Imported", "import_modules", "registered_objects", "ship_modules", "explain_load_failure"]

logger = logging.getLogger("spark_keras.jobs.score")

_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# Keras 3's and tf-keras's words for a class or function no registration names
_MISSING = (re.compile(r"Could not locate (class|function|object) '([^']+)'"),
            re.compile(r"Unknown (layer|object|activation|loss|metric|initializer|regularizer|"
                       r"constraint)[^'\"]*['\"]([^'\"]+)['\"]"))


@dataclass(frozen=True)
class Imported:
    """A module ``--import`` names: its name, and the local ``.py`` file or package
    folder it is imported from (None: a module name found on ``sys.path``)."""

    spec: str  # as given
    name: str
    path: str | None = None


def _resolve(spec: str) -> Imported:
    path = os.path.abspath(spec)
    if spec.endswith(".py") and os.path.isfile(path):
        return Imported(spec, os.path.basename(path)[:-3], path)
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "__init__.py")):
            raise JobError(f"--import {spec!r}: a folder to import must be a package "
                           f"(holding __init__.py)")
        return Imported(spec, os.path.basename(path.rstrip(os.sep)), path)
    if spec.endswith(".py") or os.sep in spec:
        raise JobError(f"--import {spec!r}: no such .py file or package folder")
    if not _NAME.fullmatch(spec):
        raise JobError(f"--import {spec!r} is not a module name, a .py file or a package folder")
    return Imported(spec, spec)


def import_modules(specs: Iterable[str]) -> list[Imported]:
    """Import each ``--import`` (a ``.py`` file or package folder from its folder, put
    first on ``sys.path``); a module that cannot be imported stops the job naming it."""
    done: list[Imported] = []
    specs = list(specs)
    if specs:  # Keras first, its start-up lines hidden: the modules import it
        from spark_keras import flavour
        from spark_keras.quiet import quiet_tensorflow_startup

        with quiet_tensorflow_startup():
            flavour.current()
    for spec in specs:
        item = _resolve(spec)
        try:
            _load(item)
        except JobError:
            raise
        except Exception as exc:  # ImportError, or whatever the module raised
            raise JobError(f"--import {spec!r}: cannot import {item.name!r}: "
                           f"{type(exc).__name__}: {exc}") from exc
        done.append(item)
    return done


def _load(item: Imported) -> None:
    """Import ``item``: a module name as Python finds it; a ``.py`` file or package folder
    from its path alone, its folder never put on ``sys.path`` (whoever can write there could
    plant any module this process imports later, e.g. a shared ``/tmp``). Refused when it
    has the name of another module found here (``json.py``: Python's json, imported instead
    of the file; on the executors the shipped file would hide that module)."""
    if item.path is None:
        importlib.import_module(item.name)
        return
    file = item.path if item.path.endswith(".py") else os.path.join(item.path, "__init__.py")
    _written_by_this_user(item)
    if not item.name.isidentifier():
        raise JobError(f"--import {item.spec!r}: {item.name!r} is not a module name Python "
                       f"can import; rename it")
    try:
        found = importlib.util.find_spec(item.name)
    except (ImportError, ValueError):
        found = None
    if found is not None and os.path.realpath(found.origin or "") != os.path.realpath(file):
        raise JobError(f"--import {item.spec!r}: a module {item.name!r} is already found here "
                       f"({found.origin or 'built in'}), which the file would hide on the "
                       f"executors or be hidden by here; give your module another name")
    if found is not None:  # this very file, imported already
        importlib.import_module(item.name)
        return
    spec = importlib.util.spec_from_file_location(
        item.name, file, submodule_search_locations=None if file == item.path else [item.path])
    assert spec is not None and spec.loader is not None  # a .py file's
    module = importlib.util.module_from_spec(spec)
    sys.modules[item.name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(item.name, None)
        raise


def _written_by_this_user(item: Imported) -> None:
    """Refuse a ``.py`` file or package (its folders and files) that another user owns or
    that every user may write: the job would run as its own user code another user can
    change (``/tmp/layers.py`` of theirs), on the driver and on the executors. (Its group
    writing it is no sign: a umask of 002 gives a user's files to their private group.)"""
    assert item.path is not None
    if not hasattr(os, "geteuid"):
        return  # no unix owners (Windows)
    me = os.geteuid()
    found = [item.path]
    if os.path.isdir(item.path):
        for where, dirs, files in os.walk(item.path):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [os.path.join(where, name) for name in (*dirs, *files)]
    for path in found:
        st = os.stat(path)
        if st.st_uid not in (me, 0) or st.st_mode & stat.S_IWOTH:
            said = f"is owned by user {user_name(st.st_uid)}" if st.st_uid not in (me, 0) \
                else f"is writable by others (mode {st.st_mode & 0o777:04o})"
            raise JobError(f"--import {item.spec!r}: {path!r} {said}: the job would run code "
                           f"another user may have written; import a copy of your own "
                           f"(chmod o-w for one that is yours)")


def registered_objects(imported: Iterable[Imported]) -> dict[str, Any]:
    """The classes and functions the imported modules (and their submodules) registered
    with Keras, by their registered names."""
    from spark_keras import flavour

    names = [item.name for item in imported]
    if not names:
        return {}
    found = flavour.current().module.saving.get_custom_objects()
    return {key: obj for key, obj in found.items()
            if any((getattr(obj, "__module__", "") or "") == name
                   or (getattr(obj, "__module__", "") or "").startswith(name + ".")
                   for name in names)}


def ship_modules(spark: Any, imported: Iterable[Imported], connect: bool) -> None:
    """Add each imported ``.py`` file (a package folder: zipped) to ``spark``'s
    executors' Python path: ``addPyFile``, on Spark Connect a ``pyfile`` artifact."""
    for item in imported:
        if item.path is None:
            continue
        path = item.path if item.path.endswith(".py") else _zipped(item)
        if connect:
            spark.addArtifacts(path, pyfile=True)
        else:
            getattr(spark, "sparkContext", spark).addPyFile(path)
        logger.info("--import %r shipped to the executors as %s", item.spec, path)


def _zipped(item: Imported) -> str:
    """A zip of the package folder (``name/...``, no ``__pycache__``), kept until this
    process ends (classic executors fetch it from the driver when they first need it)."""
    assert item.path is not None
    folder = tempfile.mkdtemp(prefix="spark-keras-import-")
    atexit.register(shutil.rmtree, folder, True)
    target = os.path.join(folder, f"{item.name}.zip")
    root = item.path.rstrip(os.sep)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for where, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                full = os.path.join(where, name)
                archive.write(full, os.path.join(item.name, os.path.relpath(full, root)))
    return target


def explain_load_failure(text: str) -> str | None:
    """One short reason for a model Keras cannot rebuild here (``text``: its error), or
    None: a custom class or function no imported module registers, or a Lambda layer."""
    for pattern in _MISSING:
        found = pattern.search(text)
        if found:
            what = "function" if found[1] in ("function", "activation") else "class"
            return (f"it uses the custom {what} {found[2]!r}, which is not registered here: "
                    f"pass --import MODULE (the module, .py file or package folder that defines "
                    f"it with @keras.saving.register_keras_serializable)")
    if "safe_mode" in text:
        return ("it holds a Lambda layer (Python code), which the job rebuilds only with "
                "--unsafe-deserialization: pass it if you trust the model file")
    return None
