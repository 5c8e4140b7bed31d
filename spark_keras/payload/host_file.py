"""One payload file per host (or per Spark executor), written by the first process that
needs it and memory-mapped by all of them.

Protocol, for processes that may start, die or race at any moment:

* a reader that finds ``<name>`` complete (its size is the payload's) uses it without
  taking any lock;
* otherwise it takes an exclusive ``flock`` on ``<name>.lock`` (the kernel releases it
  when its holder dies), looks again, removes temporary files left by writers that died,
  writes ``<name>.tmp-<pid>`` and renames it to ``<name>`` (atomic): nobody ever maps a
  partial file;
* content damaged after it was written is caught by the payload digest when the file is
  loaded; the loader then calls :func:`land` with ``damaged=`` the file's identity, and
  the file is rewritten unless another process already did.

A file that was replaced or removed stays valid for processes that mapped it (Linux
keeps an unlinked inode alive while it is mapped).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import logging
import os
import time
from typing import Any, BinaryIO, Callable, Iterator

from ..errors import ArgumentTypeError, PayloadError

logger = logging.getLogger("spark_keras")

SUFFIX = ".skp"


def path_for(folder: str, key: str) -> str:
    return os.path.join(folder, f"{key}{SUFFIX}")


def identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path``, or None if it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def land(folder: str, key: str, nbytes: int, fetch: Callable[[], Any] | None = None, *,
         write: Callable[[BinaryIO], Any] | None = None,
         damaged: tuple[int, int] | None = None) -> str:
    """The path of ``key``'s payload file in ``folder``, written by whichever process
    comes first: from ``fetch()`` (the payload, bytes-like), or by ``write(file)``
    (which streams it into an open file, whose ``name`` it may read back). Either way
    it must be ``nbytes`` long."""
    if (fetch is None) == (write is None):
        raise ArgumentTypeError("land() takes one of fetch and write")
    if write is None:
        write = functools.partial(_write_fetched, fetch)
    path = path_for(folder, key)
    if damaged is None and _complete(path, nbytes):
        return path
    os.makedirs(folder, exist_ok=True)
    with _locked(f"{path}.lock"):
        current = identity(path)
        if _complete(path, nbytes) and (damaged is None or current != damaged):
            return path
        for stale in glob.glob(glob.escape(path) + ".tmp-*"):  # their writers died
            _remove(stale)
        started = time.perf_counter()
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w+b") as f:
                write(f)
                written = f.tell()
            if written != nbytes:
                raise PayloadError(f"the payload of {key} is {written} bytes, expected {nbytes}")
            os.replace(tmp, path)
        except BaseException:
            _remove(tmp)
            raise
    logger.info("wrote %s (%.1f MB) in %.2fs%s", path, nbytes / 2**20,
                time.perf_counter() - started, " (the old copy was damaged)" if damaged else "")
    return path


def _write_fetched(fetch: Callable[[], Any], f: BinaryIO) -> None:
    f.write(memoryview(fetch()).cast("B"))


def discard(folder: str, key: str) -> None:
    """Remove ``key``'s file (processes that mapped it keep their mapping)."""
    path = path_for(folder, key)
    for name in (path, f"{path}.lock", *glob.glob(glob.escape(path) + ".tmp-*")):
        _remove(name)


def _complete(path: str, nbytes: int) -> bool:
    try:
        return os.stat(path).st_size == nbytes
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _locked(lock_path: str) -> Iterator[None]:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
