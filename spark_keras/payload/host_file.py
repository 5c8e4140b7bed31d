"""One payload file per host (or per Spark executor), written by the first process that
needs it and memory-mapped by all of them.

Protocol, for processes that may start, die or race at any moment:

* a reader that finds ``<name>`` complete (its size is the payload's) uses it without
  taking any lock; given ``verify`` (the digest the plan fixed, checked by its caller),
  only once that file passed it: once per process and file, by its identity, size and
  times (a file replaced since, or written through its size or times, is checked again;
  one that fails is refused. A check before mapping: the executor's user, trusted as
  for Spark's own files, can still change it after, or through a shared mapping that
  keeps its times);
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
* the folder, the files and their lock and users files are the owner's alone (0700 and
  0600): the processes sharing them run as one user; a folder found made that is not
  this user's alone (another owner, group- or other-writable: planted by another user
  of the host) is refused with :class:`LocalWriteError` naming it
  (:func:`~spark_keras.private_folder.private_folder`), before anything is read from it;
* a folder that cannot be written (full, read-only, denied) raises
  :class:`LocalWriteError` naming it, with no temporary file left behind: the caller
  can still build from the payload in memory; a source that fails (the network) raises
  its own error, never that one, and a file whose write raised is never published;
* a process that builds on the file counts itself among its users (:func:`join`: a
  shared ``flock`` on ``<name>.users``, which the kernel also releases when the process
  dies); :func:`leave` removes the file with its last user (Dask), and :func:`reclaim`
  removes the files other folders' dead owners left (a killed Spark executor's).

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
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from spark_keras.errors import ArgumentTypeError, LocalWriteError, PayloadError, SparkKerasError
from spark_keras.payload import mapped
from spark_keras.private_folder import private_folder
from spark_keras.storage import write_atomically

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
         damaged: tuple[int, int] | None = None,
         verify: Callable[[str], Any] | None = None) -> str:
    """The path of ``key``'s payload file in ``folder``, written by whichever process
    comes first: from ``fetch()`` (the payload, bytes-like), or by ``write(file)``
    (which streams it into an open file, whose ``name`` it may read back). Either way
    it must be ``nbytes`` long.

    ``verify(path)`` raises (a :class:`PayloadError` naming the file) unless the file
    is the payload its caller expects: a file found written is checked with it once per
    process and file (:func:`_checked`); one this call writes is taken as checked, so
    ``write`` (or ``fetch``) must check what it writes the same way."""
    if (fetch is None) == (write is None):
        raise ArgumentTypeError("land() takes one of fetch and write")
    if write is None:
        assert fetch is not None  # one of the two, checked above
        write = functools.partial(_write_fetched, fetch)
    path = path_for(folder, key)
    private_folder(folder)  # another user's folder is never read from, nor written
    if damaged is None and _complete(path, nbytes):
        return _checked(path, verify)
    with _local_failures(folder, path):
        with _locked(f"{path}.lock"):
            current = identity(path)
            found = _complete(path, nbytes) and (damaged is None or current != damaged)
            if not found:
                _remove_stale(path)
                started = time.perf_counter()
                write_atomically(path, functools.partial(_write_checked, write, key, nbytes),
                                 mode=0o600)
                if verify is not None:
                    _remember_checked(path)
    if found:
        return _checked(path, verify)
    logger.info("wrote %s (%.1f MB) in %.2fs%s", path, nbytes / 2**20,
                time.perf_counter() - started, " (the old copy was damaged)" if damaged else "")
    return path


# In this process: the payload files that passed their caller's verify (land), by path:
# (device, inode, size, mtime, ctime) then; a file replaced or written since differs (a
# write through a shared mapping may not: the executor's user is trusted, see above)
_verified: dict[str, tuple[int, ...]] = {}
_MAX_VERIFIED = 1024


def _stamp(path: str) -> tuple[int, ...]:
    return mapped.stamp(os.stat(path))


def checked_stamp(path: str) -> tuple[int, ...] | None:
    """The :func:`.mapped.stamp` of the file at ``path`` that passed its caller's
    ``verify`` in this process (None if none did): what its mapping must still be."""
    return _verified.get(path)


def _checked(path: str, verify: Callable[[str], Any] | None) -> str:
    """``path``, once ``verify(path)`` passed for the file there now (at most once per
    process and file)."""
    if verify is not None:
        stamp = _stamp(path)
        if _verified.get(path) != stamp:
            verify(path)  # raises for a file that is not the expected payload
            _remember_checked(path, stamp)
    return path


def _remember_checked(path: str, stamp: tuple[int, ...] | None = None) -> None:
    if len(_verified) >= _MAX_VERIFIED:
        _verified.clear()
    _verified[path] = stamp or _stamp(path)


def _write_checked(write: Callable[[BinaryIO], Any], key: str, nbytes: int, f: BinaryIO) -> None:
    write(f)
    if f.tell() != nbytes:
        raise PayloadError(f"the payload of {key} is {f.tell()} bytes, expected {nbytes}")


@contextlib.contextmanager
def _local_failures(folder: str, path: str) -> Iterator[None]:
    """OSErrors raised inside as :class:`LocalWriteError` naming the folder; spark_keras's
    own errors (a :class:`StorageError` reading the source, a :class:`PayloadError`, a
    ``ChannelError``) pass, and so do network errors a source raises as they are (a reset,
    a timeout): they are not the folder's, and must not send the caller to a private copy."""
    try:
        yield
    except (SparkKerasError, ConnectionError, TimeoutError):
        raise
    except OSError as exc:
        raise LocalWriteError(f"cannot write the payload file {os.path.basename(path)!r} in "
                              f"the folder {folder!r}: {exc}") from exc


