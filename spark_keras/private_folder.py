"""Folders whose files this user's processes read back, which no other user of the host
may write: one check for every such local folder (the executors' and Dask's payload
folders, the score job's output, commit log, quarantine and leases).

A process that maps a payload file a sibling wrote (or trusts any file it finds in a
folder) must know that no other user of the host put it there or swapped it since.
:func:`unsafe` says why a folder is not this user's alone (its owner; its mode's group
and other write bits, which under a POSIX ACL are the ACL's mask: no named user or group
writes without them; a symbolic link another user owns; with ``holder``, the folder
holding it, which could swap it); :func:`make_folder` makes folders nobody else writes,
whatever the umask or a shared folder's default ACL; :func:`private_folder` makes one
(mode 0700) or takes an existing one only if it passes. Nothing here imports Spark.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

from spark_keras.errors import LocalWriteError

__all__ = ["private_folder", "make_folder", "unsafe", "unsafe_holder", "Unsafe", "writers",
           "user_name"]

_ACL_ACCESS, _ACL_DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
_ACL_NAMED = {0x02: "user", 0x08: "group"}  # ACL_USER, ACL_GROUP (linux/posix_acl.h)
_ACL_GROUP_OBJ, _ACL_MASK, _ACL_WRITE = 0x04, 0x10, 0x02


@dataclass(frozen=True)
class Unsafe:
    """Why a local folder is not this user's alone: the folder at fault (the one asked
    about, a symbolic link on its way, or the folder holding it), what is wrong (a phrase
    that follows its name) and the fix."""

    folder: str
    why: str
    fix: str


def private_folder(path: str, *, holder: bool = False) -> str:
    """``path``, made (mode 0700, missing parents too, no inherited ACL:
    :func:`make_folder`) if it is absent, once :func:`unsafe` finds nothing wrong with it
    (and, with ``holder``, with the folder holding it, judged before anything is made in
    it).

    Raises:
        LocalWriteError: ``path`` (or its holder) is not this user's alone, naming the
            folder at fault, what is wrong and the fix; or it cannot be made.
    """
    if holder:
        _raise(unsafe_holder(path))
    try:
        make_folder(path, 0o700)
        bad = unsafe(path, holder=holder)
    except OSError as exc:
        raise LocalWriteError(f"cannot make the folder {path!r}: {exc}") from exc
    _raise(bad)
    return path


def make_folder(path: str, mode: int = 0o755) -> None:
    """Make the local folder ``path`` and its missing parents, each with ``mode`` (less
    the umask), none writable by group or others (given such a ``mode``), and each
    stripped of the ACL a default ACL of its parent gave it (a shared team folder's
    ``setfacl -d -m u:someone:rwx``), so that nobody else writes in it nor in what is made
    in it later. Folders that exist are left as they are (the caller judges them).

    Raises:
        OSError: a folder cannot be made.
    """
    missing, folder = [], os.path.abspath(path)
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, mode)
        except FileExistsError:
            continue  # made meanwhile by another process: not this one's to change
        for name in (_ACL_ACCESS, _ACL_DEFAULT) if hasattr(os, "removexattr") else ():
            try:
                os.removexattr(folder, name)
            except OSError:  # none (ENODATA), or no ACLs on this filesystem
                pass


def unsafe(path: str, *, holder: bool = False) -> Unsafe | None:
    """Why the local folder ``path`` is not this user's alone; None if it is (or there
    are no unix owners: Windows). It must be a folder (or a symbolic link of this user or
    root to one), owned by this user, writable by neither its group nor others. With
    ``holder``, the folder holding it must be safe too (:func:`unsafe_holder`): else
    another user could rename ``path`` away and put a folder of theirs in its place.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    if not hasattr(os, "geteuid"):
        return None
    st, bad = _followed(path)
    if bad is not None:
        return bad
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return Unsafe(path, "is not a folder", "remove it")
    if st.st_uid != me:
        return Unsafe(path, f"is owned by user {user_name(st.st_uid)}, not by "
                            f"{user_name(me)} who runs this process",
                      f"have {user_name(st.st_uid)} (or root) remove it")
    who = writers(path, st)
    if who:
        return Unsafe(path, f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})",
                      "make it writable by you only (chmod go-w" +
                      ("; setfacl -b)" if "ACL" in who else ")"))
    return unsafe_holder(path) if holder else None


