"""The binary layout of a spark_keras payload (see docs/format.md).

::

    preamble (48 bytes)  magic(8) | format version u32 | header length u32 | sha256(header)
    header               UTF-8 JSON: versions, flavour, sections, digest of the body
    padding              zeros up to a multiple of 64
    body                 sections (config JSON, compile config JSON, tensors, assets),
                         each starting at a multiple of 64 bytes from the body start

This module only packs and unpacks bytes; it knows nothing of Keras. Every field is
checked before anything is sliced, so a hostile header cannot make the reader allocate
memory or read out of bounds. Nothing here pickles or executes anything.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from spark_keras.errors import PayloadError

MAGIC = b"\x89SKPAYL\n"
FORMAT_VERSION = 1
ALIGN = 64
MAX_HEADER_BYTES = 64 * 1024 * 1024
MAX_SECTIONS = 1_000_000
MAX_NDIM = 32
_PREAMBLE = struct.Struct("<8sII32s")
PREAMBLE_SIZE = _PREAMBLE.size  # 48
_PAD = bytes(ALIGN)

# Numeric dtypes only, by name; ml_dtypes names (bfloat16, float8_*) included.
_DTYPE_NAME = re.compile(
    r"^(bool|u?int(8|16|32|64)|float(16|32|64)|complex(64|128)|bfloat16|float8_\w+|int4|uint4)$"
)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def dtype_name(dtype: np.dtype) -> str:
    """The name a dtype round-trips by; refuses non-numeric dtypes."""
    name = np.dtype(dtype).name
    if not _DTYPE_NAME.match(name):
        raise PayloadError(f"dtype {name!r} cannot be stored in a payload (numeric dtypes only)")
    return name


def dtype_from_name(name: Any) -> np.dtype:
    if not isinstance(name, str) or not _DTYPE_NAME.match(name):
        raise PayloadError(f"payload names an unsupported dtype {name!r}")
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # registers bfloat16, float8_* etc.

        try:
            return np.dtype(getattr(ml_dtypes, name))
        except AttributeError:
            raise PayloadError(f"payload names an unknown dtype {name!r}") from None


@dataclass
class Section:
    """One contiguous region of the body."""

    kind: str  # "config" | "compile_config" | "tensor" | "asset"
    name: str
    offset: int
    nbytes: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "offset": self.offset,
                               "nbytes": self.nbytes}
        if self.kind == "tensor":
            out["dtype"] = self.dtype
            out["shape"] = list(self.shape or ())
        return out


@dataclass
class Unpacked:
    header: dict[str, Any]
    body: memoryview
    sections: list[Section] = field(default_factory=list)

    def section_bytes(self, section: Section) -> memoryview:
        return self.body[section.offset : section.offset + section.nbytes]

    def array(self, section: Section) -> np.ndarray:
        """A read-only, zero-copy view of a tensor section."""
        dt = dtype_from_name(section.dtype)
        return np.frombuffer(self.section_bytes(section), dtype=dt).reshape(section.shape)


def pack(meta: dict[str, Any], pieces: Sequence[tuple[Section, Any]]) -> bytes:
    """Lay out ``pieces`` (section, bytes-like) into one payload; offsets are assigned here.

    The weights are copied exactly once, into the returned bytes.
    """
    return b"".join(_layout(meta, pieces))


def write(meta: dict[str, Any], pieces: Sequence[tuple[Section, Any]], out: Any) -> int:
    """:func:`pack` streamed into the binary file ``out``: nothing is copied in memory
    (the pieces are written as they are); returns the number of bytes written."""
    written = 0
    for chunk in _layout(meta, pieces):
        out.write(chunk)
        written += memoryview(chunk).nbytes
    return written


def _layout(meta: dict[str, Any], pieces: Sequence[tuple[Section, Any]]) -> list[Any]:
    """The payload of ``pieces`` as a list of chunks (the head, then views of the pieces
    and their padding), the sections' offsets assigned and the body hashed."""
    offset = 0
    views: list[memoryview] = []
    sections: list[Section] = []
    digest = hashlib.sha256()
    for section, data in pieces:
        if isinstance(data, np.ndarray):  # bytes view; works for ml_dtypes (bfloat16) too
            data = data.reshape(-1).view(np.uint8)
        view = memoryview(data).cast("B")
        section.offset, section.nbytes = offset, view.nbytes
        sections.append(section)
        views.append(view)
        offset = _align(offset + view.nbytes)
    body_nbytes = offset

    chunks: list[Any] = []
    position = 0
    for section, view in zip(sections, views):
        if section.offset > position:
            pad = _PAD[: section.offset - position]
            chunks.append(pad)
            digest.update(pad)
        chunks.append(view)
        digest.update(view)
        position = section.offset + section.nbytes
    if body_nbytes > position:
        pad = _PAD[: body_nbytes - position]
        chunks.append(pad)
        digest.update(pad)

    header = dict(meta)
    header.update(
        format_version=FORMAT_VERSION,
        byteorder="little",
        body_nbytes=body_nbytes,
        body_sha256=digest.hexdigest(),
        sections=[s.to_json() for s in sections],
    )
    header_bytes = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    if len(header_bytes) > MAX_HEADER_BYTES:
        raise PayloadError(f"payload header is {len(header_bytes)} bytes, over {MAX_HEADER_BYTES}")
    preamble = _PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(header_bytes),
                              hashlib.sha256(header_bytes).digest())
    head = preamble + header_bytes
    head += _PAD[: _align(len(head)) - len(head)]
    return [head, *chunks]


