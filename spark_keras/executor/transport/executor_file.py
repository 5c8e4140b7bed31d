"""The executor's file of a model's payload (:mod:`spark_keras.payload.host_file`):
where an executor keeps it, the workers that share it, the copies killed executors left
beside it, and a model built on it (:func:`build_written`, for the transports whose
first worker writes the file)."""

from __future__ import annotations

import glob
import logging
import os
import tempfile
from typing import Any

from spark_keras import flavour
from spark_keras.payload import host_file
from spark_keras.payload.shipment import Shipment

logger = logging.getLogger("spark_keras")


def executor_folder() -> str | None:
    """Where this executor keeps payload files (None where there is none).

    In a Python worker: the executor's first block manager directory, which Spark
    passes to its workers as ``SPARK_LOCAL_DIRS`` and deletes when the executor stops.
    Elsewhere (a driver, a plain process) None: a handle unpickled there builds its
    model from the broadcast value alone."""
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS")
    return os.path.join(local_dirs.split(",")[0], host_file.FOLDER_NAME) if local_dirs else None


# In a worker: this process's share of the executor's file of each model it built
# (host_file.join), held until the model is released or the process ends
_shares: dict[str, int] = {}


def join_executor_file(folder: str, key: str) -> None:
    """Before a worker builds ``key`` on the executor's file: count it among the file's
    users (once per process), and remove the copies of the file that executors of this
    application killed on this host left in their folders (Spark deletes an executor's
    folder when it stops, not when it is killed: the application's end would)."""
    if key not in _shares:
        try:
            _shares[key] = host_file.join(folder, key, owner=_executor_pid())
        except OSError as exc:  # the build that follows falls back, or names the folder
            logger.debug("cannot count this worker among the users of %s in %s: %s",
                         key, folder, exc)
    host_file.reclaim(_sibling_folders(folder, key), key)


def _sibling_folders(folder: str, key: str) -> list[str]:
    """The payload folders holding ``key`` of the other executors whose block manager
    directories are beside this executor's (this application's executors on this host:
    one standalone worker's, or one YARN node's; keys are unique to a handle)."""
    blockmgr = os.path.dirname(folder)
    if not os.path.basename(blockmgr).startswith("blockmgr-"):
        return []
    users = os.path.basename(host_file.users_path(folder, key))
    pattern = os.path.join(glob.escape(os.path.dirname(blockmgr)), "blockmgr-*",
                           host_file.FOLDER_NAME, glob.escape(users))
    return [os.path.dirname(p) for p in glob.glob(pattern) if os.path.dirname(p) != folder]


def _executor_pid() -> int | None:
    """This worker's executor: its nearest ancestor process that runs another program
    than this interpreter (the JVM, which starts the Python daemon that forks workers,
    or the workers themselves without a daemon). None where ``/proc`` cannot tell."""
    try:
        me = os.readlink("/proc/self/exe")
        pid: int | None = os.getppid()
        while pid and pid > 1:
            if os.readlink(f"/proc/{pid}/exe") != me:
                return pid
            pid = host_file.parent_of(pid)
    except OSError:
        pass
    return None


def discard_files(keys: list[str]) -> None:
    """In a worker: give up this process's share of the executor's file of each of
    ``keys`` (released models) and remove the file."""
    folder = executor_folder()
    if folder is not None:
        for key in keys:
            share = _shares.pop(key, None)
            if share is not None:
                os.close(share)
            host_file.discard(folder, key)


def build_written(recipe: Shipment, key: str, nbytes: int, share_weights: bool,
                   write: Any, in_memory: Any, verify: Any = None, rewrite: Any = None
                   ) -> tuple:
    """``(model, nbytes, memory)`` built on the executor's file of ``key``, which the
    first worker writes with ``write(file)`` (``in_memory()``: the payload, if the
    folder cannot be written); ``verify(path)`` refuses a file found written that is
    not the expected payload (:func:`.host_file.land`); ``rewrite(file)`` rewrites one
    found damaged (by default ``write``)."""
    share = share_weights and flavour.current().shares_weights
    folder = executor_folder()
    if folder is not None:
        join_executor_file(folder, key)
        return recipe.build_shared(folder, key, nbytes, write=write, share_weights=share,
                                   fallback=in_memory, verify=verify, rewrite=rewrite)
    with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:  # not in an executor
        return recipe.build_shared(tmp, key, nbytes, write=write, share_weights=False,
                                   fallback=in_memory, verify=verify, rewrite=rewrite)
