"""What the score job trusts when it reads its own output back (``--resume``, the lease):
a folder only its user writes, record names of the form it writes itself, and deletes and
renames that stay under their folder.

* :func:`trusted`: a folder the job reads back (the output, its commit log and staging
  folders, the quarantine, the lease folder) must be the running user's and writable by
  no one else, or the job stops before reading it: another user could have put it there
  (a shared folder such as ``/tmp``) with a commit log of their own. Local paths are
  judged by :func:`spark_keras.private_folder.unsafe` (``lstat``: a symbolic link must be
  the user's or root's, then its target is judged; the mode's group bits, an ACL's mask;
  the folder holding it, which could swap it); HDFS by the owner and permission Hadoop's
  ``FileStatus`` reports; object stores and Spark Connect's URIs report no owner worth
  the name: not checked there.
* :func:`make_folder`: the folders the job makes locally are writable by no one else,
  whatever the umask or a shared folder's default ACL (so a umask of 002 does not get
  the job's own folders refused); :func:`foreign_owner`: a lease's holder file must be
  the user's too.
* :func:`check_record`: every name a commit record gives matches the names the job
  writes (``k=v/`` partition folders, ``gNNNNN-part-...``, ``_staging-gNNNNN-<hex>`` or a
  wave's ``_staging-wNNNNN-<hex>/__spark_keras_group=N``).
* :func:`inside`: a path checked to be under its folder before it is removed or renamed.
"""

from __future__ import annotations

import os
import re
from typing import Any

from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import HadoopPaths, Paths, failing, join
from spark_keras.private_folder import Unsafe, unsafe, unsafe_holder, user_name
from spark_keras.private_folder import make_folder as make_local_folder
from spark_keras.spark.paths import file_uri_path, hadoop_filesystem, scheme

__all__ = ["STAGING", "GROUP_COL", "trusted", "hadoop_owner", "foreign_owner", "make_folder", "check_record",
           "inside", "published", "staged", "move_into", "remove"]

STAGING = "_staging-"
_PARTITION = r"[^/=\x00-\x1f]+=[^/=\x00-\x1f]*/"  # k=v/ (Spark escapes / and = in both)
_FILE = re.compile(rf"(?:{_PARTITION})*g(\d{{5,}})-part-[A-Za-z0-9._-]+")
GROUP_COL = "__spark_keras_group"  # a wave's hidden column: the folder of each group's files
_STAGING = re.compile(rf"{STAGING}(?:g(\d{{5,}})|w\d{{5,}})-[0-9a-f]{{12}}(?:/{GROUP_COL}=(\d+))?")
_HDFS = {"hdfs", "viewfs", "webhdfs", "swebhdfs"}  # Hadoop filesystems that keep owners


def _local(path: str) -> str:
    """The local path of a plain path or a ``file:`` URI."""
    return file_uri_path(path) if scheme(path) == "file" else os.path.abspath(path)


def hadoop_owner(spark: Any, path: str) -> tuple[str, str, int] | None:
    """``(owner, running user, mode)`` of ``path`` as Hadoop's FileSystem reports them
    (its ``FileStatus`` and the JVM's ``UserGroupInformation``); None if missing."""
    fs, hadoop_path = hadoop_filesystem(spark, path)
    if not fs.exists(hadoop_path):
        return None
    status = fs.getFileStatus(hadoop_path)
    jvm = getattr(spark, "sparkContext", spark)._jvm
    user = jvm.org.apache.hadoop.security.UserGroupInformation.getCurrentUser()
    return (str(status.getOwner()), str(user.getShortUserName()),
            int(status.getPermission().toShort()))


def _hdfs(paths: Paths, path: str) -> HadoopPaths | None:
    """``paths`` if ``path`` is on a Hadoop filesystem that keeps owners."""
    return paths if isinstance(paths, HadoopPaths) and scheme(paths.place(path)) in _HDFS \
        else None


