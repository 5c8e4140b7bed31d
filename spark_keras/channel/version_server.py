"""The driver's answers to workers about model versions, over its channel (:mod:`.versions`).

One small HTTPS server per driver process (the Spark Connect client's process on
Connect), started by the first BroadcastModel, answers three requests, each carrying a
token made for one scope from the server's secret (:func:`.channel_server.scoped_token`;
the secret never leaves the driver): a handle carries its own, ``model:<handle>``
(:func:`model_scope`), so a token for one model neither reads another's payloads nor
pins its versions (403):

* ``GET /resolve?name=<handle>&scope=<scope>``: the version that scope scores with,
  and the versions released (JSON: a version's payload SHA-256, and that of its custom
  objects when Spark ships them, :mod:`.shipped_objects`; never a pickle); a scope not
  of the forms :func:`.versions.scope_of` makes is refused (400) before it reaches the
  schedule;
* ``GET /payload?name=<handle>&index=<n>``: a version's payload bytes (the driver keeps
  a copy of each version it shipped itself or read from storage while that version is
  current or pinned by a scope, and until ``destroy`` or until the handle is
  garbage-collected; 410 once that copy was deleted);
* ``GET /invalid?name=<budget>&scope=<scope>&...``: a task's count of invalid rows against
  a ``max_invalid`` counted over its action (:mod:`.budget_ledger`).

The server lives while a handle does, or a Spark context of this process (its stop is
hooked): once neither does, it closes (its threads end, its port and its folder go), and
the next handle starts another (:func:`serving`, :func:`close_if_idle`).

The handle carries the server's address, its token and the fingerprint of its TLS
certificate through Spark's own channel (the task's closure or plan): a worker refuses
a server that shows another certificate before it sends anything
(:mod:`.channel_client`). :mod:`.channel_server` serves, within fixed bounds of threads,
connections, time and memory.

Executors reach it at the driver's address: ``spark.driver.host`` on classic Spark, the
Connect server's host's view of this machine on Connect (``127.0.0.1`` for a local
server); set ``SPARK_KERAS_DRIVER_HOST`` (and ``SPARK_KERAS_DRIVER_PORT``, default any
free port) where that is not the address executors can reach. It listens at that
address, or at ``SPARK_KERAS_DRIVER_BIND_ADDRESS`` or ``spark.driver.bindAddress`` if
set; when the address is not one of this machine's and neither is set, on every
interface, with a warning. A task that cannot reach it fails, unless
``SPARK_KERAS_UNREACHABLE_DRIVER=plan`` (read at start, carried in the address) lets it
score with its plan's version (:mod:`.task_version`).

The payload copies live in a folder ``spark_keras_versions_<pid>_<random>`` (mode 0700)
of the temporary folder, removed at exit. Its driver holds an exclusive ``flock`` on the
folder's ``.lock`` file for its whole life, which the kernel releases when the driver
dies however it dies: each start removes the folders of this user whose lock it can
take (a driver killed with SIGKILL cannot remove its own), and never one whose driver
lives, whatever its pid means here (drivers in other PID namespaces sharing the folder).
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import functools
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import threading
from typing import Any, Callable, Iterator

from spark_keras.channel import budget_ledger
from spark_keras.channel.client import TIMEOUT, Address, ask, download
from spark_keras.channel.running import running
from spark_keras.channel.server import Answer, Channel, Later, Refused, scoped_token
from spark_keras.channel.versions import CHECK_WAIT, Check, Schedule, Version, active_context, in_context
from spark_keras.errors import ArgumentError, SparkKerasError

__all__ = ["Server", "Address", "TIMEOUT", "ask", "download", "serving", "close_if_idle", "driver_host",
           "bind_address", "model_scope", "budget_scope"]

logger = logging.getLogger("spark_keras")

BIND_ENV = "SPARK_KERAS_DRIVER_BIND_ADDRESS"
# what a worker that cannot reach the driver at all does: "fail" its task (the default),
# or score with the version its "plan" was made with (update() does not reach it)
UNREACHABLE_ENV = "SPARK_KERAS_UNREACHABLE_DRIVER"
# the scopes versions.scope_of makes: stream:<query id>:<batch id>, sql:<execution id>,
# stage:<stage id> or stage:<context>:<stage id>
_NUMBER = r"(?:0|[1-9][0-9]{0,17})"  # as Spark writes ids: no leading zero (07 is not 7)
_SCOPE = re.compile(rf"stream:[A-Za-z0-9._-]{{1,128}}:{_NUMBER}|sql:{_NUMBER}"
                    rf"|stage:(?:[A-Za-z0-9._-]{{1,128}}:)?{_NUMBER}")
_INDEX = re.compile(r"[0-9]{1,9}")
# spark_keras_versions_<pid>_<mkdtemp's 8 characters> (older names had no pid: kept)
_FOLDER_PREFIX = "spark_keras_versions_"
_FOLDER = re.compile(_FOLDER_PREFIX + r"([0-9]{1,10})_[a-z0-9_]{8}")
_FOLDER_LOCK = ".lock"  # in a driver's folder: flock'd by its driver while it lives
# garbage-collected handles whose current version is still answered (see Server.retire)
MAX_RETIRED = 1024


def model_scope(name: str) -> str:
    """The scope of handle ``name``'s token: its ``/resolve`` and ``/payload``."""
    return f"model:{name}"


