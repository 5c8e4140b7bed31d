"""Model files stored anywhere: local paths, and URIs that ``pyarrow.fs`` resolves
(``file://``, ``s3://``, ``gs://``, ``hdfs://``, ``abfs://``...).

A model file is a spark_keras payload or a Keras ``.keras`` archive. :func:`open_model`
reads one on the driver; for a URI it also returns a :class:`StoredModel`: the URI plus
the size and body digest of the model's payload. A worker then writes that payload
into its host's folder straight from storage (:meth:`StoredModel.write_payload`), so
the bytes never pass through the driver, and refuses it unless the digest is the
driver's: a file replaced in storage meanwhile is caught, as is a damaged download.

Credentials and endpoints come from the URI and the environment, as ``pyarrow.fs``
reads them (for S3: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` or an instance
profile, and query parameters such as ``?endpoint_override=host:port&scheme=http``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Mapping

from .errors import PayloadError, StorageError

logger = logging.getLogger("spark_keras")

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_CHUNK = 8 * 2**20
_ZIP_MAGIC = b"PK\x03\x04"


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


def write_atomically(path: str, write: Callable[[BinaryIO], Any]) -> None:
    """Create ``path`` whole or not at all: ``write(file)`` fills ``<path>.tmp-<pid>``,
    which is then renamed to ``path``. On any failure (of ``write``, of the disk) the
    temporary file is removed and the error raised as it is."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w+b") as f:
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
    if not is_uri(location):
        return os.path.getsize(location) if os.path.isfile(location) else None
    import pyarrow.fs

    fs, path = _resolve(location)
    try:
        info = fs.get_file_info(path)
    except Exception as exc:
        raise StorageError(f"cannot open {location!r}: {exc}") from exc
    return None if info.type == pyarrow.fs.FileType.NotFound else info.size


def body_digest(payload: Any) -> str:
    """The SHA-256 of a payload's body, from its (checked) header."""
    from .payload import format as fmt

    return fmt.unpack(payload, verify=False).header["body_sha256"]


@dataclass(frozen=True)
class StoredModel:
    """A model file in storage and the payload it stands for (read on the driver)."""

    uri: str
    kind: str  # "payload" or "keras"
    nbytes: int  # of the payload
    digest: str  # the payload's body digest

    def write_payload(self, out: BinaryIO, *, custom_objects: Mapping[str, Any] | None = None,
                      safe_mode: bool = True) -> None:
        """Write the model's payload into ``out`` (an open file, read back by name),
        straight from storage; a ``.keras`` file is converted here. Raises
        :class:`~spark_keras.PayloadError` unless it is the payload the driver read."""
        if self.kind == "payload":
            copy(self.uri, out)
        else:
            with tempfile.TemporaryDirectory(dir=os.path.dirname(out.name) or None) as tmp:
                local = os.path.join(tmp, "model.keras")
                with open(local, "wb") as f:
                    copy(self.uri, f)
                out.write(_load_keras(local, custom_objects, safe_mode)[1])
        out.flush()
        self.check(out.name)

    def read_payload(self, *, custom_objects: Mapping[str, Any] | None = None,
                     safe_mode: bool = True) -> bytes:
        """The model's payload, read into memory (for a worker that cannot write its
        folder; a ``.keras`` file is converted in a temporary folder). Raises
        :class:`~spark_keras.PayloadError` unless it is the payload the driver read."""
        if self.kind == "payload":
            data = read(self.uri)
        else:
            try:
                with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:
                    local = os.path.join(tmp, "model.keras")
                    with open(local, "wb") as f:
                        copy(self.uri, f)
                    data = _load_keras(local, custom_objects, safe_mode)[1]
            except StorageError:
                raise
            except OSError as exc:
                raise StorageError(f"cannot convert the .keras file {self.uri!r} here: no "
                                   f"writable temporary folder ({exc})") from exc
        self._check_digest(data)
        return data

    def check(self, path: str) -> None:
        """Refuse the payload file at ``path`` unless it has the driver's digest (the
        body itself is verified against it when the file is loaded)."""
        from .payload import mapped

        view = mapped.map_file(path, copy_on_write=False)
        try:
            self._check_digest(view)
        finally:
            mapped.close(view)

    def _check_digest(self, payload: Any) -> None:
        try:
            found = body_digest(payload)
        except PayloadError as exc:
            raise PayloadError(f"the model read from {self.uri!r} is not a sound payload: "
                               f"{exc}") from exc
        if found != self.digest:
            what = "converts to a different payload here (another Keras version?)" \
                if self.kind == "keras" else "changed in storage"
            raise PayloadError(
                f"model file {self.uri!r} {what} since the BroadcastModel was created: payload "
                f"digest {found[:12]}..., expected {self.digest[:12]}...; create it again")


def open_model(path_or_uri: Any, *, custom_objects: Mapping[str, Any] | None = None,
               safe_mode: bool = True) -> tuple[Any, bytes, StoredModel | None]:
    """Read a model file: ``(model, its payload, StoredModel if it is a URI)``."""
    location = os.fspath(path_or_uri)
    data = read(location)
    uri = is_uri(location)
    if data[:len(_ZIP_MAGIC)] == _ZIP_MAGIC and uri:
        with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:
            local = os.path.join(tmp, "model.keras")
            with open(local, "wb") as f:
                f.write(data)
            model, payload = _load(local, data, custom_objects, safe_mode)
    else:
        model, payload = _load(location, data, custom_objects, safe_mode)
    if not uri:
        return model, payload, None
    kind = "keras" if payload is not data else "payload"
    return model, payload, StoredModel(location, kind, len(payload), body_digest(payload))


def _load(path: str, data: bytes, custom_objects: Mapping[str, Any] | None,
          safe_mode: bool) -> tuple[Any, bytes]:
    """``(model, payload)`` from a file's bytes: a payload as is, a ``.keras`` archive
    (at the local ``path``) loaded by Keras and converted."""
    from .payload import codec

    if codec.is_payload(data):
        return codec.loads(data, custom_objects=custom_objects, safe_mode=safe_mode), data
    if data[:len(_ZIP_MAGIC)] != _ZIP_MAGIC:
        raise PayloadError(f"{path!r} is neither a spark_keras payload nor a .keras file")
    return _load_keras(path, custom_objects, safe_mode)


def _load_keras(path: str, custom_objects: Mapping[str, Any] | None,
                safe_mode: bool) -> tuple[Any, bytes]:
    """``(model, payload)`` of the ``.keras`` archive at the local ``path``."""
    from . import flavour
    from .payload import codec

    try:
        model = flavour.current().load_model(path, custom_objects=custom_objects,
                                             safe_mode=safe_mode)
    except Exception as exc:  # Keras raises ValueError, TypeError, BadZipFile...
        raise PayloadError(f"Keras cannot load the .keras file {path!r}: "
                           f"{type(exc).__name__}: {exc}") from exc
    return model, codec.dumps(model, custom_objects=custom_objects)

