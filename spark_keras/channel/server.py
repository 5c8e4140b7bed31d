"""The driver's channel: a small HTTPS server whose threads, memory and time are bounded.

A :class:`Channel` answers ``GET`` requests, one per connection (``Connection: close``,
:mod:`.protocol`), over TLS with a key and certificate made for it in memory, whose
fingerprint the handles pin (:mod:`.credentials`, :mod:`.client`). It reads each
request's scope from its token, checks the token in constant time, then hands the path,
query and scope to a function that answers them (:mod:`.answers`'), which refuses (403)
a request outside that scope. Bounds:

* **threads**: one runs an asyncio event loop that accepts connections, runs TLS (on
  non-blocking ``ssl`` sockets, :mod:`.socket_io`), reads requests and writes answers;
  the answering function and payload file reads run in a pool of at most ``WORKERS``
  threads. Slow work (a check of a model file in storage) runs elsewhere: an answer
  may be :class:`~.protocol.Later`, which waits for it on the event loop, holding no
  thread of the pool;
* **connections**: at most ``MAX_CONNECTIONS`` at once, and never more than a quarter of
  the soft ``RLIMIT_NOFILE`` (:func:`connection_cap`). At the cap, the oldest connection
  that has not shown the token within ``GRACE`` seconds is dropped for a new one. When
  every one has shown it (readers of large payloads), up to a quarter of the cap more
  are taken as *overflow*: each must show a whole request head with the token within
  ``OVERFLOW_HEAD_TIMEOUT`` seconds (and, the overflow full, the oldest that has not
  within ``GRACE`` is dropped for a new one), so that silent connections hold those
  places for moments only; within ``OVERFLOW_TIMEOUT`` seconds each gets its answer if
  that is a short body, or ``503`` with ``Retry-After: RETRY_AFTER`` if it would stream
  a file, so that readers come back later instead of waiting in the kernel's listen
  backlog until their requests time out; past that, new connections wait there. Out of
  file descriptors, accepting pauses ``ACCEPT_PAUSE`` seconds each time (logged once):
  it never spins;
* **time**: the TLS handshake and the whole request head within ``HEAD_TIMEOUT`` seconds
  of the connection; then progress: a reader that takes nothing of what the kernel
  queued for it for ``WRITE_TIMEOUT`` seconds is dropped, however long a slow one takes
  in all (:mod:`.socket_io`). No keep-alive: no connection stays idle after its answer;
* **memory**: a request head of at most ``HEAD_BYTES`` and ``HEAD_LINES`` header lines
  (else 431, :mod:`.protocol`); per connection OpenSSL's state (tens of KiB), plus one
  ``CHUNK`` while it streams a payload to a reader that showed the token.

Refusals (a bad token, a malformed request) answer 4xx with a one-line reason, logged
at WARNING the first time for each status and at DEBUG after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import logging
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spark_keras.channel import socket_io
from spark_keras.channel.credentials import tls_context
from spark_keras.channel.protocol import (
    HEAD_BYTES,
    HEAD_LINES,
    Answer,
    Answering,
    Later,
    Refused,
    answer_head,
    parse_request,
    refusal,
    too_long,
)

logger = logging.getLogger("spark_keras")

MAX_CONNECTIONS = 256
WORKERS = 4
GRACE = 0.5  # seconds a connection keeps its place at the cap before showing the token
OVERFLOW_TIMEOUT = 5.0  # seconds an overflow connection gets for its handshake, head, answer
OVERFLOW_HEAD_TIMEOUT = 1.0  # of them, seconds for its handshake and a head with the token
RETRY_AFTER = 2  # seconds a reader told 503 (the cap is full of readers) waits, at least
HEAD_TIMEOUT = 10.0
CHUNK = 256 << 10
ACCEPT_PAUSE = 1.0
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def connection_cap() -> int:
    """``MAX_CONNECTIONS``, or a quarter of the soft ``RLIMIT_NOFILE`` if lower."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):  # no such limit here (Windows)
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // 4))


class _Connection:
    __slots__ = ("sock", "peer", "since", "shown", "overflow", "task")

    def __init__(self, sock: ssl.SSLSocket, peer: Any, overflow: bool) -> None:
        self.sock, self.peer, self.since, self.shown = sock, peer, time.monotonic(), False
        self.overflow = overflow
        self.task: asyncio.Task | None = None


