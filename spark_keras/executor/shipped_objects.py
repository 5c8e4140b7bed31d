"""The custom objects of a version that :meth:`BroadcastModel.update` ships, through
Spark's own channel: never in the driver's answers (:mod:`.version_server`), which carry
only their digest.

A new version whose custom objects (cloudpickle bytes) are the handle's own builds with
the handle's recipe, which travels in the plan. Others are written on the driver to a
file named by their SHA-256 and added to the Spark application: ``SparkContext.addFile``
on classic Spark (executors fetch the files added before they run a task, through Spark's
file server), a file artifact (``addArtifacts(..., file=True)``) of the handle's session
on Spark Connect (whose streaming queries' tasks do not see it: there such an update
fails its tasks, saying so). A worker reads that file (``SparkFiles.get``) and unpickles
it only if its SHA-256 is the one the driver's answer names.

The driver's files live in a folder ``spark_keras_objects_<random>`` of the temporary
folder until the process exits (an executor started later fetches them from there).
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import os
import re
import shutil
import tempfile
import threading
import weakref
from typing import Any

from spark_keras.errors import PayloadError, SparkKerasError
from spark_keras.executor.transport import is_connect
from spark_keras.storage import write_atomically

_DIGEST = re.compile(r"[0-9a-f]{64}")
_lock = threading.Lock()
_folder: str | None = None
# the digests of the files added, per Spark context or Connect session
_added: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def file_name(digest: str) -> str:
    """The name of the file of the custom objects whose SHA-256 is ``digest``."""
    return f"spark_keras_objects_{digest}.pkl"


def ship(spark: Any, objects: bytes, own: bytes) -> str | None:
    """On the driver: None if ``objects`` are the handle's ``own``; else their SHA-256,
    once a file of them named by it is added to ``spark``'s application (a SparkSession
    or SparkContext; a Spark Connect session: a file artifact of that session, also
    where a local Connect server runs a SparkContext in this very process)."""
    if objects == own:
        return None
    digest = hashlib.sha256(objects).hexdigest()
    connect = is_connect(spark)
    application = spark if connect else getattr(spark, "sparkContext", spark)
    with _lock:
        added = _added.setdefault(application, set())
        if digest in added:
            return digest
        path = os.path.join(_objects_folder(), file_name(digest))
        if not os.path.exists(path):
            write_atomically(path, lambda f: f.write(objects))
        if connect:
            application.addArtifacts(path, file=True)
        else:
            application.addFile(path)
        added.add(digest)
    return digest


def fetch(digest: Any, name: str, index: int) -> bytes:
    """In a worker: the custom objects of version ``index`` of model ``name``, from the
    file the driver added, refused unless their SHA-256 is ``digest`` (the driver's)."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise SparkKerasError(f"the driver's answer for model {name} version {index} names its "
                              f"custom objects by {str(digest)[:80]!r}, not by a SHA-256: refused")
    from pyspark import SparkFiles

    path = SparkFiles.get(file_name(digest))
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SparkKerasError(
            f"version {index} of model {name} needs custom objects that update() shipped as "
            f"the file {file_name(digest)}, which this task does not see ({path}; the tasks "
            f"of a Spark Connect streaming query do not see the session's files): an update() "
            f"with new custom objects cannot reach this query. Start the query again with a "
            f"BroadcastModel of the new model") from None
    found = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(found, digest):
        raise PayloadError(f"the custom objects of model {name} version {index} ({path}) have "
                           f"sha256 {found}, not {digest}, the driver's: they were altered; "
                           f"refused, nothing was unpickled")
    return data


def _objects_folder() -> str:
    global _folder
    if _folder is None:
        _folder = tempfile.mkdtemp(prefix="spark_keras_objects_")
        atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    return _folder