def _write_fetched(fetch: Callable[[], Any], f: BinaryIO) -> None:
    f.write(memoryview(fetch()).cast("B"))


def discard(folder: str, key: str) -> None:
    """Remove ``key``'s file, the temporary files of dead writers, the users file and
    the lock file, holding the lock (a live writer finishes first; a process waiting
    for the lock then takes a new one). Processes that mapped the file keep their mapping. A
    failure is logged, not raised: the folder goes with its executor or worker at the
    latest."""
    path = path_for(folder, key)
    lock = f"{path}.lock"
    try:
        if not any(map(os.path.exists, (path, lock, users_path(folder, key)))) \
                and not _temporaries(path):
            return  # nothing to remove (and no lock file to create)
        with _locked(lock):
            _remove(path)
            _remove_stale(path)
            _remove(users_path(folder, key))  # joiners waiting on it see it gone
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
    except (FileNotFoundError, NotADirectoryError):  # the folder's own problem: named when written
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


# --- the processes using a file ---------------------------------------------------------

def users_path(folder: str, key: str) -> str:
    return f"{path_for(folder, key)}.users"


def join(folder: str, key: str, owner: int | None = None) -> int:
    """Count this process among the users of ``key``'s file in ``folder``: a shared
    ``flock`` on ``<file>.users``, held on the returned descriptor until :func:`leave`
    (or this process's death: the kernel releases it). Join before :func:`land`, so
    that nobody takes the file for unused between its writing and its use.

    Args:
        folder: the payload folder.
        key: the model's key.
        owner: the pid of the process whose life bounds the folder's (a Spark
            executor): recorded, with its start time, so that :func:`reclaim` in other
            folders can tell when it died.

    Raises:
        OSError: the folder or the users file cannot be made.
    """
    private_folder(folder)
    path = users_path(folder, key)
    record = process_identity(owner) if owner is not None else None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if _names(path, fd):
                if record is not None and os.fstat(fd).st_size == 0:
                    os.pwrite(fd, record.encode(), 0)  # the owner's workers all write it
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the last user removed that file while we waited: use the new one


def leave(fd: int, folder: str, key: str) -> bool:
    """Give up this process's share (``fd`` from :func:`join`); if no other process holds
    one (its lock turns exclusive), remove the file (:func:`discard`). True if this
    process removed it."""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # other processes still use the file
        if not _names(users_path(folder, key), fd):
            return False  # another last user removed it first
        discard(folder, key)
        return True
    finally:
        os.close(fd)


def reclaim(folders: Iterable[str], key: str) -> list[str]:
    """Remove ``key``'s files from those of ``folders`` whose owner (recorded by
    :func:`join`) died and whose file no live process has joined: what a killed Spark
    executor left beside the folder of its replacement. A folder whose owner is alive
    or unknown, or whose file a live process uses, is left alone. Failures are logged.

    Returns:
        The payload files removed.
    """
    removed = []
    for folder in folders:
        path = users_path(folder, key)
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue  # nobody joined there (or it is gone)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no live user, or skip it
            owner = os.pread(fd, 64, 0).decode("ascii", "replace")
            if not _names(path, fd) or not owner or _alive(owner):
                continue
            existed = os.path.exists(path_for(folder, key))
            discard(folder, key)
            if existed and not os.path.exists(path_for(folder, key)):
                removed.append(path_for(folder, key))
                logger.info("removed %s, left by process %s, which died", path_for(folder, key),
                            owner.split(":")[0])
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # if nothing else is left in it
        except BlockingIOError:
            continue  # a live process uses it
        except OSError as exc:
            logger.warning("cannot reclaim the payload file %s: %s", path_for(folder, key), exc)
        finally:
            os.close(fd)
    return removed


def process_identity(pid: int) -> str | None:
    """``"<pid>:<start time>"`` of a live process (None if it is gone or there is no
    ``/proc``): unlike a pid alone, never the identity of a later process."""
    fields = _stat(pid)
    return f"{pid}:{int(fields[19])}" if fields else None  # field 22: starttime


def parent_of(pid: int) -> int | None:
    """The parent's pid of a live process (None if it is gone or there is no ``/proc``)."""
    fields = _stat(pid)
    return int(fields[1]) if fields else None  # field 4: ppid


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat``'s fields from the third (the state) on."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()  # the name may hold ")" and spaces
    except (OSError, IndexError):
        return None


def _alive(identity: str) -> bool:
    pid = identity.split(":")[0]
    return pid.isdigit() and process_identity(int(pid)) == identity
