"""Bytes stored anywhere: local paths, and URIs that ``pyarrow.fs`` resolves
(``file://``, ``s3://``, ``gs://``, ``hdfs://``, ``abfs://``...).

This module moves bytes and knows nothing of what they are; model files (payloads and
``.keras`` archives, checked by digest) are :mod:`spark_keras.payload.stored`'s.

Credentials and endpoints come from the URI and the environment, as ``pyarrow.fs``
reads them (for S3: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or an instance
profile, and query parameters such as ``?endpoint_override=host:port&scheme=http``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from typing import Any, BinaryIO, Callable

from spark_keras.errors import StorageError

logger = logging.getLogger("spark_keras")

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_CHUNK = 8 * 2**20


def is_uri(path: Any) -> bool:
    """True for ``scheme://...`` strings (a plain path, even ``C:\\``, is not one)."""
    return isinstance(path, str) and bool(_URI.match(path))


def _resolve(uri: str) -> tuple[Any, str]:
    import pyarrow.fs

    try:
        return pyarrow.fs.FileSystem.from_uri(uri)
    except Exception as exc:  # ArrowInvalid, ArrowNotImplementedError, OSError
        raise StorageError(f"cannot open model URI {uri!r}: {exc}") from exc


def copy(uri: str, out: BinaryIO) -> int:
    """Stream the file at ``uri`` into ``out``; the number of bytes copied. Failures to
    read ``uri`` raise :class:`~spark_keras.StorageError`; failures to write ``out`` (a
    local file: disk full, read-only) are raised as they are, for the caller, who knows
    that file, to name it."""
    fs, path = _resolve(uri)
    copied = 0
    try:
        stream = fs.open_input_stream(path)
    except FileNotFoundError as exc:
        raise StorageError(f"model file {uri!r} does not exist") from exc
    except OSError as exc:
        raise StorageError(f"cannot read model file {uri!r}: {exc}") from exc
    with stream:
        while True:
            try:
                chunk = stream.read(_CHUNK)
            except OSError as exc:
                raise StorageError(f"cannot read model file {uri!r}: {exc}") from exc
            if not chunk:
                return copied
            out.write(chunk)
            copied += len(chunk)


def read(path_or_uri: str) -> bytes:
    """The whole file at a local path or a URI."""
    if is_uri(path_or_uri):
        import io

        buffer = io.BytesIO()
        copy(path_or_uri, buffer)
        return buffer.getvalue()
    try:
        with open(path_or_uri, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise StorageError(f"model file {path_or_uri!r} does not exist") from exc
    except OSError as exc:
        raise StorageError(f"cannot read model file {path_or_uri!r}: {exc}") from exc


def write(location: str, data: bytes) -> None:
    """Write ``data`` to a URI, or to a local path atomically (:func:`write_local`,
    creating its folder)."""
    if not is_uri(location):
        try:
            os.makedirs(os.path.dirname(location) or ".", exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot write {location!r}: {exc}") from exc
        write_local(location, data)
        return
    try:
        fs, path = _resolve(location)
        with fs.open_output_stream(path) as out:
            out.write(data)
    except StorageError:
        raise
    except Exception as exc:  # OSError, ArrowInvalid...
        raise StorageError(f"cannot write {location!r}: {exc}") from exc


def write_local(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` (bytes-like) to the local ``path`` atomically; raises
    :class:`~spark_keras.StorageError` naming it, and leaves no partial file."""
    try:
        write_atomically(os.fspath(path), lambda f: f.write(memoryview(data).cast("B")))
    except OSError as exc:
        raise StorageError(f"cannot write {os.fspath(path)!r}: {exc}") from exc


def write_atomically(path: str, write: Callable[[BinaryIO], Any], mode: int = 0o666) -> None:
    """Create ``path`` whole or not at all: ``write(file)`` fills a temporary file of
    this call's own, ``<path>.tmp-<pid>-<random>``, which is then renamed to ``path``.
    Writers racing for one path, in threads or processes, each rename a whole file of
    theirs: the last rename wins. On any failure (of ``write``, of the disk) the
    temporary file is removed and the error raised as it is. The file is created with
    ``mode`` (less the umask), from its first byte on."""
    tmp = f"{path}.tmp-{os.getpid()}-{secrets.token_hex(8)}"
    # never another writer's file (nothing to remove if it fails)
    # (opened by name: ``f.name`` is its path, which writers read back)
    f = open(tmp, "x+b", opener=lambda name, flags: os.open(name, flags, mode))
    try:
        with f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        except OSError as exc:  # must not hide the error that made the write fail
            logger.warning("cannot remove the partial file %s: %s", tmp, exc)
        raise


def size(location: str) -> int | None:
    """The size of the file at a local path or a URI; None if there is none."""
    found = stamp(location)
    return None if found is None else found[0]


def stamp(location: str) -> tuple[int, int | None] | None:
    """``(size, modification time in ns)`` of the file at a local path or a URI (the
    time None where the store has none); None if there is no file. Cheap: no byte is
    read."""
    if not is_uri(location):
        if not os.path.isfile(location):
            return None
        info = os.stat(location)
        return info.st_size, info.st_mtime_ns
    import pyarrow.fs

    fs, path = _resolve(location)
    try:
        info = fs.get_file_info(path)
    except Exception as exc:
        raise StorageError(f"cannot open {location!r}: {exc}") from exc
    if info.type == pyarrow.fs.FileType.NotFound:
        return None
    return info.size, info.mtime_ns
