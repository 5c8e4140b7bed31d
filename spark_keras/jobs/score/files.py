"""The score job's file operations: :class:`Paths`, and :class:`HadoopPaths` (classic
Spark: Hadoop's FileSystem through the driver's JVM); Spark Connect's, with ``pyarrow.fs``
on the client, are :class:`~spark_keras.jobs.score.arrow_paths.ArrowPaths`.
:func:`listed_by_spark` (the names Spark's file sources read), :func:`glob_escaped`,
:func:`join` and :func:`write_whole` (a small file created whole) work on either;
:func:`failing` and :func:`local_place` are what both implementations share.

Nothing here imports PySpark: the JVM is reached through the session given.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from spark_keras.errors import StorageError
from spark_keras.spark.paths import file_uri_path, hadoop_filesystem, hadoop_qualified, scheme

logger = logging.getLogger("spark_keras")


@dataclass(frozen=True)
class Entry:
    """A file or folder: its name (the last part of its path), kind, size in bytes (0 for
    a folder) and modification time in whole milliseconds (as Hadoop gives it)."""

    name: str
    is_dir: bool
    size: int
    mtime_ms: int


def join(folder: str, name: str) -> str:
    """``folder/name`` for a plain path or a URI (``folder`` itself for an empty name)."""
    return f"{folder.rstrip('/')}/{name}" if name else folder


def listed_by_spark(name: str) -> bool:
    """Whether Spark's file sources read a file or folder of this name (Spark's
    ``InMemoryFileIndex.shouldFilterOut``): not names starting with ``.``, nor with ``_``
    unless they hold ``=`` (a partition folder) or are Parquet's ``_metadata`` /
    ``_common_metadata``, nor ``*._COPYING_`` (a file being copied)."""
    hidden = (name.startswith("_") and "=" not in name) or name.startswith(".") \
        or name.endswith("._COPYING_")
    return not hidden or name.startswith(("_common_metadata", "_metadata"))


def glob_escaped(path: str) -> str:
    """``path`` as a glob pattern that matches it alone: Spark's readers expand a path
    holding any of ``{}[]*?\\`` as a glob (Hadoop's, where ``\\`` escapes)."""
    return re.sub(r"([{}\[\]*?\\])", r"\\\1", path)


def write_whole(paths: "Paths", path: str, text: str) -> None:
    """Create the file ``path`` (absent) holding ``text``, whole or not at all: a hidden
    temporary file beside it, renamed to ``path`` once written."""
    folder, _, name = path.rstrip("/").rpartition("/")
    tmp = join(folder, f".{name}.tmp-{uuid.uuid4().hex[:12]}") if folder else \
        f".{name}.tmp-{uuid.uuid4().hex[:12]}"
    paths.create(tmp, text.encode("utf-8"))
    try:
        paths.move(tmp, path)
    except BaseException:
        paths.delete(tmp)
        raise


class Paths(Protocol):
    """The few file operations the score job needs, on the paths the user gave. Each
    raises :class:`~spark_keras.StorageError` naming the path it cannot use."""

    def qualify(self, path: str) -> str:
        """``path`` as Spark must be given it."""

    def place(self, path: str) -> str:
        """Where ``path`` is, one spelling per place: a local path absolute, ``.`` and
        ``..`` resolved, symlinks followed; anything else a full URI."""

    def check_output(self, path: str) -> None:
        """Raise unless ``path`` can be staged and renamed into place."""

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Remove a file or a folder and everything under it; nothing if missing."""

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to the (absent) ``dst``."""

    def make_folder(self, path: str) -> None:
        """Create the folder ``path`` and its parents (nothing if it exists)."""

    def status(self, path: str) -> Entry | None:
        """The file or folder at ``path``; None if there is nothing."""

    def children(self, path: str) -> list[Entry]:
        """What the folder ``path`` holds (not recursively), sorted by name."""

    def read_bytes(self, path: str) -> bytes:
        """The whole (small) file at ``path``."""

    def create(self, path: str, data: bytes) -> None:
        """Write the file ``path`` (creating its folders); an existing one is an error."""


@contextlib.contextmanager
def failing(what: str, path: str) -> Iterator[None]:
    """An error of the filesystem becomes a :class:`StorageError` naming ``path``."""
    try:
        yield
    except StorageError:
        raise
    except Exception as exc:  # Py4JJavaError (Java's IOException), OSError, ArrowInvalid
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        cause = next((line for line in lines if "Exception:" in line or "Error:" in line),
                     lines[0] if lines else type(exc).__name__)
        raise StorageError(f"cannot {what} {path!r}: {cause}") from exc


def local_place(path: str) -> str:
    """:meth:`Paths.place` without Hadoop: a plain or ``file:`` path made absolute and
    real, a URI's path normalised."""
    if scheme(path) is None:
        return os.path.realpath(path)
    if scheme(path) == "file":
        return os.path.realpath(file_uri_path(path))
    head, sep, rest = path.partition("://")
    if not sep:
        return path.rstrip("/")
    authority, _, key = rest.partition("/")
    key = posixpath.normpath("/" + key) if key else ""
    return f"{head}://{authority}{key}".rstrip("/")


class HadoopPaths:
    """Classic Spark: Hadoop's FileSystem through the driver's JVM."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark

    @property
    def spark(self) -> Any:
        """The session whose JVM's Hadoop configuration resolves the paths."""
        return self._spark

    def qualify(self, path: str) -> str:
        return path

    def place(self, path: str) -> str:
        found = hadoop_qualified(self._spark, path)  # Hadoop's Path normalises . and ..
        if found is None:
            return local_place(path)
        return os.path.realpath(found) if scheme(found) is None else found.rstrip("/")

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

    def make_folder(self, path: str) -> None:
        with failing("create", path):
            fs, hadoop_path = hadoop_filesystem(self._spark, path)
            fs.mkdirs(hadoop_path)

    @staticmethod
    def _entry(status: Any) -> Entry:
        directory = bool(status.isDirectory())
        return Entry(str(status.getPath().getName()), directory,
                     0 if directory else int(status.getLen()), int(status.getModificationTime()))

    def status(self, path: str) -> Entry | None:
        with failing("read", path):
            fs, hadoop_path = hadoop_filesystem(self._spark, path)
            if not fs.exists(hadoop_path):
                return None
            return self._entry(fs.getFileStatus(hadoop_path))

    def children(self, path: str) -> list[Entry]:
        with failing("list", path):
            fs, hadoop_path = hadoop_filesystem(self._spark, path)
            return sorted((self._entry(s) for s in fs.listStatus(hadoop_path)),
                          key=lambda e: e.name)

    def read_bytes(self, path: str) -> bytes:
        with failing("read", path):
            fs, hadoop_path = hadoop_filesystem(self._spark, path)
            stream = fs.open(hadoop_path)
            try:
                return bytes(stream.readAllBytes())  # InputStream's, Java 9+
            finally:
                stream.close()

    def create(self, path: str, data: bytes) -> None:
        with failing("write", path):
            fs, hadoop_path = hadoop_filesystem(self._spark, path)
            out = fs.create(hadoop_path, False)  # folders too; never over a file
            try:
                out.write(bytearray(data))
            finally:
                out.close()
