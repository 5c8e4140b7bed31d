"""How a BroadcastModel's payload reaches executors, and how a worker builds from it.

* :class:`BroadcastTransport` (classic Spark): a broadcast of the payload bytes. The
  first worker of an executor that needs the model writes them to a file in the
  executor's block manager directory; every worker maps that file (one copy of the
  weights per executor).
* :class:`ArtifactTransport` (Spark Connect, which has no SparkContext and no broadcast):
  the payload is uploaded once as a session artifact (``spark.addArtifacts``, streamed in
  chunks, never inside a plan); Spark puts one copy in each executor's session folder,
  which every worker maps directly.
* :class:`StorageTransport` (a model given by URI, classic or Connect): nothing is
  shipped but the URI; the first worker of an executor that needs the model reads it
  straight from storage into the executor's folder, checked against the driver's
  digest, and every worker maps that file.
* :class:`ServedTransport`: the payload streamed from the driver's copy
  (:mod:`.version_server`; ``ship="driver"``, the versions ``update`` ships, a URI's
  file changed in storage), refused unless its SHA-256 is the one the driver fixed.

The model's custom objects and ``safe_mode`` (the payload-less :class:`Shipment`)
travel in the handle itself: small, and needed before any payload is touched.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import hmac
import logging
import os
import random
import tempfile
import time
from typing import Any, BinaryIO, Callable, cast

from spark_keras import flavour
from spark_keras.channel.client import DriverBusy
from spark_keras.errors import ChannelError, LocalWriteError, PayloadError, SparkKerasError, StorageError
from spark_keras.executor.driver_payload import DriverPayload
from spark_keras.payload import host_file
from spark_keras.payload.digest import altered, check_file, file_digest, verifies
from spark_keras.payload.shipment import Shipment
from spark_keras.payload.stored import StoredModel

logger = logging.getLogger("spark_keras")


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except Exception:  # Connect's client libraries are not installed: not a Connect session
        return False
    return isinstance(spark, ConnectSession)


def transport_for(spark: Any, key: str, payload: DriverPayload,
                  keep: Callable[[], "ServedTransport"], ship: str = "auto") -> "Transport":
    """How ``payload`` reaches ``spark``'s executors: from storage if the model has a
    URI (``payload.stored``; from the driver once the file there changed); else from the
    driver's file with ``ship="driver"``; else as a session artifact (Connect; from the
    driver for the tasks that do not see it); else, on classic Spark, as a broadcast with
    ``ship="broadcast"`` or when the payload is in memory (a small one, see
    :mod:`.driver_payload`), from the driver's file when not.

    ``keep()`` is called exactly when the driver must keep a copy to serve: it keeps the
    payload in the driver's version server (setting ``payload.path``) and gives the
    :class:`ServedTransport` that reads it from there."""
    if payload.stored is not None:
        return StorageTransport(payload.stored, rdds=not is_connect(spark), served=keep())
    if ship != "driver" and is_connect(spark):
        served = keep()
        assert payload.path is not None, "keep() puts the payload in the driver's file"
        return ArtifactTransport.upload(spark, key, payload.path, served)
    if ship == "broadcast" or (ship == "auto" and payload.data is not None):
        assert payload.data is not None, "a payload to broadcast is read into memory"
        return BroadcastTransport(getattr(spark, "sparkContext", spark), payload.data)
    return keep()


class Transport:
    """What every transport does; by default there is nothing to renew or release."""

    rdds = True  # usable from rdd.mapPartitions (not on Spark Connect)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        """In a worker: ``(model, nbytes, memory)`` built from the shipped payload."""
        raise NotImplementedError

    def renew(self, blocking: bool) -> None:
        """On the driver, after ``unpersist()``: workers will build again under a new key."""

    def destroy(self, blocking: bool) -> None:
        """On the driver: release what was shipped."""

    def check_alive(self, key: str) -> None:
        """On the driver: raise if what was shipped can no longer reach a task."""

    @staticmethod
    def forget(keys: list[str]) -> None:
        """In a worker: remove the executor's files of released models."""
        _discard_files(keys)