class Channel:
    """An HTTPS server on the listening socket ``sock``, answering requests that show a
    token made with ``secret`` with ``answering(path, query, scope)``, ``scope`` the
    token's (see the module's bounds)."""

    def __init__(self, sock: socket.socket, secret: bytes, answering: Answering) -> None:
        try:
            self.context, self.fingerprint = tls_context()
        except BaseException:
            sock.close()
            raise
        self.cap = connection_cap()
        self.overflow_cap = max(1, self.cap // 4)
        self._sock = sock
        sock.setblocking(False)
        self._secret = secret
        self._answering = answering
        self._connections: dict[_Connection, None] = {}  # oldest first
        self._overflowing = 0  # of them, overflow connections
        self._logged: set[Any] = set()
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="spark_keras channel")
        self._loop = asyncio.SelectorEventLoop()  # add_reader/add_writer: not a proactor
        self._freed = asyncio.Event()
        self._wrapped: dict[concurrent.futures.Future, asyncio.Future] = {}  # _awaitable
        self._main = self._loop.create_task(self._accept())
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="spark_keras channel", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def connections(self) -> int:
        """The connections open now (overflow ones included)."""
        return len(self._connections)

    def close(self) -> None:
        """Stop accepting, drop every connection, and end the thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._loop.call_soon_threadsafe(self._main.cancel)
        except RuntimeError:  # the loop ended already
            pass
        if threading.current_thread() is not self._thread:
            self._thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        finally:
            self._sock.close()
            self._loop.close()

    # --- accepting ---------------------------------------------------------------------

    async def _accept(self) -> None:
        try:
            while True:
                overflow = await self._room()
                try:
                    sock, peer = await self._loop.sock_accept(self._sock)
                except OSError as exc:
                    if exc.errno in _OUT_OF_FILES:
                        self._log_once("files", "the driver's channel cannot accept a connection: "
                                       "%s (it holds %d); it retries every %.0f s", exc,
                                       len(self._connections), ACCEPT_PAUSE)
                        await asyncio.sleep(ACCEPT_PAUSE)
                    continue  # a connection reset before it was accepted
                self._start(sock, peer, overflow)
        finally:
            tasks = [c.task for c in self._connections if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _room(self) -> bool:
        """Return once a connection may be accepted: below the cap, or after dropping
        the oldest connection that has not shown the token within GRACE seconds; or, all
        of them having shown it, as an overflow connection (True) while there is room, or
        after dropping the oldest overflow one that has not shown it within GRACE."""
        while len(self._connections) - self._overflowing >= self.cap:
            self._log_once("cap", "the driver's channel holds %d connections, its maximum: new "
                           "ones wait, and those that do not show the token within %.1f s are "
                           "dropped for them", self.cap, GRACE)
            oldest = next((c for c in self._connections if not c.shown and not c.overflow), None)
            if oldest is None:
                if self._overflowing < self.overflow_cap:
                    self._log_once("busy", "the driver's channel holds %d connections, its "
                                   "maximum, all reading answers: readers of payloads are told "
                                   "to come back in %d s (503)", self.cap, RETRY_AFTER)
                    return True
                oldest = next((c for c in self._connections if c.overflow and not c.shown), None)
            age = time.monotonic() - oldest.since if oldest is not None else 0.0
            if oldest is not None and age >= GRACE:
                self._drop(oldest)
                await asyncio.sleep(0)  # its task closes its socket
                continue
            self._freed.clear()
            try:
                async with asyncio.timeout(GRACE - age if oldest is not None else ACCEPT_PAUSE):
                    await self._freed.wait()
            except TimeoutError:
                pass
        return False

    def _start(self, sock: socket.socket, peer: Any, overflow: bool) -> None:
        sock.setblocking(False)
        try:
            tls = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except OSError:
            sock.close()
            return
        connection = _Connection(tls, peer, overflow)
        self._connections[connection] = None
        self._overflowing += overflow
        connection.task = self._loop.create_task(self._serve(connection))

    def _drop(self, connection: _Connection) -> None:
        self._forget(connection)
        if connection.task is not None:
            connection.task.cancel()

    def _forget(self, connection: _Connection) -> None:
        if connection in self._connections:
            del self._connections[connection]
            self._overflowing -= connection.overflow

    # --- one connection ----------------------------------------------------------------

    async def _serve(self, connection: _Connection) -> None:
        try:
            if connection.overflow:
                async with asyncio.timeout(OVERFLOW_TIMEOUT):
                    await self._exchange(connection)
            else:
                await self._exchange(connection)
        except (OSError, EOFError) as exc:  # gone, too slow (TimeoutError), TLS failed
            logger.debug("the driver's channel dropped a connection from %s: %r",
                         connection.peer, exc)
        finally:
            connection.sock.close()
            self._forget(connection)
            self._freed.set()

    async def _exchange(self, connection: _Connection) -> None:
        sock = connection.sock
        try:  # at the cap (overflow), only a connection that shows the token at once stays
            async with asyncio.timeout(OVERFLOW_HEAD_TIMEOUT if connection.overflow else HEAD_TIMEOUT):
                await socket_io.io(self._loop, sock, sock.do_handshake)
                path, query, scope, start, stop = parse_request(await self._read_head(sock),
                                                                self._secret)
            connection.shown = True
            answer = await self._answer(connection, path, query, scope)
            if answer.file is not None:
                if connection.overflow:
                    answer.file.close()
                    raise Refused(503, f"the driver is serving its maximum of {self.cap} "
                                       f"readers: come back in {RETRY_AFTER} s")
                if (start and start >= answer.size) or (stop is not None and stop <= start):
                    answer.file.close()
                    raise Refused(416, f"bytes={start}-{'' if stop is None else stop - 1} is "
                                       f"past the answer's {answer.size} bytes or empty")
                answer.start, answer.stop = start, None if stop is None else min(stop, answer.size)
        except Refused as exc:
            # 404: a destroyed handle's late tasks; 500: a defect, logged; 503: logged once
            if exc.status in (404, 500, 503):
                logger.debug("the driver's channel: %d %s", exc.status, exc)
            else:
                self._log_once(exc.status, "the driver's channel refused a request from %s: "
                               "%d %s (later refusals with this status are logged at DEBUG)",
                               connection.peer, exc.status, exc)
            await socket_io.send(self._loop, sock, refusal(exc.status, str(exc), RETRY_AFTER))
            return
        await self._send_answer(sock, answer)

    async def _answer(self, connection: _Connection, path: str, query: dict[str, str],
                      scope: str) -> Answer:
        """The answering function's answer (in the pool); its failures, other than a
        refusal, answer 500 and are logged once (an OSError there is not the connection's)."""
        try:
            answer = await self._loop.run_in_executor(self._pool, self._answering, path, query,
                                                      scope)
            if isinstance(answer, Later):  # asyncio.wait cancels nothing at its timeout;
                # an overflow connection (5 s in all) does not wait: the answer of now
                within = 0.0 if connection.overflow else answer.within
                if within > 0:
                    await asyncio.wait([self._awaitable(answer.until)], timeout=within)
                answer = await self._loop.run_in_executor(self._pool, answer.then)
            return answer
        except Refused:
            raise
        except Exception as exc:
            self._log_once(("defect", type(exc)), "the driver's channel failed to answer %s: %r",
                           connection.peer, exc, exc_info=True)
            raise Refused(500, "the driver failed to answer (its log says why)") from None

    def _awaitable(self, until: concurrent.futures.Future) -> asyncio.Future:
        """One asyncio future per ``until`` (a waiter's own wrapper would leave a callback
        on ``until`` for as long as it runs: a hung check would gather one per request)."""
        wrapped = self._wrapped.get(until)
        if wrapped is None:
            wrapped = self._wrapped[until] = asyncio.wrap_future(until)
            wrapped.add_done_callback(lambda _: self._wrapped.pop(until, None))
        return wrapped

    async def _read_head(self, sock: ssl.SSLSocket) -> bytes:
        head = bytearray()
        while (end := head.find(b"\r\n\r\n")) < 0:
            if len(head) > HEAD_BYTES or head.count(b"\n") > HEAD_LINES + 1:
                raise too_long()
            data = await socket_io.io(self._loop, sock, functools.partial(sock.recv, 4096))
            if not data:
                raise EOFError("closed before the end of its request")
            head += data
        return bytes(head[:end])

    async def _send_answer(self, sock: ssl.SSLSocket, answer: Answer) -> None:
        if answer.file is None:
            await socket_io.send(self._loop, sock, answer_head(200, answer.kind, len(answer.body)) + answer.body)
            return
        try:
            end = answer.size if answer.stop is None else answer.stop
            left = end - answer.start
            if answer.start or answer.stop is not None:  # a Range asked: its part
                answer.file.seek(answer.start)
                await socket_io.send(self._loop, sock, answer_head(206, answer.kind, left, (
                    f"Content-Range: bytes {answer.start}-{end - 1}/{answer.size}\r\n")))
            else:
                await socket_io.send(self._loop, sock, answer_head(200, answer.kind, left))
            while left > 0:
                try:
                    chunk = await self._loop.run_in_executor(self._pool, answer.file.read,
                                                             min(CHUNK, left))
                except OSError as exc:  # the reader sees its answer cut short
                    self._log_once(("read", type(exc)), "the driver's channel cannot read a "
                                   "payload file: %s", exc)
                    raise EOFError("the payload file cannot be read") from exc
                if not chunk:
                    raise EOFError("the payload file is shorter than it was")  # reader: cut short
                await socket_io.send(self._loop, sock, chunk)
                left -= len(chunk)
        finally:
            answer.file.close()

    def _log_once(self, kind: Any, message: str, *args: Any, exc_info: bool = False) -> None:
        level = logging.DEBUG if kind in self._logged else logging.WARNING
        self._logged.add(kind)
        logger.log(level, message, *args, exc_info=exc_info)
