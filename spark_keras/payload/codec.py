"""``dumps`` / ``loads`` / ``save`` / ``load``: a Keras model as a compact, safe payload.

A payload is a model's serialized config plus its raw state (see ``format.py`` and
docs/format.md). No pickle and no marshal anywhere inside: loading runs Keras's own
deserializer with ``safe_mode`` on unless the caller turns it off.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Mapping

import numpy as np

from spark_keras import flavour
from spark_keras._version import __version__
from spark_keras.errors import PayloadError, StorageError
from spark_keras.payload import format as fmt
from spark_keras.payload import mapped, round_trip, state
from spark_keras.storage import write_atomically

logger = logging.getLogger("spark_keras")

PathLike = str | os.PathLike


def dumps(model: Any, *, custom_objects: Mapping[str, Any] | None = None,
          include_optimizer: bool = False) -> bytes:
    """Serialize ``model`` to payload bytes.

    Args:
        model: a built Keras model (Sequential, Functional or subclassed).
        custom_objects: custom classes/functions the model uses; only used to check
            that the payload loads back correctly when the model relies on auto-config.
        include_optimizer: also store the compile config and the optimizer's state,
            so the loaded model is compiled and can resume training.

    Returns:
        The payload: a config, the weights and any assets, in one self-describing buffer.

    Raises:
        PayloadError: the model cannot be represented faithfully (for example a
            subclassed model without ``get_config`` whose auto-config loses arguments).
    """
    meta, pieces = _layout_of(model, include_optimizer)
    data = fmt.pack(meta, pieces)
    if round_trip.relies_on_auto_config(model):
        round_trip.verify(model, data, custom_objects, loads)
    return data


def _layout_of(model: Any, include_optimizer: bool) -> tuple[dict[str, Any], list]:
    """The payload's header fields and its pieces: ``(section, bytes-like)``. With Keras 3
    on TensorFlow the tensors are views of the model's variables (nothing copied)."""
    fl = flavour.current()
    flavour_state = state.of(fl)
    flavour_state.check_model_type(model)
    config = flavour_state.serialize_config(model)
    compile_config = config.pop("compile_config", None) if isinstance(config, dict) else None
    entries, assets = flavour_state.capture_state(model, include_optimizer=include_optimizer)

    pieces: list[tuple[fmt.Section, Any]] = [
        (fmt.Section("config", "config", 0, 0), _json_bytes(config, "model config")),
    ]
    if include_optimizer and compile_config:
        pieces.append((fmt.Section("compile_config", "compile_config", 0, 0),
                       _json_bytes(compile_config, "compile config")))
    for path, group in entries.items():
        for key, array in group.items():
            section = fmt.Section("tensor", f"{path}/{key}", 0, 0,
                                  dtype=fmt.dtype_name(array.dtype), shape=tuple(array.shape))
            pieces.append((section, array if array.size else b""))
    for rel, data in assets.items():
        pieces.append((fmt.Section("asset", rel, 0, 0), data))

    meta = {
        "producer": f"spark_keras {__version__}",
        "keras": {"flavour": fl.name, "version": fl.version, "backend": fl.backend},
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "include_optimizer": bool(include_optimizer and compile_config),
    }
    return meta, pieces


def _json_bytes(obj: Any, what: str) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"the {what} is not JSON-serializable: {exc}") from exc


