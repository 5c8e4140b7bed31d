"""The folder of the driver's payload copies, and the removal of those dead drivers left.

The payload copies the driver's channel serves live in a folder
``spark_keras_versions_<pid>_<random>`` (mode 0700) of the temporary folder, removed at
exit. Its driver holds an exclusive ``flock`` on the folder's ``.lock`` file for its
whole life (:func:`locked_folder`), which the kernel releases when the driver dies
however it dies: each start removes the folders of this user whose lock it can take
(:func:`remove_stale_folders`: a driver killed with SIGKILL cannot remove its own), and
never one whose driver lives, whatever its pid means here (drivers in other PID
namespaces sharing the folder).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile

logger = logging.getLogger("spark_keras")

# spark_keras_versions_<pid>_<mkdtemp's 8 characters> (older names had no pid: kept)
_FOLDER_PREFIX = "spark_keras_versions_"
_FOLDER = re.compile(_FOLDER_PREFIX + r"([0-9]{1,10})_[a-z0-9_]{8}")
_FOLDER_LOCK = ".lock"  # in a driver's folder: flock'd by its driver while it lives


def locked_folder() -> tuple[str, int]:
    """A new payload folder (mode 0700) and the descriptor of its lock file, locked
    (exclusive ``flock``) until it is closed or this process dies."""
    while True:
        folder = tempfile.mkdtemp(prefix=f"{_FOLDER_PREFIX}{os.getpid()}_")
        lock = os.path.join(folder, _FOLDER_LOCK)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            if _identity(lock) == (st.st_dev, st.st_ino):
                return folder, fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # a sweep took it between its making and its locking: another


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def remove_stale_folders(folder: str | None = None) -> list[str]:
    """Remove the payload folders that this user's dead drivers left in ``folder`` (the
    temporary folder): a driver killed with SIGKILL skips its exit's clean-up. A folder
    goes only if the lock its driver holds for its life can be taken (the kernel
    released it: the driver died); folders of live drivers (in whatever PID namespace
    or on whatever host shares the folder, as far as ``flock`` reaches), of other users,
    or without a lock file (being made, or left by an earlier version) stay.

    Returns:
        The folders removed.
    """
    folder = folder or tempfile.gettempdir()
    if not hasattr(os, "getuid"):
        return []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        if not _FOLDER.fullmatch(name):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, _FOLDER_LOCK), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:  # no lock file (or gone already): left alone
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its driver lives (this process's own included)
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    if removed:
        logger.info("removed the payload folders of dead drivers: %s", ", ".join(removed))
    return removed


def remove(path: str) -> None:
    """Remove the file at ``path`` if it is there."""
    with contextlib.suppress(OSError):
        os.remove(path)
