"""Paths as Spark resolves them.

* :func:`scheme`: the URI scheme a path starts with (``hdfs:/x``, ``file:///x``,
  ``s3a://b/k``); what a scheme name is, is :func:`spark_keras.storage.is_uri`'s pattern.
* :func:`stage_file`: where a file of a pipeline stage saved at a path lives, as Spark puts
  the stage's metadata (Hadoop qualifies a plain path on classic Spark).
* :func:`hadoop_filesystem`, :func:`hadoop_qualified`: Hadoop's view of a path, through
  the driver's JVM; :func:`file_uri_path`.

The score job's file operations are :mod:`spark_keras.jobs.score.files`. Nothing here
imports PySpark: the JVM is reached through the session given.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from spark_keras import storage
from spark_keras.errors import StorageError

__all__ = ["scheme", "stage_file", "hadoop_qualified", "hadoop_filesystem", "file_uri_path"]

logger = logging.getLogger("spark_keras")

def scheme(path: str) -> str | None:
    """The scheme ``path`` starts with, lowercased (``"hdfs"`` for ``hdfs:/x``, ``"s3a"``
    for ``s3a://b/k``); None for a plain path. A scheme has two characters or more: a
    single letter is a Windows drive (``C:\\x``)."""
    name, colon, _ = path.partition(":")
    if colon and len(name) > 1 and storage.is_uri(f"{name}://"):  # a valid scheme name
        return name.lower()
    return None


# --- Hadoop, through the driver's JVM ----------------------------------------------------------

# (the JVM view, its Hadoop Path class): Py4J finds ``jvm.org.apache.hadoop.fs.Path`` by a
# round trip per dotted name, each failed class lookup ("org", "org.apache", ...) a search
# of the JVM's class path: 2.2 ms of the 2.7 ms a call took, measured on local[2] (a
# --resume commit makes a few dozen)
_path_class: tuple[Any, Any] = (None, None)


def hadoop_filesystem(spark: Any, path: str) -> tuple[Any, Any]:
    """``(FileSystem, Path)`` of ``path`` in the JVM's Hadoop configuration (``spark``: a
    classic session or its SparkContext)."""
    global _path_class
    sc = getattr(spark, "sparkContext", spark)
    jvm, path_class = _path_class
    if jvm is not sc._jvm:  # another context's JVM (a session stopped and started again)
        path_class = sc._jvm.org.apache.hadoop.fs.Path
        _path_class = (sc._jvm, path_class)
    hadoop_path = path_class(path)
    return hadoop_path.getFileSystem(sc._jsc.hadoopConfiguration()), hadoop_path


def hadoop_qualified(spark: Any, path: str) -> str | None:
    """``path`` qualified by the JVM's Hadoop configuration (a local path for ``file:``,
    else a URI such as ``hdfs://nn:8020/...``); None if there is no JVM to ask."""
    try:
        fs, hadoop_path = hadoop_filesystem(spark, path)
        uri = fs.makeQualified(hadoop_path).toUri()
    except Exception as exc:  # no JVM (a stopped context), or Hadoop refuses the path
        logger.debug("cannot qualify %s with Hadoop: %s", path, exc)
        return None
    if (uri.getScheme() or "file") == "file":
        return uri.getPath()
    return uri.toString()


def file_uri_path(uri: str) -> str:
    """The local path of a ``file:`` URI as Hadoop's ``Path`` reads it (where Spark puts
    a stage's metadata): everything after the scheme and the authority, taken literally:
    ``%20`` names a folder ``%20``, ``?`` and ``#`` are part of the name."""
    rest = uri[len("file:"):]
    if rest.startswith("//"):
        slash = rest.find("/", 2)
        rest = rest[slash:] if slash >= 0 else "/"
    if rest.startswith("/"):
        rest = "/" + rest.lstrip("/")  # Hadoop folds repeated slashes, even leading ones
    return os.path.abspath(rest)


def stage_file(spark: Any, path: str, name: str) -> str:
    """Where the file ``name`` of a stage saved at ``path`` lives, as Spark resolves
    ``path``: a local path, or a URI for ``pyarrow.fs``.

    On classic Spark a plain path is qualified by Hadoop, as Spark qualifies it for the
    metadata (on a cluster whose default filesystem is HDFS, ``/models/m`` is
    ``hdfs://.../models/m``). On Spark Connect a plain path is local to this client.

    Raises:
        StorageError: ``path`` resolves to something that is neither a local path nor a
            URI ``pyarrow.fs`` can take.
    """
    from spark_keras.executor.transport import is_connect

    location = path
    # a plain path, file:/x, file:///x, hdfs:/x (not s3a://, which needs Hadoop's S3 jars)
    if ("://" not in path or scheme(path) == "file") and not is_connect(spark):
        location = hadoop_qualified(spark, path) or path
    found = scheme(location)
    if found is None:
        return os.path.join(os.path.abspath(location), name)
    if found == "file":
        return os.path.join(file_uri_path(location), name)
    if found in ("s3a", "s3n"):  # Hadoop's names for S3; pyarrow knows it as s3
        location = "s3" + location[len(found):]
    if "://" not in location:
        raise StorageError(f"cannot store a model at {path!r}: give a local path or a URI "
                           f"such as s3://bucket/folder")
    base, sep, query = location.partition("?")
    return f"{base.rstrip('/')}/{name}{sep}{query}"