def loads(data: Any, *, custom_objects: Mapping[str, Any] | None = None,
          safe_mode: bool = True, share_weights: bool = False) -> Any:
    """Rebuild a Keras model from payload bytes.

    Weights are read in place (zero-copy views) and copied once, into the variables.

    Args:
        data: the payload (bytes, bytearray or memoryview), as :func:`dumps` made it.
        custom_objects: custom classes/functions the model's config refers to.
        safe_mode: ``True`` (the default) refuses Lambda layers and other objects that
            would run arbitrary code; pass ``False`` only for payloads you trust.
        share_weights: make the variables adopt ``data``'s memory instead of copying
            it (Keras 3 with TensorFlow; see :func:`load`); ``data`` must then be
            writable and must not change while the model lives.

    Returns:
        The rebuilt Keras model (compiled, with its optimizer state, if it was saved so).

    Raises:
        PayloadError: corrupted, truncated, newer-format or other-flavour payloads.
    """
    started = time.perf_counter()
    unpacked = fmt.unpack(data, verify=False)
    header = unpacked.header
    check_compatible(header)
    body_check = fmt.BodyCheck(unpacked)  # runs while Keras rebuilds the model
    try:
        config, entries, assets = _read_sections(unpacked)
        sharing = {"share_weights": True} if share_weights and flavour.current().shares_weights else {}
        model = state.current().rebuild(config, entries, assets,
                                        custom_objects=dict(custom_objects or {}),
                                        safe_mode=safe_mode,
                                        before_state=body_check.wait, **sharing)
    except Exception as exc:
        body_check.wait()  # a corrupted body explains any failure best
        if isinstance(exc, PayloadError):
            raise
        raise _explain_rebuild_failure(exc, header, safe_mode) from exc
    logger.debug("rebuilt %s in %.3fs", header.get("model_class"), time.perf_counter() - started)
    return model


def _read_sections(unpacked: fmt.Unpacked) -> tuple[dict, dict, dict]:
    """The model config (compile config folded back in), tensors by path, and assets."""
    config: Any = None
    compile_config: Any = None
    entries: dict[str, dict[str, np.ndarray]] = {}
    assets: dict[str, bytes] = {}
    for section in unpacked.sections:
        if section.kind == "config":
            config = _json_section(unpacked, section)
        elif section.kind == "compile_config":
            compile_config = _json_section(unpacked, section)
        elif section.kind == "tensor":
            path, _, key = section.name.rpartition("/")
            entries.setdefault(path, {})[key] = unpacked.array(section)
        else:
            assets[section.name] = bytes(unpacked.section_bytes(section))
    if not isinstance(config, dict):
        raise PayloadError("payload corrupted: it has no model config")
    config["compile_config"] = compile_config
    return config, entries, assets


def check_compatible(header: Mapping[str, Any]) -> None:
    """Refuse a payload written by another Keras flavour (or a newer Keras major)."""
    info = header.get("keras")
    if not isinstance(info, dict):
        raise PayloadError("payload corrupted: header has no Keras version")
    here = flavour.current()
    theirs = info.get("flavour")
    if theirs != here.name:
        raise PayloadError(
            f"payload was written by Keras flavour {theirs!r} {info.get('version')} but this "
            f"process runs {here.name!r} {here.version}: {flavour.how_to_match(str(theirs))}"
        )
    their_major = str(info.get("version", "")).split(".")[0]
    if their_major != here.version.split(".")[0]:
        raise PayloadError(
            f"payload was written by Keras {info.get('version')}, this process runs Keras "
            f"{here.version}: install the same major version on the driver and executors"
        )


def _json_section(unpacked: fmt.Unpacked, section: fmt.Section) -> Any:
    try:
        return json.loads(bytes(unpacked.section_bytes(section)))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PayloadError(f"payload corrupted: section {section.name!r} is not JSON") from exc


def _explain_rebuild_failure(exc: Exception, header: Mapping[str, Any],
                             safe_mode: bool) -> PayloadError:
    text = str(exc)
    cls = header.get("model_class")
    if "safe_mode" in text or "unsafe" in text.lower():
        return PayloadError(
            f"refusing to load {cls}: it contains an object that would run arbitrary code "
            f"(for example a Lambda layer) and safe_mode=True. If you trust this payload, "
            f"load it with safe_mode=False. Keras said: {text}")
    if "Could not locate" in text or "Unknown" in text or "not found" in text.lower():
        return PayloadError(
            f"cannot rebuild {cls}: a custom class is unknown here. Pass it in "
            f"custom_objects, register it with @keras.saving.register_keras_serializable, "
            f"or ship it with make_picklable/BroadcastModel. Keras said: {text}")
    return PayloadError(f"cannot rebuild {cls} from its payload: {type(exc).__name__}: {text}")


