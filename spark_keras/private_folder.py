"""Folders whose files this user's processes read back, which no other user of the host
may write.

A process that maps a payload file a sibling wrote (or trusts any file it finds in a
folder) must know that no other user of the host put it there or swapped it since:
:func:`private_folder` makes such a folder (mode 0700), or takes an existing one only if
it is this user's alone, and names what is wrong otherwise. Nothing here imports Spark.
"""

from __future__ import annotations

import os
import stat

from spark_keras.errors import LocalWriteError

__all__ = ["private_folder"]

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def private_folder(path: str, *, holder: bool = False) -> str:
    """``path``, made (mode 0700; missing parents as ``os.makedirs`` makes them) if it is
    absent, once checked to be this user's alone: a folder (not a symbolic link), owned by
    this process's user, that neither its group nor others may write.

    With ``holder``, the folder holding ``path`` is checked too: owned by this user or
    root, and not writable by group or others unless sticky (``/tmp``); otherwise another
    user could rename ``path`` away and put a folder of theirs in its place.

    Raises:
        LocalWriteError: ``path`` (or its holder) is not private, naming it, its owner and
            mode; or it cannot be made (an ``OSError`` of ``os.makedirs``).
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise LocalWriteError(f"cannot make the folder {path!r}: {exc}") from exc
    if not hasattr(os, "geteuid"):
        return path  # no unix owners to check (Windows)
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        _refuse(path, st, "is not a folder (a symbolic link or a file)")
    if st.st_uid != me:
        _refuse(path, st, f"is owned by {_user(st.st_uid)}, not by {_user(me)}, who runs this "
                          f"process")
    if st.st_mode & _OTHERS_WRITE:
        _refuse(path, st, "may be written by its group or others")
    if holder:
        parent = os.path.dirname(os.path.abspath(path))
        pst = os.stat(parent)
        if pst.st_uid not in (me, 0):
            _refuse(parent, pst, f"(holding {path!r}) is owned by {_user(pst.st_uid)}, who "
                                 f"may replace what it holds")
        if pst.st_mode & _OTHERS_WRITE and not pst.st_mode & stat.S_ISVTX:
            _refuse(parent, pst, f"(holding {path!r}) may be written by its group or others, "
                                 f"who may replace what it holds (it is not sticky)")
    return path


def _refuse(path: str, st: os.stat_result, why: str) -> None:
    raise LocalWriteError(
        f"the folder {path!r} {why} (mode {stat.S_IMODE(st.st_mode):04o}): another user of this "
        f"host could plant or swap the files read from it; not used (remove it, or make it "
        f"this user's alone: chown, chmod 700)")


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"
