"""Model files stored anywhere: a spark_keras payload or a Keras ``.keras`` archive at a
local path or a URI (the bytes move through :mod:`spark_keras.storage`).

:func:`open_model` reads one on the driver; for a URI it also returns a
:class:`StoredModel`: the URI plus the size and body digest of the model's payload. A
worker then writes that payload into its host's folder straight from storage
(:meth:`StoredModel.write_payload`), so the bytes never pass through the driver, and
refuses it unless the digest is the driver's: a file replaced in storage meanwhile is
caught, as is a damaged download.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, BinaryIO, Mapping

from spark_keras import flavour
from spark_keras.errors import PayloadChangedError, PayloadError, StorageError
from spark_keras.payload import codec, mapped, state
from spark_keras.payload import format as fmt
from spark_keras.storage import copy, is_uri, read

_ZIP_MAGIC = b"PK\x03\x04"


def body_digest(payload: Any) -> str:
    """The SHA-256 of a payload's body, from its (checked) header."""
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
            raise PayloadChangedError(
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
    if codec.is_payload(data):
        return codec.loads(data, custom_objects=custom_objects, safe_mode=safe_mode), data
    if data[:len(_ZIP_MAGIC)] != _ZIP_MAGIC:
        raise PayloadError(f"{path!r} is neither a spark_keras payload nor a .keras file")
    return _load_keras(path, custom_objects, safe_mode)


def _load_keras(path: str, custom_objects: Mapping[str, Any] | None,
                safe_mode: bool) -> tuple[Any, bytes]:
    """``(model, payload)`` of the ``.keras`` archive at the local ``path``."""
    model = load_keras(path, custom_objects, safe_mode)
    return model, codec.dumps(model, custom_objects=custom_objects)


def is_keras_archive(path: str) -> bool:
    """Whether the local file at ``path`` is a ``.keras`` archive (a zip)."""
    with open(path, "rb") as f:
        return f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC


def load_keras(path: str, custom_objects: Mapping[str, Any] | None, safe_mode: bool) -> Any:
    """The model of the ``.keras`` archive at the local ``path``, loaded by Keras."""
    runtime = flavour.current()
    try:
        state.of(runtime).quiet_autograph(custom_objects)  # classes shipped by value
        model = runtime.load_model(path, custom_objects=custom_objects, safe_mode=safe_mode)
    except Exception as exc:  # Keras raises ValueError, TypeError, BadZipFile...
        raise PayloadError(f"Keras cannot load the .keras file {path!r}: "
                           f"{type(exc).__name__}: {exc}") from exc
    return model