def budget_scope(key: str) -> str:
    """The scope of budget ``key``'s token: its ``/invalid`` reports."""
    return f"budget:{key}"


def _allowed(path: str, name: str, scope: str) -> bool:
    """Whether a token made for ``scope`` may ask ``path`` about ``name``: a handle's
    token its own versions and payloads, and its ``predict_partition`` budgets' reports
    (``p.<handle>.<limit>``); a budget's its reports."""
    if path == "/invalid":
        handle = _handle_of(scope)
        return scope == budget_scope(name) or (handle is not None and name.startswith(f"p.{handle}."))
    return scope == model_scope(name)


def _handle_of(scope: str) -> str | None:
    """The handle whose token was made for ``scope`` (None: not a handle's)."""
    return scope[len("model:"):] if scope.startswith("model:") else None


def _answer(owner: "Server", path: str, query: dict[str, str], token_scope: str) -> Answer | Later:
    """The answer to a request that showed a token made for ``token_scope`` (run in
    the channel's pool)."""
    name = query.get("name", "")
    if not name or len(name) > 256:
        raise Refused(400, "a request names a model (name=)")
    if not _allowed(path, name, token_scope):
        raise Refused(403, f"this token is not {name[:100]!r}'s (it is {token_scope[:100]!r}'s)")
    scope = query.get("scope") or None
    if scope is not None and not _SCOPE.fullmatch(scope):
        raise Refused(400, f"malformed scope {scope[:100]!r} (stream:<query id>:<batch>, "
                           f"sql:<execution id> or stage:<stage id>)")
    if path == "/invalid":  # a task's invalid rows (name: the budget's key)
        return Answer(json.dumps(budget_ledger.answer(query, scope, _handle_of(token_scope))).encode())
    if path == "/resolve":
        checking = owner.checking(name, scope)  # a watched file's check, off the pool
        if checking is not None:
            return Later(checking, CHECK_WAIT, lambda: _resolved(owner, name, scope))
        return _resolved(owner, name, scope)
    if path == "/payload":
        index = query.get("index", "")
        if not _INDEX.fullmatch(index):
            raise Refused(400, f"index must be a version number, not {index[:20]!r}")
        try:
            copy = owner.payload_path(name, int(index))
        except KeyError:
            raise Refused(404, f"no version {index} of model {name!r} here") from None
        try:
            f = open(copy, "rb")
        except FileNotFoundError:
            raise Refused(410, f"{copy} was deleted") from None
        return Answer(kind="application/octet-stream", file=f, size=os.fstat(f.fileno()).st_size)
    raise Refused(404, f"no such path {path[:100]!r}")


