"""The driver's answers to workers about model versions, over its channel: its :class:`Server`.

One small HTTPS server per driver process (the Spark Connect client's process on
Connect), started by the first BroadcastModel, keeps the handles' schedules
(:mod:`.versions`) and payload copies (:mod:`.payload_folder`) and answers three
requests about them (:mod:`.answers`: ``/resolve``, ``/payload``, ``/invalid``), each
carrying a token made for one scope from the server's secret, which never leaves the
driver (:mod:`.credentials`).

The server lives while a handle does, or a Spark context of this process (its stop is
hooked): once neither does, it closes (its threads end, its port and its folder go), and
the next handle starts another (:func:`serving`, :func:`close_if_idle`).

The handle carries the server's address (:meth:`Server.address_for`), its token and the
fingerprint of its TLS certificate through Spark's own channel (the task's closure or
plan): a worker refuses a server that shows another certificate before it sends
anything (:mod:`.client`). :mod:`.server` serves, within fixed bounds of threads,
connections, time and memory; where it listens and what executors are told is
:mod:`.driver_address`'s.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import functools
import logging
import os
import secrets
import shutil
import sys
import tempfile
import threading
from typing import Any, Callable, Iterator

from spark_keras.channel.answers import answer
from spark_keras.channel.client import Address
from spark_keras.channel.credentials import scoped_token
from spark_keras.channel.driver_address import BIND_ENV, listening_socket, plan_if_unreachable
from spark_keras.channel.payload_folder import locked_folder, remove, remove_stale_folders
from spark_keras.channel.protocol import Refused
from spark_keras.channel.running import running
from spark_keras.channel.scopes import active_context, in_context
from spark_keras.channel.server import Channel
from spark_keras.channel.versions import Check, Schedule, Version

__all__ = ["Server", "serving", "close_if_idle", "retire_soon"]

logger = logging.getLogger("spark_keras")

# garbage-collected handles whose current version is still answered (see Server.retire)
MAX_RETIRED = 1024


class Server:
    """The driver's schedules and payload copies, and the HTTPS server answering for them
    (listening at ``bind`` if given, else at ``host``, the address workers are told)."""

    def __init__(self, host: str, port: int = 0, bind: str | None = None) -> None:
        unreachable_plan = plan_if_unreachable()
        self._secret = secrets.token_bytes(32)  # never leaves this process: tokens are made of it
        self._lock = threading.Lock()
        self._schedules: dict[str, Schedule] = {}
        self._boundaries: dict[str, Check] = {}
        self._payloads: dict[tuple[str, int], str] = {}
        self._deleted: set[tuple[str, int]] = set()  # copies deleted once unused (_discard)
        self._folder: str | None = None  # made on the first payload kept, removed at exit
        self._folder_lock: int | None = None  # its lock file, locked while this server lives
        # collected handles: their current version, for the plans still running
        self._retired: collections.OrderedDict[str, Schedule] = collections.OrderedDict()
        self._holds = 0  # handles being made (serving): the server stays open for them
        self.closed = False
        remove_stale_folders()
        self._channel = Channel(listening_socket(host, port, bind), self._secret,
                                functools.partial(answer, self))
        self.where = (host, self._channel.port)  # what workers connect to
        self._plan_if_unreachable = unreachable_plan
        self.url = self.address_for("").url
        logger.info("model versions served at %s (TLS certificate sha256 %s)",
                    self.url, self._channel.fingerprint)

    def address_for(self, scope: str) -> Address:
        """Where workers ask, with a token for ``scope`` alone
        (:func:`.credentials.model_scope`, :func:`.credentials.budget_scope`)."""
        return Address((*self.where, scoped_token(self._secret, scope), self._channel.fingerprint,
                        self._plan_if_unreachable))

    def close(self) -> None:
        """Stop answering and remove the folder of payload copies (:func:`close_if_idle`
        does it once no handle remains and Spark stopped)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._channel.close()
        self._remove_folder()
        atexit.unregister(self._remove_folder)

    def _remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        if self._folder_lock is not None:
            with contextlib.suppress(OSError):  # (at exit: a test's fd juggling may have closed it)
                os.close(self._folder_lock)  # released once the folder is gone
            self._folder_lock = None

    def register(self, name: str, schedule: Schedule,
                 boundary: Callable[[], None] | None = None) -> None:
        """Answer for handle ``name``; ``boundary()`` runs before a new scope is pinned
        (a watched URI checked there), in a thread of its own (:meth:`checking`)."""
        with self._lock:
            self._schedules[name] = schedule
            if boundary is not None:
                self._boundaries[name] = Check(name, boundary)
        schedule.when_unused(functools.partial(self._discard, name))

    def _discard(self, name: str, indices: list[int]) -> None:
        """Delete the copies of ``name``'s versions ``indices``: neither current nor
        pinned by any scope, no task is given them any more."""
        with self._lock:
            paths = [self._payloads.pop((name, i)) for i in indices if (name, i) in self._payloads]
            if name in self._schedules:  # (a forgotten handle's are all gone)
                self._deleted.update((name, i) for i in indices)
        for path in paths:
            remove(path)
        if paths:
            logger.debug("model %s: deleted the driver's copies of versions %s (neither "
                         "current nor pinned)", name, indices)

    def new_file(self) -> str:
        """A fresh path in the folder of payload copies, for :meth:`keep_payload`."""
        with self._lock:
            if self._folder is None:
                self._folder, self._folder_lock = locked_folder()
                atexit.register(self._remove_folder)  # nothing left in TMPDIR
            fd, path = tempfile.mkstemp(suffix=".part", dir=self._folder)
        os.close(fd)
        return path

    def keep_payload(self, name: str, index: int, payload: Any) -> str:
        """Keep version ``index``'s payload to serve: its bytes, or the path of a file
        :meth:`new_file` gave (moved, not copied). Returns the copy's path."""
        if isinstance(payload, str):
            source = payload
        else:
            source = self.new_file()
            with open(source, "wb") as f:
                f.write(payload)
        path = os.path.join(os.path.dirname(source), f"{name}.{index}.skp")
        try:
            os.replace(source, path)
        except BaseException:
            if source is not payload:  # the file written here: the caller's stays its own
                remove(source)
            raise
        with self._lock:
            self._payloads[(name, index)] = path
        return path

    def forget(self, name: str) -> None:
        """Stop answering for ``name`` (destroyed); remove its payload copies."""
        self._drop(name, retire=False)

    def retire(self, name: str) -> None:
        """``name``'s handle was garbage-collected: remove its payload copies and pins,
        and stop checking its file; the plans made with it that still run are answered
        its current version (the last :data:`MAX_RETIRED` such handles) until Spark
        stops."""
        self._drop(name, retire=True)

    def _drop(self, name: str, retire: bool) -> None:
        with self._lock:
            schedule = self._schedules.pop(name, None)
            self._boundaries.pop(name, None)
            self._retired.pop(name, None)
            if retire and schedule is not None:
                self._retired[name] = schedule.current_only()
                while len(self._retired) > MAX_RETIRED:
                    self._retired.popitem(last=False)
            paths = [p for (n, _), p in self._payloads.items() if n == name]
            self._payloads = {k: p for k, p in self._payloads.items() if k[0] != name}
            self._deleted = {k for k in self._deleted if k[0] != name}
        for path in paths:
            remove(path)

    def idle(self) -> bool:
        """True when no handle is registered or being made."""
        with self._lock:
            return not self._schedules and self._holds == 0

    def end_of_spark(self) -> None:
        """Spark stopped: the plans of collected handles cannot run any more."""
        with self._lock:
            self._retired.clear()

    def payload_path(self, name: str, index: int) -> str:
        """The driver's copy of version ``index`` of ``name`` (KeyError: none here;
        Refused 410: deleted once the version was unused)."""
        with self._lock:
            if (name, index) in self._deleted:
                raise Refused(410, f"version {index} of model {name} is neither current nor "
                                   f"pinned by a micro-batch or action: its copy was deleted")
            return self._payloads[(name, index)]

    def checking(self, name: str, scope: str | None) -> concurrent.futures.Future | None:
        """The run of ``name``'s boundary (its watched file's check) that a new ``scope``
        waits for before it is pinned (a future: :class:`~.versions.Check`), started if
        none runs; None for a scope pinned already, or a handle without one. The check
        runs in a thread of its own: slow storage never holds the channel's pool."""
        scope = in_context(scope, active_context())
        with self._lock:
            schedule, boundary = self._schedules.get(name), self._boundaries.get(name)
        if boundary is None or schedule is None or scope is None or schedule.is_pinned(scope):
            return None
        return boundary.start()

    def resolve(self, name: str, scope: str | None) -> dict[str, Any]:
        """The answer to ``scope``'s request: the version it scores with (pinned now if
        new and Spark runs it, :mod:`.running`), and the versions released."""
        scope = in_context(scope, active_context())  # a stage's id is its context's
        with self._lock:
            schedule = self._schedules.get(name)
            if schedule is None:
                schedule = self._retired[name]
        version = schedule.pin(scope, running)  # pinned only if Spark runs it
        released = [_as_dict(v) for v in schedule.released() if v.index != version.index]
        return {"version": _as_dict(version), "released": released}