class BroadcastTransport(Transport):
    """The payload as a broadcast (classic Spark)."""

    def __init__(self, sc: Any, payload: bytes) -> None:
        self._sc = sc
        self._broadcast = sc.broadcast(payload)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        folder = executor_folder() if share_weights and flavour.current().shares_weights else None
        try:
            if folder is not None:
                _join_executor_file(folder, key)
                return recipe.build_shared(folder, key, nbytes, fetch=lambda: self._broadcast.value)
            return dataclasses.replace(recipe, payload=self._broadcast.value).build()
        finally:
            _forget_loaded_value(self._broadcast)

    def _context_stopped(self) -> bool:
        """On the driver: whether the SparkContext that made the broadcast stopped."""
        return self._sc is not None and self._sc._jsc is None

    def check_alive(self, key: str) -> None:
        if self._context_stopped():
            raise SparkKerasError(
                f"BroadcastModel {key} was broadcast by a SparkContext that has stopped: its "
                f"tasks cannot load it in another; create the BroadcastModel again in the new "
                f"session (a ship='driver' handle goes on in a new SparkContext)")

    def renew(self, blocking: bool) -> None:
        """Drop the executors' copies; broadcast the payload afresh for later use."""
        payload = self._broadcast.value  # the driver's copy, read from its file
        self._broadcast.destroy(blocking)
        self._broadcast = self._sc.broadcast(payload)

    def destroy(self, blocking: bool) -> None:
        if self._context_stopped():
            return  # its broadcasts went with it
        self._broadcast.destroy(blocking)

    def __reduce__(self) -> tuple:
        return (_broadcast_transport, (self._broadcast,))


def _broadcast_transport(broadcast: Any) -> BroadcastTransport:
    transport = BroadcastTransport.__new__(BroadcastTransport)
    transport._sc, transport._broadcast = None, broadcast
    return transport


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


def _join_executor_file(folder: str, key: str) -> None:
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


def _discard_files(keys: list[str]) -> None:
    folder = executor_folder()
    if folder is not None:
        for key in keys:
            share = _shares.pop(key, None)
            if share is not None:
                os.close(share)
            host_file.discard(folder, key)


def _forget_loaded_value(broadcast: Any) -> None:
    """Let a worker free the unpickled payload bytes once the model is built (PySpark
    reloads a broadcast value from its file on demand), so a worker holds one copy of
    the weights, not two."""
    if getattr(broadcast, "_path", None) is not None:
        broadcast.__dict__.pop("_value", None)


@dataclasses.dataclass(frozen=True)
class ArtifactTransport(Transport):
    """The payload as a Spark Connect session artifact named ``name``. Connect cannot
    remove an artifact: it stays until the session ends, and after ``unpersist()``
    workers rebuild from the same file. Tasks of a streaming query do not see the
    session's artifacts: with ``served`` (the client's copy, :mod:`.version_server`)
    they read the payload from the client instead."""

    name: str
    served: "ServedTransport | None" = None
    rdds = False

    @classmethod
    def upload(cls, spark: Any, key: str, path: str,
               served: "ServedTransport | None" = None) -> "ArtifactTransport":
        """Upload the payload file at ``path`` (linked, else copied) as ``<key>.skp``."""
        name = f"{key}{host_file.SUFFIX}"
        with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:
            artifact = os.path.join(tmp, name)
            _link_or_copy(path, artifact)
            spark.addArtifacts(artifact, file=True)
        return cls(name, served)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        from pyspark import SparkFiles

        path = SparkFiles.get(self.name)
        if not os.path.isfile(path) and self.served is not None:
            return self.served.build(recipe, key, nbytes, share_weights)
        if not os.path.isfile(path):
            raise SparkKerasError(
                f"the model artifact {self.name!r} is not on this executor ({path}): Spark "
                f"Connect keeps artifacts per session; create the BroadcastModel in the "
                f"session that uses it")
        if os.path.getsize(path) != nbytes:
            raise PayloadError(f"the model artifact {path} has {os.path.getsize(path)} bytes, "
                               f"expected {nbytes}: it is damaged; create the BroadcastModel again")
        try:
            return recipe.build_from_file(path, share_weights=share_weights and flavour.current().shares_weights)
        except PayloadError as exc:
            raise PayloadError(f"the model artifact {self.name!r} cannot be loaded ({exc}); "
                               f"if it is damaged, create the BroadcastModel again") from exc

    @staticmethod
    def forget(keys: list[str]) -> None:
        """Artifacts belong to the session: nothing to remove in a worker."""