class Server:
    """The driver's schedules and payload copies, and the HTTPS server answering for them
    (listening at ``bind`` if given, else at ``host``, the address workers are told)."""

    def __init__(self, host: str, port: int = 0, bind: str | None = None) -> None:
        plan_if_unreachable = _plan_if_unreachable()
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
        self._channel = Channel(_bound(host, port, bind), self._secret,
                                functools.partial(_answer, self))
        self.where = (host, self._channel.port)  # what workers connect to
        self._plan_if_unreachable = plan_if_unreachable
        self.url = self.address_for("").url
        logger.info("model versions served at %s (TLS certificate sha256 %s)",
                    self.url, self._channel.fingerprint)

    def address_for(self, scope: str) -> Address:
        """Where workers ask, with a token for ``scope`` alone (:func:`model_scope`,
        :func:`budget_scope`)."""
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
            _remove(path)
        if paths:
            logger.debug("model %s: deleted the driver's copies of versions %s (neither "
                         "current nor pinned)", name, indices)

    def new_file(self) -> str:
        """A fresh path in the folder of payload copies, for :meth:`keep_payload`."""
        with self._lock:
            if self._folder is None:
                self._folder, self._folder_lock = _locked_folder()
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
                _remove(source)
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
            _remove(path)

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


def _resolved(owner: Server, name: str, scope: str | None) -> Answer:
    try:
        answer = owner.resolve(name, scope)
    except KeyError:
        raise Refused(404, f"no model {name!r} here") from None
    return Answer(json.dumps(answer).encode())


def _plan_if_unreachable() -> bool:
    """``SPARK_KERAS_UNREACHABLE_DRIVER``: ``plan`` (True) lets a worker that cannot reach
    the driver score with its plan's version; ``fail`` (False, the default) fails the task."""
    value = os.environ.get(UNREACHABLE_ENV, "fail").strip().lower()
    if value not in ("fail", "plan"):
        raise ArgumentError(f"{UNREACHABLE_ENV}={value!r}: use 'fail' (the default: a task "
                            f"that cannot reach the driver fails) or 'plan' (it scores with "
                            f"the version its plan was made with)")
    return value == "plan"


def _bound(host: str, port: int, bind: str | None) -> socket.socket:
    """The channel's listening socket: at ``bind`` if set, else at ``host`` (what
    executors are told); on every interface, with a warning, if ``host`` is not an
    address of this machine (a container behind a NAT, say)."""
    if bind:
        try:
            return _listen(bind, port)
        except OSError as exc:
            raise SparkKerasError(f"the driver's channel cannot listen at {bind} port {port} "
                                  f"(spark.driver.bindAddress or {BIND_ENV}): {exc}") from exc
    try:
        return _listen(host, port)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise SparkKerasError(f"the driver's channel cannot listen at {host} port {port}: "
                                  f"{exc}; set SPARK_KERAS_DRIVER_PORT to a free port (0: any)") from exc
        everywhere = "::" if ":" in host else "0.0.0.0"
        logger.warning("the driver's channel cannot listen at %s, the address executors are told "
                       "(%s): it listens on every interface of this machine (%s) instead; set "
                       "spark.driver.bindAddress (or %s) to the address executors reach it at",
                       host, exc, everywhere, BIND_ENV)
        return _listen(everywhere, port)


def _listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock


def _locked_folder() -> tuple[str, int]:
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


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


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
    at ``bind()`` if that is an address (:func:`bind_address`). It stays open while the
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


def driver_host(spark: Any, connect: bool) -> str:
    """This driver's address as the executors of ``spark`` (a Connect session if
    ``connect``) reach it."""
    if connect:
        if getattr(spark.client, "host", None) in (None, "localhost", "127.0.0.1", "::1"):
            return "127.0.0.1"  # a local Connect server: its executors are on this machine
        return socket.gethostbyname(socket.gethostname())
    sc = getattr(spark, "sparkContext", spark)
    return socket.gethostbyname(sc.getConf().get("spark.driver.host") or socket.gethostname())


def bind_address(spark: Any, connect: bool) -> str | None:
    """Where this driver's channel listens: ``SPARK_KERAS_DRIVER_BIND_ADDRESS``, else
    ``spark.driver.bindAddress`` (classic Spark), else None (at its advertised host)."""
    if os.environ.get(BIND_ENV):
        return os.environ[BIND_ENV]
    if connect:
        return None  # the Connect server's settings are not this process's
    sc = getattr(spark, "sparkContext", spark)
    return sc.getConf().get("spark.driver.bindAddress") or None