def _as_dict(version: Version) -> dict[str, Any]:
    return {"index": version.index, "label": version.label, "key": version.key,
            "nbytes": version.nbytes, "source": version.source}


_server: Server | None = None
_server_lock = threading.Lock()


@contextlib.contextmanager
def serving(host: Callable[[], str], bind: Callable[[], str | None] | None = None
            ) -> Iterator[Server]:
    """This process's server, started on first use at ``host()`` (an address of this
    machine that executors reach; ``SPARK_KERAS_DRIVER_HOST`` instead if set), listening
    at ``bind()`` if that is an address (:func:`.driver_address.bind_address`). It stays open while the
    block runs (a handle made there registers in it), then while a handle remains or
    Spark runs (:func:`close_if_idle`)."""
    global _server
    with _server_lock:
        if _server is None:
            port = int(os.environ.get("SPARK_KERAS_DRIVER_PORT", "0"))
            listen = bind() if bind is not None else os.environ.get(BIND_ENV)
            _server = Server(os.environ.get("SPARK_KERAS_DRIVER_HOST") or host(), port,
                             listen or None)
        server = _server
        server._holds += 1
    _close_with_spark()
    try:
        yield server
    finally:
        with _server_lock:
            server._holds -= 1
        close_if_idle(server)


def close_if_idle(server: Server) -> bool:
    """Close ``server`` (thread, port and folder) if no handle remains in it and no Spark
    context of this process is alive; the next handle starts a new one. True if closed."""
    global _server
    with _server_lock:
        if server.closed or active_context() is not None:
            return False
        server.end_of_spark()
        if not server.idle():
            return False
        server.close()
        if _server is server:
            _server = None
    logger.info("model versions no longer served at %s", server.url)
    return True


