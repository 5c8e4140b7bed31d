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
  the file is rewritten unless another process already did;
* :func:`discard` takes the same lock before removing the file, the temporary files of
  dead writers and the lock file itself; a process granted a lock on a lock file that
  no longer has its name lets it go and takes the new one, so mutual exclusion holds
  across a discard;
* a folder that cannot be written (full, read-only, denied) raises
  :class:`LocalWriteError` naming it, with no temporary file left behind: the caller
  can still build from the payload in memory.

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

from ..errors import ArgumentTypeError, LocalWriteError, PayloadError, SparkKerasError
from ..storage import write_atomically

logger = logging.getLogger("spark_keras")

SUFFIX = ".skp"
FOLDER_NAME = "spark-keras-payloads"
"""The name of the folder that holds a host's payload files (beside Dask's scratch
folders, in a Spark executor's local directory). Dask puts its scratch place on its
workers' ``sys.path``: the name must not be importable (a hyphen), or an empty folder
named like the package would shadow an editable install of it."""


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
    with _local_failures(folder, path):
        os.makedirs(folder, exist_ok=True)
        with _locked(f"{path}.lock"):
            current = identity(path)
            if _complete(path, nbytes) and (damaged is None or current != damaged):
                return path
            _remove_stale(path)
            started = time.perf_counter()
            write_atomically(path, functools.partial(_write_checked, write, key, nbytes))
    logger.info("wrote %s (%.1f MB) in %.2fs%s", path, nbytes / 2**20,
                time.perf_counter() - started, " (the old copy was damaged)" if damaged else "")
    return path


def _write_checked(write: Callable[[BinaryIO], Any], key: str, nbytes: int, f: BinaryIO) -> None:
    write(f)
    if f.tell() != nbytes:
        raise PayloadError(f"the payload of {key} is {f.tell()} bytes, expected {nbytes}")


@contextlib.contextmanager
def _local_failures(folder: str, path: str) -> Iterator[None]:
    """OSErrors raised inside as :class:`LocalWriteError` naming the folder; spark_keras's
    own errors (a :class:`StorageError` reading the source, a :class:`PayloadError`) pass."""
    try:
        yield
    except SparkKerasError:
        raise
    except OSError as exc:
        raise LocalWriteError(f"cannot write the payload file {os.path.basename(path)!r} in "
                              f"the folder {folder!r}: {exc}") from exc


def _write_fetched(fetch: Callable[[], Any], f: BinaryIO) -> None:
    f.write(memoryview(fetch()).cast("B"))


def discard(folder: str, key: str) -> None:
    """Remove ``key``'s file, the temporary files of dead writers and the lock file,
    holding the lock (a live writer finishes first; a process waiting for the lock
    then takes a new one). Processes that mapped the file keep their mapping. A
    failure is logged, not raised: the folder goes with its executor or worker at the
    latest."""
    path = path_for(folder, key)
    lock = f"{path}.lock"
    try:
        if not any(map(os.path.exists, (path, lock))) and not _temporaries(path):
            return  # nothing to remove (and no lock file to create)
        with _locked(lock):
            _remove(path)
            _remove_stale(path)
            _remove(lock)  # held by this process alone: waiters see it gone and retry
    except OSError as exc:
        logger.warning("cannot remove the payload file %s: %s", path, exc)


def _temporaries(path: str) -> list[str]:
    return glob.glob(glob.escape(path) + ".tmp-*")


def _remove_stale(path: str) -> None:
    """Remove the temporary files of ``path``'s writers; call it holding the lock (a
    live writer holds it while its temporary file exists, so these writers died)."""
    for stale in _temporaries(path):
        _remove(stale)


def _complete(path: str, nbytes: int) -> bool:
    try:
        return os.stat(path).st_size == nbytes
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def _locked(lock_path: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock_path``, which names the locked file when it is
    granted: a lock file :func:`discard` removed while this process waited for it is
    let go, and the new one taken."""
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _names(lock_path, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


def _names(path: str, fd: int) -> bool:
    """True if ``path`` is the file open as ``fd``."""
    st = os.fstat(fd)
    return identity(path) == (st.st_dev, st.st_ino)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
