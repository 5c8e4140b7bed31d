"""What the score job trusts when it reads its own output back (``--resume``, the lease):
a folder only its user writes, record names of the form it writes itself, and deletes and
renames that stay under their folder.

* :func:`trusted`: a folder the job reads back (the output, its commit log and staging
  folders, the quarantine, the lease folder) must be the running user's and writable by
  no one else, or the job stops before reading it: another user could have put it there
  (a shared folder such as ``/tmp``) with a commit log of their own (a group of the
  user's own with nobody else in it counts as the user: umask 002). Local paths are
  judged with ``os.lstat`` (a symbolic link must be the user's, then its target is
  judged); HDFS by the owner and permission Hadoop's ``FileStatus`` reports; object
  stores and Spark Connect's URIs report no owner worth the name: not checked there.
* :func:`check_record`: every name a commit record gives matches the names the job
  writes (``k=v/`` partition folders, ``gNNNNN-part-...``, ``_staging-gNNNNN-<hex>``).
* :func:`inside`: a path checked to be under its folder before it is removed or renamed.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

from spark_keras.jobs.score.errors import JobError
from spark_keras.spark.paths import HadoopPaths, Paths, file_uri_path, hadoop_filesystem, join, scheme

__all__ = ["STAGING", "trusted", "hadoop_owner", "check_record", "inside", "published", "staged",
           "move_into", "remove"]

STAGING = "_staging-"
_PARTITION = r"[^/=\x00-\x1f]+=[^/=\x00-\x1f]*/"  # k=v/ (Spark escapes / and = in both)
_FILE = re.compile(rf"(?:{_PARTITION})*g(\d{{5,}})-part-[A-Za-z0-9._-]+")
_STAGING = re.compile(rf"{STAGING}g(\d{{5,}})-[0-9a-f]{{12}}")
_HDFS = {"hdfs", "viewfs", "webhdfs", "swebhdfs"}  # Hadoop filesystems that keep owners


def _name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _own_group(gid: int) -> bool:
    """Whether group ``gid`` is the running user's private group (its name the user's,
    nobody else in it nor having it as theirs): what a umask of 002 (Ubuntu's for such
    users) makes folders writable by; Spark Connect's client makes the lease so."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name \
        and set(group.gr_mem) <= {user.pw_name} \
        and all(other.pw_gid != gid or other.pw_uid == user.pw_uid for other in pwd.getpwall())


def _local(path: str) -> tuple[str, str, int, bool] | None:
    """``(owner, running user, mode, group is the user's own)`` of a local path, a
    symbolic link not followed (the user's own: its target judged); None if missing or
    there are no unix owners (Windows)."""
    if not hasattr(os, "geteuid"):
        return None
    try:
        found = os.lstat(path)
        if stat.S_ISLNK(found.st_mode) and found.st_uid == os.geteuid():
            found = os.stat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(found.st_mode):  # another user's link: its owner is refused
        return _name(found.st_uid), _name(os.geteuid()), 0, False
    return (_name(found.st_uid), _name(os.geteuid()), stat.S_IMODE(found.st_mode),
            _own_group(found.st_gid))


def hadoop_owner(spark: Any, path: str) -> tuple[str, str, int, bool] | None:
    """``(owner, running user, mode, False)`` of ``path`` as Hadoop's FileSystem reports
    them (its ``FileStatus`` and the JVM's ``UserGroupInformation``); None if missing."""
    fs, hadoop_path = hadoop_filesystem(spark, path)
    if not fs.exists(hadoop_path):
        return None
    status = fs.getFileStatus(hadoop_path)
    jvm = getattr(spark, "sparkContext", spark)._jvm
    user = jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser()
    return (str(status.getOwner()), str(user.getShortUserName()),
            int(status.getPermission().toShort()), False)