def unpack(data: Any, *, verify: bool = True) -> Unpacked:
    """Check and split a payload. ``data`` is any bytes-like object; nothing is copied."""
    if sys.byteorder != "little":
        raise PayloadError("spark_keras payloads are little-endian; this machine is big-endian")
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise PayloadError(
            f"a payload must be bytes, bytearray or memoryview, not {type(data).__name__}"
        ) from None
    if view.nbytes < PREAMBLE_SIZE:
        raise PayloadError(
            f"payload truncated: {view.nbytes} bytes, shorter than the {PREAMBLE_SIZE}-byte preamble"
        )
    magic, version, header_len, header_sha = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise PayloadError(
            f"not a spark_keras payload: wrong magic bytes {bytes(magic)!r} (expected {MAGIC!r})"
        )
    if version > FORMAT_VERSION:
        raise PayloadError(
            f"payload format version {version} is newer than this spark_keras reads "
            f"(up to {FORMAT_VERSION}); upgrade spark_keras where the payload is loaded"
        )
    if version < 1:
        raise PayloadError(f"payload format version {version} is invalid")
    if header_len > MAX_HEADER_BYTES:
        raise PayloadError(
            f"payload corrupted: header is {header_len} bytes, over the {MAX_HEADER_BYTES}-byte "
            f"limit (64 MiB)"
        )
    if PREAMBLE_SIZE + header_len > view.nbytes:
        raise PayloadError(
            f"payload truncated or corrupted: header claims {header_len} bytes, "
            f"{view.nbytes - PREAMBLE_SIZE} available"
        )
    header_bytes = view[PREAMBLE_SIZE : PREAMBLE_SIZE + header_len]
    if hashlib.sha256(header_bytes).digest() != header_sha:
        raise PayloadError("payload corrupted: header checksum mismatch")
    try:
        header = json.loads(bytes(header_bytes))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise PayloadError(f"payload corrupted: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise PayloadError("payload corrupted: header is not a JSON object")

    body_start = _align(PREAMBLE_SIZE + header_len)
    body_nbytes = _int_field(header, "body_nbytes")
    available = view.nbytes - body_start
    if available < body_nbytes:
        raise PayloadError(
            f"payload truncated: body should be {body_nbytes} bytes, only {max(available, 0)} present"
        )
    if available > body_nbytes:
        raise PayloadError(f"payload corrupted: {available - body_nbytes} unexpected trailing bytes")
    body = view[body_start:]
    unpacked = Unpacked(header=header, body=body)
    if verify:
        BodyCheck(unpacked).wait()
    unpacked.sections = list(_parse_sections(header.get("sections"), body_nbytes))
    return unpacked


class BodyCheck:
    """Verifies the body digest, in a background thread for large bodies.

    hashlib releases the GIL, so on a multi-core machine the digest of a large body is
    computed while Keras (GIL-bound Python) rebuilds the model. Call :meth:`wait`
    before trusting the weights.
    """

    THREAD_THRESHOLD = 4 * 1024 * 1024

    def __init__(self, unpacked: Unpacked) -> None:
        self._expected = unpacked.header.get("body_sha256")
        self._body = unpacked.body
        self._actual: str | None = None
        self._thread = None
        if unpacked.body.nbytes >= self.THREAD_THRESHOLD:
            self._thread = threading.Thread(target=self._run, name="spark_keras-digest", daemon=True)
            self._thread.start()
        else:
            self._run()

    def _run(self) -> None:
        self._actual = hashlib.sha256(self._body).hexdigest()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not isinstance(self._expected, str) or self._actual != self._expected:
            raise PayloadError("payload corrupted: body checksum mismatch (a byte was changed)")


def _int_field(obj: dict[str, Any], key: str, where: str = "header") -> int:
    value = obj.get(key)
    if type(value) is not int or value < 0:
        raise PayloadError(f"payload corrupted: {where} field {key!r} is {value!r}, not a size")
    return value


def _parse_sections(raw: Any, body_nbytes: int) -> Iterable[Section]:
    if not isinstance(raw, list) or len(raw) > MAX_SECTIONS:
        raise PayloadError("payload corrupted: header 'sections' is not a list")
    for i, item in enumerate(raw):
        where = f"section {i}"
        if not isinstance(item, dict):
            raise PayloadError(f"payload corrupted: {where} is not an object")
        kind, name = item.get("kind"), item.get("name")
        if kind not in ("config", "compile_config", "tensor", "asset") or not isinstance(name, str):
            raise PayloadError(f"payload corrupted: {where} has kind {kind!r} name {name!r}")
        offset = _int_field(item, "offset", where)
        nbytes = _int_field(item, "nbytes", where)
        if offset % ALIGN or offset + nbytes > body_nbytes:
            raise PayloadError(
                f"payload corrupted: {where} ({name!r}) spans bytes {offset}..{offset + nbytes} "
                f"outside the {body_nbytes}-byte body"
            )
        section = Section(kind, name, offset, nbytes)
        if kind == "tensor":
            shape = item.get("shape")
            if (not isinstance(shape, list) or len(shape) > MAX_NDIM
                    or any(type(d) is not int or d < 0 for d in shape)):
                raise PayloadError(f"payload corrupted: tensor {name!r} has shape {shape!r}")
            dt = dtype_from_name(item.get("dtype"))
            expected = dt.itemsize * int(np.prod(shape, dtype=object))
            if expected != nbytes:
                raise PayloadError(
                    f"payload corrupted: tensor {name!r} of shape {tuple(shape)} and dtype "
                    f"{dt.name} needs {expected} bytes, section holds {nbytes}"
                )
            section.dtype, section.shape = dt.name, tuple(shape)
        yield section