def trusted(paths: Paths, path: str, what: str) -> None:
    """Raise :class:`JobError` (saying how to fix it) if the folder ``path`` (``what``:
    ``"output"``, ``"lease folder"``...) is another user's or writable by anyone else;
    nothing if its filesystem reports no owner (object stores, a URI on Spark Connect).
    A local one is judged by :func:`~spark_keras.private_folder.unsafe` and its holder
    (even if ``path`` is not made yet); on HDFS (if it exists) by the owner and mode
    Hadoop reports."""
    if scheme(paths.place(path)) is None:  # local: the path as given, links not followed
        try:
            bad = unsafe(_local(path), holder=True)
        except FileNotFoundError:  # to be made: not in a folder that could swap it
            bad = unsafe_holder(_local(path))
    elif (hadoop := _hdfs(paths, path)) is not None:
        found = hadoop_owner(hadoop.spark, path)
        if found is None:
            return
        owner, user, mode = found
        who = " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002))
                           if mode & bit)
        bad = Unsafe(path, f"is owned by user {owner!r}, not by {user!r} who runs this job",
                     f"have {owner!r} (or a superuser) remove it") if owner != user else \
            Unsafe(path, f"is writable by {who} (mode {mode:04o})",
                   "make it writable by you only (chmod go-w)") if who else None
    else:
        return
    if bad is not None:
        at = "" if bad.folder in (path, _local(path)) else f": the folder {bad.folder!r}"
        raise JobError(f"{what} {path!r}{at} {bad.why}: another user may have made it (in a "
                       f"shared folder such as /tmp) to steer or hold back this job, or "
                       f"could change what it reads back; nothing was read from it: "
                       f"{bad.fix}, or write somewhere only you can")


def foreign_owner(paths: Paths, path: str) -> str | None:
    """The owner of the file ``path`` if it is not the running user (None if it is, if
    the file is gone, or its filesystem reports no owner)."""
    try:
        if scheme(paths.place(path)) is None:
            uid = os.lstat(_local(path)).st_uid
            return None if not hasattr(os, "geteuid") or uid == os.geteuid() else \
                user_name(uid)
        hadoop = _hdfs(paths, path)
        found = hadoop_owner(hadoop.spark, path) if hadoop is not None else None
    except FileNotFoundError:
        return None
    return repr(found[0]) if found is not None and found[0] != found[1] else None


def make_folder(paths: Paths, path: str) -> None:
    """Make the folder ``path`` (and its parents) as the job's own: a local one writable
    by nobody else whatever the umask or a default ACL around it
    (:func:`~spark_keras.private_folder.make_folder`); elsewhere as the path layer does."""
    if scheme(paths.place(path)) is None:
        with failing("create", path):
            make_local_folder(_local(path))
    else:
        paths.make_folder(path)


def check_record(record: dict, index: int, path: str) -> None:
    """Raise :class:`JobError` unless every name the commit record of group ``index``
    (at ``path``) gives is one the job writes for that group: output files
    (``k=v/gNNNNN-part-...``) and staging folders (``_staging-gNNNNN-<hex>``, or a
    wave's ``_staging-wNNNNN-<hex>/__spark_keras_group=N``), never ``..`` nor an
    absolute path."""
    for key in ("", "invalid_"):
        files = record.get(f"{key}files")
        if files is None:
            continue
        names = [(f"{key}staging", record.get(f"{key}staging"), _STAGING)]
        names += [(f"{key}files", name, _FILE)
                  for name in (files if isinstance(files, list) else [repr(files)])]
        for field, name, form in names:
            found = form.fullmatch(name) if isinstance(name, str) else None
            numbers = [] if found is None else [n for n in found.groups() if n is not None]
            if len(numbers) != 1 or int(numbers[0]) != index:
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
        make_folder(paths, folder)
    paths.move(source, target)


def remove(paths: Paths, root: str, name: str) -> None:
    """Remove ``root/name``, checked to be under ``root`` (:func:`inside`)."""
    paths.delete(inside(paths, root, join(root, name)))
