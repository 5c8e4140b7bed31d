"""Paths as Spark resolves them, and the few file operations the score job needs.

* :func:`scheme`: the URI scheme a path starts with (``hdfs:/x``, ``file:///x``,
  ``s3a://b/k``); what a scheme name is, is :func:`spark_keras.storage.is_uri`'s pattern.
* :func:`stage_file`: where a file of a pipeline stage saved at a path lives, as Spark puts
  the stage's metadata (Hadoop qualifies a plain path on classic Spark).
* :class:`HadoopPaths` (classic Spark: Hadoop's FileSystem through the driver's JVM) and
  :class:`ArrowPaths` (Spark Connect: ``pyarrow.fs`` on the client), behind :class:`Paths`.

Nothing here imports PySpark: the JVM is reached through the session given.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

from .. import storage
from ..errors import StorageError

__all__ = ["scheme", "stage_file", "hadoop_qualified", "file_uri_path", "Paths",
           "HadoopPaths", "ArrowPaths"]

logger = logging.getLogger("spark_keras")

_NO_DIRECTORY_MOVE = {"s3", "gcs"}  # object stores: pyarrow moves single objects only


def scheme(path: str) -> str | None:
    """The scheme ``path`` starts with, lowercased (``"hdfs"`` for ``hdfs:/x``, ``"s3a"``
    for ``s3a://b/k``); None for a plain path. A scheme has two characters or more: a
    single letter is a Windows drive (``C:\\x``)."""
    name, colon, _ = path.partition(":")
    if colon and len(name) > 1 and storage.is_uri(f"{name}://"):  # a valid scheme name
        return name.lower()
    return None


def _is_url(path: str) -> bool:
    """``scheme:/...``: a URI with a path (``file:/x``, ``hdfs://nn/x``), not a plain path."""
    found = scheme(path)
    return found is not None and path[len(found) + 1:].startswith("/")


# --- Hadoop, through the driver's JVM ----------------------------------------------------------

def hadoop_filesystem(spark: Any, path: str) -> tuple[Any, Any]:
    """``(FileSystem, Path)`` of ``path`` in the JVM's Hadoop configuration (``spark``: a
    classic session or its SparkContext)."""
    sc = getattr(spark, "sparkContext", spark)
    hadoop_path = sc._jvm.org.apache.hadoop.fs.Path(path)
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
    from .transport import is_connect

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


# --- the score job's file operations -------------------------------------------------------------

class Paths(Protocol):
    """The few file operations the score job needs, on the paths the user gave. Each
    raises :class:`~spark_keras.StorageError` naming the path it cannot use."""

    def qualify(self, path: str) -> str:
        """``path`` as Spark must be given it."""

    def check_output(self, path: str) -> None:
        """Raise unless ``path`` can be staged and renamed into place."""

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Remove a file or a folder and everything under it; nothing if missing."""

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to the (absent) ``dst``."""


class HadoopPaths:
    """Classic Spark: Hadoop's FileSystem through the driver's JVM."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark

    def qualify(self, path: str) -> str:
        return path

    def check_output(self, path: str) -> None:
        pass

    def exists(self, path: str) -> bool:
        fs, hadoop_path = hadoop_filesystem(self._spark, path)
        return bool(fs.exists(hadoop_path))

    def delete(self, path: str) -> None:
        fs, hadoop_path = hadoop_filesystem(self._spark, path)
        fs.delete(hadoop_path, True)

    def move(self, src: str, dst: str) -> None:
        fs, dst_path = hadoop_filesystem(self._spark, dst)
        _, src_path = hadoop_filesystem(self._spark, src)
        if not fs.rename(src_path, dst_path):
            raise StorageError(f"cannot move the output into {dst!r}")


class ArrowPaths:
    """Spark Connect: ``pyarrow.fs`` on the client. Plain paths are local ones, made
    absolute (``file://``) so that the server and this client mean the same files."""

    def _fs(self, path: str) -> tuple[Any, str]:
        import pyarrow.fs as pafs

        if not _is_url(path):
            return pafs.LocalFileSystem(), os.path.abspath(path)
        try:
            return pafs.FileSystem.from_uri(path)
        except (ValueError, OSError) as exc:  # unknown scheme, no libhdfs, bad URI...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StorageError(f"path {path!r} cannot be opened on this Spark Connect client "
                               f"(pyarrow.fs: {reason})") from exc

    def qualify(self, path: str) -> str:
        return path if _is_url(path) else "file://" + os.path.abspath(path)

    def check_output(self, path: str) -> None:
        fs, _ = self._fs(path)
        if fs.type_name in _NO_DIRECTORY_MOVE:
            raise StorageError(f"output path {path!r}: {fs.type_name} cannot rename a folder, "
                               "so the output cannot be published atomically from a Spark "
                               "Connect client; write to a local or HDFS path")

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        fs, fs_path = self._fs(path)
        return fs.get_file_info(fs_path).type != pafs.FileType.NotFound

    def delete(self, path: str) -> None:
        import pyarrow.fs as pafs

        fs, fs_path = self._fs(path)
        kind = fs.get_file_info(fs_path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(fs_path)
        elif kind != pafs.FileType.NotFound:
            fs.delete_file(fs_path)

    def move(self, src: str, dst: str) -> None:
        fs, dst_path = self._fs(dst)
        _, src_path = self._fs(src)
        try:
            fs.move(src_path, dst_path)
        except (OSError, NotImplementedError) as exc:
            raise StorageError(f"cannot move the output into {dst!r}: {exc}") from exc