def _link_or_copy(source: str, path: str) -> None:
    try:
        os.link(source, path)  # the same file under the artifact's name
    except OSError:  # another file system, or no hard links there
        import shutil

        shutil.copyfile(source, path)


@dataclasses.dataclass(frozen=True)
class StorageTransport(Transport):
    """The payload read by each executor straight from storage (``stored.uri``). Nothing
    to renew (workers read the file again under the handle's new key) or release but
    the executors' files (removed by :meth:`forget`). With ``served`` (the driver's copy
    of the payload it read), a file replaced in storage since is read from the driver
    instead: a job planned with one version keeps it."""

    stored: StoredModel
    rdds: bool = True
    served: "ServedTransport | None" = None

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        objects = recipe.custom_objects()

        def write(out: Any) -> None:
            try:
                self.stored.write_payload(out, custom_objects=objects, safe_mode=recipe.safe_mode)
            except (PayloadError, StorageError) as exc:
                if self.served is None or isinstance(exc, LocalWriteError):
                    raise
                _from_the_driver(exc)
                out.seek(0)
                out.truncate()
                self.served.write(out)

        def rewrite(out: Any) -> None:  # what storage gave (a sound header) failed to load
            assert self.served is not None
            _from_the_driver(f"the model read from {self.stored.uri!r} was damaged")
            self.served.write(out)

        def in_memory() -> bytes:  # if the executor's folder cannot be written
            try:
                return self.stored.read_payload(custom_objects=objects, safe_mode=recipe.safe_mode)
            except (PayloadError, StorageError) as exc:
                if self.served is None:
                    raise
                _from_the_driver(exc)
                return self.served.read()

        try:
            return _build_written(recipe, key, nbytes, share_weights, write, in_memory,
                                  verify=self.check_file,
                                  rewrite=None if self.served is None else rewrite)
        except PayloadError as exc:
            if self.stored.uri in str(exc):
                raise
            raise PayloadError(f"the model read from {self.stored.uri!r} cannot be loaded: "
                               f"{exc}") from exc


    def check_file(self, path: str) -> None:
        """Refuse the executor's payload file at ``path`` (found written, before a
        worker builds from it) unless it is the payload the driver read (its body
        digest; the body is checked against it as the file is loaded)."""
        try:
            self.stored.check(path)
        except PayloadError as exc:
            if not verifies(path):
                return  # damaged: its load fails, and it is written again
            raise altered(path, f"the model read from {self.stored.uri!r}",
                          f"is not the payload the driver read ({exc})") from exc


def _from_the_driver(exc: Exception | str) -> None:
    """Log why a worker reads the version its job was planned with from the driver's copy:
    the file in storage was replaced, broken (truncated, damaged) or deleted since."""
    logger.info("%s; reading the version this job was planned with from the driver", exc)