def retire_soon(server: Server, name: str) -> None:
    """:meth:`Server.retire` ``name``, then :func:`close_if_idle`, in a thread of its own:
    for a finalizer, which runs in whichever thread the garbage collector does, maybe one
    holding this module's locks."""
    def retire() -> None:
        server.retire(name)
        close_if_idle(server)

    try:
        threading.Thread(target=retire, name="spark_keras release", daemon=True).start()
    except RuntimeError:  # the interpreter is exiting: its exit removes the folder
        pass


def _close_with_spark() -> None:
    """Have ``SparkContext.stop`` (and Spark Connect's ``SparkSession.stop``, once that is
    loaded) close the server when no handle remains; once per class."""
    from pyspark import SparkContext

    connect = sys.modules.get("pyspark.sql.connect.session")
    for cls in (SparkContext, getattr(connect, "SparkSession", None)):
        stop = getattr(cls, "stop", None)
        if stop is not None and not getattr(stop, "_spark_keras_closes", False):
            cls.stop = _closing(stop)  # type: ignore[method-assign,union-attr]


def _closing(stop: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(stop)
    def stop_and_close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return stop(self, *args, **kwargs)
        finally:
            server = _server
            if server is not None:
                close_if_idle(server)

    stop_and_close._spark_keras_closes = True  # type: ignore[attr-defined]
    return stop_and_close
