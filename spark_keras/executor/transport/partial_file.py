"""In a Python worker of an executor: the partial file of a payload that the ship-time
waves (:mod:`.chunked`) write chunk by chunk, one task per wave, and its publication as
the executor's payload file (:func:`spark_keras.payload.host_file.land`) once its SHA-256
is the one the driver fixed.

A worker that wrote the file from its first byte on, wave after wave in order (with a
slot per executor, the one worker of the executor does), hashed each chunk as it wrote
it and kept the file open: the last wave compares that digest and renames the file it
wrote (still the one its descriptor holds) into place, without reading it back. Any
other worker (the waves split between workers) reads the file back into a new one,
hashing what it copies."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Iterable

from spark_keras.executor.transport.served import Hashing, ServedTransport
from spark_keras.payload import host_file

COPY_BYTES = 8 * 2**20
# the partial files a worker keeps open: more than one only while ships overlap
MAX_OPEN = 4


@dataclasses.dataclass
class _Written:
    """A partial file this process wrote from its start: its descriptor, where the next
    wave starts, and the SHA-256 of every byte before it."""

    fd: int
    end: int
    sha256: Any


_written: dict[str, _Written] = {}


def write(part: str, key: str, offset: int, chunks: Iterable[bytes]) -> None:
    """The bytes of ``chunks`` written one after the other from ``offset`` on in the
    partial file ``part`` of ``key`` (created if missing; its owner's alone); hashed on
    their way in if this process wrote every byte before ``offset``."""
    mine = _written.pop(key, None)
    if mine is not None and mine.end != offset:  # another worker wrote the waves between
        os.close(mine.fd)
        mine = None
    if mine is None:
        fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o600)
        if offset == 0:
            while len(_written) >= MAX_OPEN:
                forget(next(iter(_written)))
            mine = _Written(fd, 0, hashlib.sha256())
    else:
        fd = mine.fd
    try:
        for data in chunks:
            os.pwrite(fd, data, offset)
            offset += len(data)
            if mine is not None:
                mine.sha256.update(data)
    except BaseException:
        os.close(fd)
        raise
    if mine is None:
        os.close(fd)
    else:
        mine.end = offset
        _written[key] = mine


def publish(part: str, key: str, nbytes: int, served: ServedTransport) -> None:
    """The partial file ``part`` of ``key`` published as the executor's payload file
    (``nbytes`` long), refused (:class:`~spark_keras.errors.PayloadError`) unless its
    SHA-256 is the one ``served`` carries."""
    mine = _written.get(key)
    source = "from its chunk broadcasts"
    if mine is not None and mine.end == nbytes and _same_file(mine.fd, part):
        served.check_digest(mine.sha256.hexdigest(), source)  # hashed as this process wrote it
        host_file.adopt(os.path.dirname(part), key, nbytes, part)
        return

    def copy(out: Any) -> None:
        hashing = Hashing(out)
        with open(part, "rb") as f:
            while block := f.read(COPY_BYTES):
                hashing.write(block)
        out.flush()
        served.check_digest(hashing.hexdigest(), source)

    host_file.land(os.path.dirname(part), key, nbytes, write=copy, verify=served.check_file)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` names the file open as ``fd``."""
    st = os.fstat(fd)
    return host_file.identity(path) == (st.st_dev, st.st_ino)


def forget(key: str) -> None:
    """Close this process's partial file of ``key``, if it holds one."""
    mine = _written.pop(key, None)
    if mine is not None:
        os.close(mine.fd)