def save(model: Any, path: PathLike, *, custom_objects: Mapping[str, Any] | None = None,
         include_optimizer: bool = False) -> None:
    """Write ``dumps(model)`` to the local ``path`` atomically (a temp file, then a
    rename): the file is whole or absent, and no temporary file is left. The payload is
    streamed into the file, not built in memory first: with Keras 3 on TensorFlow the
    weights go from the variables to the file without a copy (a model loaded with
    ``share_weights``, whose weights are a mapped file, copies nothing).

    Args:
        model: a built Keras model, as for :func:`dumps`.
        path: the local file to write.
        custom_objects: as for :func:`dumps`.
        include_optimizer: as for :func:`dumps`.

    Raises:
        PayloadError: the model cannot be serialized (see :func:`dumps`).
        StorageError: ``path`` cannot be written (its folder is missing, read-only or
            full), naming it.
    """
    meta, pieces = _layout_of(model, include_optimizer)
    auto_config = round_trip.relies_on_auto_config(model)

    def write(f: Any) -> None:
        fmt.write(meta, pieces, f)
        if auto_config:  # checked on the file, before it takes the path
            f.flush()
            view = mapped.map_file(f.name, copy_on_write=False)
            try:
                round_trip.verify(model, view, custom_objects, loads)
            finally:
                mapped.close(view)

    try:
        write_atomically(os.fspath(path), write)
    except OSError as exc:
        raise StorageError(f"cannot write {os.fspath(path)!r}: {exc}") from exc


def load(path: PathLike, *, custom_objects: Mapping[str, Any] | None = None,
         safe_mode: bool = True, share_weights: bool = False) -> Any:
    """Load a payload file, memory-mapped (weights are not read into a second buffer).

    Args:
        path: a local payload file (written by :func:`save`).
        custom_objects: as for :func:`loads`.
        safe_mode: as for :func:`loads`.
        share_weights: (Keras 3 with TensorFlow) map the file copy-on-write and make
            the model's variables views of the mapping: every process loading the same
            file shares one copy of the weights (the page cache's). Writes to the
            variables (training, ``assign``) copy the pages they touch into this process
            only; the file and other processes never see them. Elsewhere the weights
            are copied as usual.

    Returns:
        The rebuilt Keras model.

    Raises:
        PayloadError: as for :func:`loads`, the message naming ``path``.
    """
    return load_mapped(path, custom_objects=custom_objects, safe_mode=safe_mode,
                       share_weights=share_weights)[0]


def load_mapped(path: PathLike, *, custom_objects: Mapping[str, Any] | None = None,
                safe_mode: bool = True, share_weights: bool = False,
                expect: tuple[int, ...] | None = None) -> tuple[Any, mapped.WeightMemory]:
    """:func:`load`, and where the model's weights ended up (shared or private bytes);
    ``expect``: see :func:`.mapped.map_file`."""
    view = mapped.map_file(path, copy_on_write=share_weights, expect=expect)
    keep = False
    try:
        model = loads(view, custom_objects=custom_objects, safe_mode=safe_mode,
                      share_weights=share_weights)
        memory = mapped.weight_memory(model, view if share_weights else None)
        keep = share_weights  # the variables are views of the mapping: it must stay
        return model, memory
    except PayloadError as exc:
        raise PayloadError(f"{os.fspath(path)}: {exc}") from exc
    finally:
        if not keep:
            mapped.close(view)


def is_payload(data: Any) -> bool:
    """Whether ``data`` looks like a payload.

    Args:
        data: bytes-like (bytes, bytearray, memoryview).

    Returns:
        True if ``data`` starts with the payload magic bytes.
    """
    return bytes(memoryview(data)[: len(fmt.MAGIC)]) == fmt.MAGIC