def trusted(paths: Paths, path: str, what: str) -> None:
    """Raise :class:`JobError` (saying how to fix it) if the folder ``path`` (``what``:
    ``"output"``, ``"lease folder"``...) is another user's, or writable by a group (other
    than the user's private one) or by others; nothing if it does not exist or its
    filesystem reports no owner (object stores, a URI on Spark Connect)."""
    place = paths.place(path)
    if scheme(place) is None:  # local: the path as given, its symbolic links not followed
        found = _local(file_uri_path(path) if scheme(path) == "file" else os.path.abspath(path))
    elif isinstance(paths, HadoopPaths) and scheme(place) in _HDFS:
        found = hadoop_owner(paths.spark, path)
    else:
        return
    if found is None:
        return
    owner, user, mode, own_group = found
    if owner != user:
        raise JobError(f"{what} {path!r} is owned by user {owner!r}, not by {user!r} who runs "
                       f"this job: another user may have made it (in a shared folder such "
                       f"as /tmp) to steer or hold back this job; nothing was read from "
                       f"it: have {owner!r} (or root) remove it, or write "
                       f"somewhere only you can")
    writers = [who for who, bit, fine in (("its group", stat.S_IWGRP, own_group),
                                          ("others", stat.S_IWOTH, False))
               if mode & bit and not fine]
    if writers:
        raise JobError(f"{what} {path!r} is writable by {' and '.join(writers)} (mode "
                       f"{mode:04o}): another user could change what this job reads back; "
                       f"nothing was read from it: make it writable by you only (chmod "
                       f"go-w) or write somewhere only you can")


def check_record(record: dict, index: int, path: str) -> None:
    """Raise :class:`JobError` unless every name the commit record of group ``index``
    (at ``path``) gives is one the job writes for that group: output files
    (``k=v/gNNNNN-part-...``) and staging folders (``_staging-gNNNNN-<hex>``), never
    ``..`` nor an absolute path."""
    for key in ("", "invalid_"):
        files = record.get(f"{key}files")
        if files is None:
            continue
        names = [(f"{key}staging", record.get(f"{key}staging"), _STAGING)]
        names += [(f"{key}files", name, _FILE)
                  for name in (files if isinstance(files, list) else [repr(files)])]
        for field, name, form in names:
            found = form.fullmatch(name) if isinstance(name, str) else None
            if found is None or int(found[1]) != index:
                raise JobError(f"commit record {path!r} names {field} {name!r}, not a name "
                               f"this job writes for group {index}; pass --overwrite to "
                               f"start over")


def inside(paths: Paths, root: str, path: str) -> str:
    """``path``, or a :class:`JobError` unless it is under the folder ``root`` (as
    :meth:`Paths.place` spells both: ``..`` and local symbolic links resolved)."""
    top, where = paths.place(root).rstrip("/"), paths.place(path)
    if not where.startswith(top + "/"):
        raise JobError(f"{path!r} is not inside {root!r}: the job removes and renames only "
                       f"what is under its own folders; pass --overwrite to start over")
    return path


def published(index: int, staged: str) -> str:
    """The output name of a file Spark wrote into a group's staging folder as ``staged``
    (``k=1/part-0.parquet`` -> ``k=1/g00003-part-0.parquet``)."""
    folder, _, name = staged.rpartition("/")
    return f"{folder}/g{index:05d}-{name}" if folder else f"g{index:05d}-{name}"


def staged(name: str) -> str:
    """The name under its staging folder of a group's output file (:func:`published`'s
    inverse)."""
    folder, _, name = name.rpartition("/")
    name = name.split("-", 1)[1]
    return f"{folder}/{name}" if folder else name


def move_into(paths: Paths, root: str, source: str, target: str) -> None:
    """Rename ``source`` to ``target``, both checked to be under ``root`` (:func:`inside`),
    making ``target``'s folder first when it is a partition's (``k=1/...``)."""
    inside(paths, root, source)
    inside(paths, root, target)
    folder = target.rpartition("/")[0]
    if "=" in folder.rpartition("/")[2] and not paths.exists(folder):
        paths.make_folder(folder)
    paths.move(source, target)


def remove(paths: Paths, root: str, name: str) -> None:
    """Remove ``root/name``, checked to be under ``root`` (:func:`inside`)."""
    paths.delete(inside(paths, root, join(root, name)))