def unsafe_holder(path: str) -> Unsafe | None:
    """Why the folder holding ``path`` (where its name lives, and where its target's
    does; ``path`` need not exist yet) could swap it: it must be this user's or root's
    (a symbolic link too), and writable by nobody else unless sticky (``/tmp``). None if
    it is safe, or missing."""
    if not hasattr(os, "geteuid"):
        return None
    for parent in dict.fromkeys((os.path.dirname(os.path.abspath(path)),
                                 os.path.dirname(os.path.realpath(path)))):
        try:
            bad = _holder_unsafe(parent, path)
        except FileNotFoundError:
            continue  # made later, with the folders it holds
        if bad is not None:
            return bad
    return None


def writers(path: str, st: os.stat_result) -> str:
    """Who besides its owner may write ``path`` (stat ``st``), in words: ``"its group"``
    (or the users and groups its POSIX ACL lets write: under an ACL the mode's group bits
    are its mask), ``"others"``; ``""`` if nobody."""
    who = []
    if st.st_mode & stat.S_IWGRP:
        named = _acl_writers(path)
        who += [f"{' and '.join(named)} through its ACL"] if named else ["its group"]
    if st.st_mode & stat.S_IWOTH:
        who.append("others")
    return " and ".join(who)


def _acl_writers(path: str) -> list[str]:
    """The named users and groups (and the owning group) the POSIX ACL of ``path`` lets
    write; [] without an extended ACL. The xattr: a 4-byte version (2), then 8-byte
    entries (tag u16, permissions u16, id u32), little-endian."""
    try:
        raw = os.getxattr(path, _ACL_ACCESS)
    except (OSError, AttributeError):  # no ACL (ENODATA), none on this filesystem, no xattrs
        return []
    if len(raw) < 4 or (len(raw) - 4) % 8 or struct.unpack_from("<I", raw)[0] != 2:
        return []
    entries = [struct.unpack_from("<HHI", raw, at) for at in range(4, len(raw), 8)]
    if not any(tag == _ACL_MASK and perm & _ACL_WRITE for tag, perm, _ in entries):
        return []  # a minimal ACL (no mask), or a mask that lets no one write
    found = []
    for tag, perm, who in entries:
        if perm & _ACL_WRITE and tag in _ACL_NAMED:
            found.append(f"{_ACL_NAMED[tag]} "
                         f"{user_name(who) if tag == 0x02 else _group_name(who)}")
        elif perm & _ACL_WRITE and tag == _ACL_GROUP_OBJ:
            found.append("its group")
    return found


def _followed(path: str) -> tuple[os.stat_result, Unsafe | None]:
    """``path``'s stat, a symbolic link followed if this user or root owns it; another
    user's link is at fault (they may point it elsewhere at any time)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (os.geteuid(), 0):
            return st, Unsafe(path, f"is a symbolic link owned by user {user_name(st.st_uid)}, "
                                    f"who may point it elsewhere at any time",
                              f"have {user_name(st.st_uid)} (or root) remove it")
        st = os.stat(path)
    return st, None


def _holder_unsafe(parent: str, path: str) -> Unsafe | None:
    st, bad = _followed(parent)
    if bad is not None:
        return bad
    if st.st_uid not in (os.geteuid(), 0):
        return Unsafe(parent, f"(holding {path!r}) is owned by user {user_name(st.st_uid)}, "
                              f"who may replace what it holds",
                      "use a folder of your own (or root's) to hold it")
    who = writers(parent, st)
    if who and not st.st_mode & stat.S_ISVTX:
        return Unsafe(parent, f"(holding {path!r}) is writable by {who} and not sticky (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}), who may replace what it holds",
                      "make it writable by its owner only (chmod go-w), or use another "
                      "folder to hold it")
    return None


def _raise(bad: Unsafe | None) -> None:
    if bad is not None:
        raise LocalWriteError(f"the folder {bad.folder!r} {bad.why}: another user of this host "
                              f"could plant or swap the files read from it; not used "
                              f"({bad.fix})")


def user_name(uid: int) -> str:
    """``'name'`` of user ``uid`` (``uid N`` if it has none)."""
    try:
        import pwd

        return repr(pwd.getpwuid(uid).pw_name)
    except (ImportError, KeyError):
        return f"uid {uid}"


def _group_name(gid: int) -> str:
    try:
        import grp

        return repr(grp.getgrgid(gid).gr_name)
    except (ImportError, KeyError):
        return f"gid {gid}"
