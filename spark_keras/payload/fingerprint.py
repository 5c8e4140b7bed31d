"""What a model file scores with, told without Keras: the kind of a local model file
(:func:`kind`) and the digests of its config and of its weights (:func:`fingerprint`).

Saving the same model again gives another file (a ``.keras`` archive records the time
it was saved), not another model: the score job's ``--resume`` compares these digests,
not the file's bytes. Both read the file only (``zipfile``, ``h5py``, the payload's own
layout): no Keras, no TensorFlow, nothing rebuilt.

* config: the SHA-256 of the model's config (with its compile config), as canonical JSON
  (keys sorted), so the same config written in another key order is the same.
* weights: the SHA-256 of every tensor (its name, dtype, shape and bytes, by name) and
  every asset (vocabularies...): for a ``.keras`` archive the datasets of its
  ``model.weights.h5`` and its ``assets/`` files; for a payload its tensor and asset
  sections. A ``.keras`` file and the payload of the same model are two fingerprints.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import zipfile
from typing import Any

import numpy as np

from spark_keras.errors import PayloadError
from spark_keras.payload import format as fmt
from spark_keras.payload import mapped

__all__ = ["kind", "fingerprint"]

_ZIP_MAGIC = b"PK\x03\x04"
_CONFIG = "config.json"
_WEIGHTS = "model.weights.h5"


def kind(path: str) -> str | None:
    """``"payload"``, ``"keras"`` (a zip holding ``config.json``) or None (not a model
    file the job reads) for the local file at ``path``."""
    with open(path, "rb") as f:
        head = f.read(max(len(fmt.MAGIC), len(_ZIP_MAGIC)))
    if head.startswith(fmt.MAGIC):
        return "payload"
    if head.startswith(_ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as archive:
                return "keras" if _CONFIG in archive.namelist() else None
        except (zipfile.BadZipFile, OSError):
            return None
    return None


def fingerprint(path: str) -> dict[str, str] | None:
    """``{"config": sha256, "weights": sha256}`` of the local model file at ``path`` (a
    payload or a ``.keras`` archive); None for any other file."""
    stat = os.stat(path)
    return _fingerprint(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)  # the job plans twice: before Spark starts and after
def _fingerprint(path: str, size: int, mtime_ns: int) -> dict[str, str] | None:
    found = kind(path)
    if found == "payload":
        return _of_payload(path)
    if found == "keras":
        return _of_archive(path)
    return None


def _canonical(config: Any) -> bytes:
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _tensor(digest: Any, name: str, array: np.ndarray) -> None:
    digest.update(_canonical([name, array.dtype.str, list(array.shape)]))
    digest.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1).data)


def _of_payload(path: str) -> dict[str, str] | None:
    view = mapped.map_file(path, copy_on_write=False)
    try:
        try:
            unpacked = fmt.unpack(view, verify=False)
        except PayloadError:
            return None
        config, weights = hashlib.sha256(), hashlib.sha256()
        for section in sorted(unpacked.sections, key=lambda s: (s.kind, s.name)):
            if section.kind in ("config", "compile_config"):
                raw = json.loads(bytes(unpacked.section_bytes(section)))
                config.update(_canonical([section.kind, raw]))
            elif section.kind == "tensor":
                _tensor(weights, section.name, unpacked.array(section))
            else:
                weights.update(_canonical(["asset", section.name]))
                weights.update(unpacked.section_bytes(section))
        return {"config": config.hexdigest(), "weights": weights.hexdigest()}
    finally:
        mapped.close(view)


def _of_archive(path: str) -> dict[str, str]:
    import h5py  # Keras's own dependency: its weights file is HDF5

    weights = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        config = hashlib.sha256(_canonical(json.loads(archive.read(_CONFIG))))
        names = archive.namelist()
        if _WEIGHTS in names:
            with archive.open(_WEIGHTS) as member, h5py.File(member, "r") as h5:
                found: list[str] = []
                h5.visititems(lambda name, obj: found.append(name)
                              if isinstance(obj, h5py.Dataset) else None)
                for name in sorted(found):
                    _tensor(weights, name, np.asarray(h5[name][()]))
        for name in sorted(n for n in names if n.startswith("assets/") and not n.endswith("/")):
            weights.update(_canonical(["asset", name]))
            weights.update(archive.read(name))
    return {"config": config.hexdigest(), "weights": weights.hexdigest()}