@dataclasses.dataclass(frozen=True)
class ServedTransport(Transport):
    """A version's payload read from the driver (:mod:`.version_server`): the versions
    ``update`` shipped, and a first version shipped ``"driver"``. The first worker of an
    executor that needs it writes it to the executor's folder; every worker maps that
    file.

    ``sha256`` is the payload file's digest, fixed by the driver when it kept its copy
    (:func:`file_digest`) and carried by the handle (a first version) or the driver's
    authenticated answer (later ones): the download is hashed as it is written and
    refused, before anything uses it, unless it matches. A download the network cuts
    (reset, stalled, refused) resumes where it stopped, in the same file (``Range``),
    until :data:`DOWNLOAD_ATTEMPTS` attempts in a row add nothing: only a failure to
    write the local file is the folder's (:class:`~spark_keras.errors.LocalWriteError`). A driver serving its maximum
    of readers says when to come back (503): asked again then, for up to
    :data:`BUSY_WAIT` seconds, without counting attempts."""

    address: Any  # version_server.Address
    name: str
    index: int
    sha256: str

    @classmethod
    def of(cls, address: Any, name: str, index: int, path: str) -> "ServedTransport":
        """The transport of version ``index`` of ``name``, whose copy the driver keeps at
        ``path``: its digest is fixed now."""
        return cls(address, name, index, file_digest(path))

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        return _build_written(recipe, key, nbytes, share_weights, self.write, self.read,
                              verify=self.check_file)

    def check_file(self, path: str) -> None:
        """Refuse the executor's payload file at ``path`` (found written, before a
        worker builds from it) unless its SHA-256 is the one the driver fixed (see
        :func:`.digest.check_file` for a damaged one)."""
        check_file(path, self.sha256, f"model {self.name} version {self.index}")

    def write(self, out: Any) -> None:
        """Write the payload into ``out`` (an open file, or a buffer), from its start;
        raises :class:`~spark_keras.errors.PayloadError` if it is not the payload whose
        digest the driver fixed (``out`` then holds bytes nobody may use)."""
        from spark_keras.channel import client as channel_client

        delay, attempt, busy_since = 1.0, 0, None
        hashing = _Hashing(out)
        while True:
            start = hashing.written  # a transfer cut short resumes after its last byte
            out.seek(start)
            out.truncate()
            try:
                channel_client.download(self.address, self.name, self.index,
                                        cast(BinaryIO, hashing), start)  # download() only writes
                break
            except DriverBusy as exc:  # not an attempt: come back when the driver says
                busy_since = busy_since or time.monotonic()
                waited = time.monotonic() - busy_since
                if waited + exc.retry_after > BUSY_WAIT:
                    raise ChannelError(f"cannot download version {self.index} of model "
                                       f"{self.name}: the driver stayed at its maximum of "
                                       f"readers for {waited:.0f} s ({exc})") from exc
                logger.info("%s; version %d of model %s is asked for again in about %.0f s",
                            exc, self.index, self.name, exc.retry_after)
                time.sleep(exc.retry_after * random.uniform(1.0, 2.0))  # not all at once
            except ChannelError as exc:
                if hashing.written > start:  # progress: the attempts that added nothing count
                    delay, attempt = 1.0, 0
                attempt += 1
                if attempt == DOWNLOAD_ATTEMPTS:
                    raise ChannelError(f"cannot download version {self.index} of model "
                                       f"{self.name} from the driver ({attempt} attempts "
                                       f"without progress): {exc}") from exc
                logger.warning("the download of version %d of model %s from the driver failed "
                               "after %d bytes (%s); trying again from there in %.0f s",
                               self.index, self.name, hashing.written, exc, delay)
                time.sleep(delay)
                delay *= 2
        out.flush()
        found = hashing.hexdigest()
        if not hmac.compare_digest(found, self.sha256):
            raise PayloadError(
                f"the payload of model {self.name} version {self.index} from the driver has "
                f"sha256 {found}, not {self.sha256}, the digest the driver fixed when it "
                f"shipped it: it was altered after it was shipped; refused, nothing was "
                f"built from it")

    def read(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.write(buffer)
        return buffer.getvalue()


# attempts in a row that add no byte to a download from the driver (1, 2, 4 s apart)
DOWNLOAD_ATTEMPTS = 4
# seconds a download keeps coming back while the driver answers that it serves its
# maximum of readers (503, channel_server.RETRY_AFTER): not counted as attempts
BUSY_WAIT = 900.0


class _Hashing:
    """A file to write whose bytes are hashed on their way in."""

    def __init__(self, out: Any) -> None:
        self._out, self._hash = out, hashlib.sha256()
        self.written = 0

    def write(self, data: Any) -> int:
        self._hash.update(data)
        n = self._out.write(data)
        self.written += memoryview(data).nbytes
        return n

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _build_written(recipe: Shipment, key: str, nbytes: int, share_weights: bool,
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
        _join_executor_file(folder, key)
        return recipe.build_shared(folder, key, nbytes, write=write, share_weights=share,
                                   fallback=in_memory, verify=verify, rewrite=rewrite)
    with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:  # not in an executor
        return recipe.build_shared(tmp, key, nbytes, write=write, share_weights=False,
                                   fallback=in_memory, verify=verify, rewrite=rewrite)
