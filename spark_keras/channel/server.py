"""The driver's channel: a small HTTPS server whose threads, memory and time are bounded.

A :class:`Channel` answers ``GET`` requests, one per connection (``Connection: close``),
over TLS with a key and certificate made for it in memory (:func:`tls_context`), whose
fingerprint the handles pin (:mod:`.channel_client`). A token is made for one *scope* (a
model handle's, a budget's: :func:`scoped_token`) from the server's secret, which never
leaves the driver; the channel reads each request's scope from its token, checks the
token in constant time, then hands the path, query and scope to a function that answers
them (:mod:`.version_server`'s), which refuses (403) a request outside that scope: a
token travels with one handle's plans and reads nothing of another's. Bounds:

* **threads**: one runs an asyncio event loop that accepts connections, runs TLS (on
  non-blocking ``ssl`` sockets: OpenSSL's state alone per connection), reads requests and
  writes answers; the answering function and payload file reads run in a pool of at
  most ``WORKERS`` threads. Slow work (a check of a model file in storage) runs
  elsewhere: an answer may be :class:`Later`, which waits for it on the event loop,
  holding no thread of the pool;
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
  in all (progress read from the socket's send queue, ``TIOCOUTQ``; where it cannot be,
  each wait for room in that queue gets ``WRITE_TIMEOUT`` seconds). No keep-alive: no
  connection stays idle after its answer;
* **memory**: a request head of at most ``HEAD_BYTES`` and ``HEAD_LINES`` header lines
  (else 431); per connection OpenSSL's state (tens of KiB), plus one ``CHUNK`` while it
  streams a payload to a reader that showed the token.

A file answer honours ``Range: bytes=<start>-`` (``206``, ``Content-Range``): a reader
whose transfer was cut resumes where it stopped. Refusals (a bad token, a malformed
request) answer 4xx with a one-line reason, logged at WARNING the first time for each
status and at DEBUG after.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime
import errno
import functools
import hashlib
import hmac
import http
import logging
import os
import re
import socket
import ssl
import struct
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Callable

logger = logging.getLogger("spark_keras")

MAX_CONNECTIONS = 256
WORKERS = 4
GRACE = 0.5  # seconds a connection keeps its place at the cap before showing the token
OVERFLOW_TIMEOUT = 5.0  # seconds an overflow connection gets for its handshake, head, answer
OVERFLOW_HEAD_TIMEOUT = 1.0  # of them, seconds for its handshake and a head with the token
RETRY_AFTER = 2  # seconds a reader told 503 (the cap is full of readers) waits, at least
HEAD_TIMEOUT = 10.0
WRITE_TIMEOUT = 30.0  # seconds a reader may take nothing of an answer
HEAD_BYTES = 8 << 10
HEAD_LINES = 32
CHUNK = 256 << 10
ACCEPT_PAUSE = 1.0
TOKEN_HEADER = b"x-spark-keras-token"
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_RANGE = re.compile(rb"bytes=([0-9]{1,18})-")


class Refused(Exception):
    """Raised by an answering function: the request gets ``status`` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Answer:
    """A request's answer: ``body`` (of type ``kind``), or ``size`` bytes read from
    ``file`` (closed once sent), from byte ``start`` on if the request asked so."""

    body: bytes = b""
    kind: str = "application/json"
    file: BinaryIO | None = None
    size: int = 0
    start: int = 0


@dataclasses.dataclass
class Later:
    """An answer given once ``until`` is done, or ``within`` seconds passed (awaited on
    the event loop: no thread of the pool waits): ``then()``'s, run in the pool."""

    until: concurrent.futures.Future
    within: float
    then: Callable[[], Answer]


# (path, query, the scope its token was made for) -> answer; may raise Refused
Answering = Callable[[str, dict[str, str], str], "Answer | Later"]


def scoped_token(secret: bytes, scope: str) -> str:
    """The token of ``scope`` (``model:<handle>``, ``budget:<key>``...): the scope
    (percent-encoded) and, after a dot, its HMAC-SHA256 under the server's ``secret``
    (hex). Its holder can show it for that scope only: :func:`token_scope`."""
    quoted = urllib.parse.quote(scope, safe=":")
    return f"{quoted}.{hmac.new(secret, quoted.encode(), hashlib.sha256).hexdigest()}"


def token_scope(secret: bytes, token: bytes) -> str | None:
    """The scope ``token`` was made for with ``secret`` (:func:`scoped_token`; compared
    in constant time), else None."""
    quoted, _, mac = token.rpartition(b".")
    expected = hmac.new(secret, quoted, hashlib.sha256).hexdigest().encode()
    if not quoted or not hmac.compare_digest(mac, expected):
        return None
    return urllib.parse.unquote(quoted.decode("ascii"))  # made by scoped_token: ASCII


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


def tls_context() -> tuple[ssl.SSLContext, str]:
    """A TLS server context with a fresh EC P-256 key and a self-signed certificate,
    and the certificate's SHA-256 fingerprint (hex, of its DER form). The key is made
    in memory; ``ssl`` loads it from a file only, written in a private temporary folder
    (mode 0700, the file 0600) and removed at once."""
    from spark_keras._deps import require

    require("cryptography", "the driver's channel (its TLS certificate)", extra="spark")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spark_keras driver channel")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=3650))
                   .sign(key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()) + \
        certificate.public_bytes(serialization.Encoding.PEM)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.num_tickets = 0  # clients never resume a session: no tickets to make
    with tempfile.TemporaryDirectory(prefix="spark_keras_tls_") as folder:
        path = os.path.join(folder, "key.pem")
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(pem)
        context.load_cert_chain(path)
    fingerprint = hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).hexdigest()
    return context, fingerprint


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
                await self._io(sock, sock.do_handshake)
                path, query, scope, start = self._request(await self._read_head(sock))
            connection.shown = True
            answer = await self._answer(connection, path, query, scope)
            if answer.file is not None:
                if connection.overflow:
                    answer.file.close()
                    raise Refused(503, f"the driver is serving its maximum of {self.cap} "
                                       f"readers: come back in {RETRY_AFTER} s")
                if start and start >= answer.size:
                    answer.file.close()
                    raise Refused(416, f"bytes={start}- is past the answer's {answer.size} bytes")
                answer.start = start
        except Refused as exc:
            # 404: a destroyed handle's late tasks; 500: a defect, logged; 503: logged once
            if exc.status in (404, 500, 503):
                logger.debug("the driver's channel: %d %s", exc.status, exc)
            else:
                self._log_once(exc.status, "the driver's channel refused a request from %s: "
                               "%d %s (later refusals with this status are logged at DEBUG)",
                               connection.peer, exc.status, exc)
            await self._send(sock, self._error(exc.status, str(exc)))
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
                raise Refused(431, f"a request head is at most {HEAD_BYTES} bytes and "
                                   f"{HEAD_LINES} header lines")
            data = await self._io(sock, functools.partial(sock.recv, 4096))
            if not data:
                raise EOFError("closed before the end of its request")
            head += data
        return bytes(head[:end])

    def _request(self, head: bytes) -> tuple[str, dict[str, str], str, int]:
        """A request head's path, query, its token's scope and the byte a file answer
        starts at (its ``Range: bytes=<start>-``, else 0; any other range is ignored), once
        its token is checked."""
        lines = head.split(b"\r\n")
        if len(lines) > HEAD_LINES + 1 or len(head) > HEAD_BYTES:
            raise Refused(431, f"a request head is at most {HEAD_BYTES} bytes and "
                               f"{HEAD_LINES} header lines")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            raise Refused(400, "a malformed request line")
        if parts[0] != b"GET":
            raise Refused(405, "only GET is answered")
        token, start = b"", 0
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise Refused(400, "a malformed header line")
            name = name.strip().lower()
            if name == TOKEN_HEADER:
                token = value.strip()
            elif name == b"range" and (asked := _RANGE.fullmatch(value.strip())):
                start = int(asked.group(1))
        scope = token_scope(self._secret, token)
        if scope is None:
            raise Refused(403, "bad token")
        try:
            url = urllib.parse.urlsplit(parts[1].decode("ascii"))
            query = dict(urllib.parse.parse_qsl(url.query, max_num_fields=8, errors="strict"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise Refused(400, f"a malformed request target ({exc})") from None
        return url.path, query, scope, start

    async def _send_answer(self, sock: ssl.SSLSocket, answer: Answer) -> None:
        if answer.file is None:
            await self._send(sock, self._head(200, answer.kind, len(answer.body)) + answer.body)
            return
        try:
            left = answer.size - answer.start
            if answer.start:
                answer.file.seek(answer.start)
                await self._send(sock, self._head(206, answer.kind, left, (
                    f"Content-Range: bytes {answer.start}-{answer.size - 1}/{answer.size}\r\n")))
            else:
                await self._send(sock, self._head(200, answer.kind, left))
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
                await self._send(sock, chunk)
                left -= len(chunk)
        finally:
            answer.file.close()

    async def _send(self, sock: ssl.SSLSocket, data: bytes) -> None:
        """Send ``data`` to a reader that keeps taking it (:meth:`_taken`)."""
        view = memoryview(data)
        while view:
            sent = await self._io(sock, functools.partial(sock.send, view), sending=True)
            view = view[sent:]

    async def _io(self, sock: ssl.SSLSocket, operation: Callable[[], Any],
                  sending: bool = False) -> Any:
        """``operation()`` (a call on the non-blocking socket), again each time TLS can
        go on, until it completes; ``sending``: within the reader's progress bound."""
        while True:
            try:
                return operation()
            except ssl.SSLWantReadError:
                readable = self._ready(sock, self._loop.add_reader, self._loop.remove_reader)
                if sending:
                    async with asyncio.timeout(WRITE_TIMEOUT):
                        await readable
                else:
                    await readable
            except ssl.SSLWantWriteError:
                if sending:
                    await self._taken(sock)
                else:
                    await self._ready(sock, self._loop.add_writer, self._loop.remove_writer)

    async def _taken(self, sock: ssl.SSLSocket) -> None:
        """Return once ``sock`` has room to write; raise ``TimeoutError`` once the reader
        took nothing of what the kernel queued for it for ``WRITE_TIMEOUT`` seconds (the
        queue did not shrink: the kernel wakes a writer only once a third of a large
        buffer drained, which a slow reader may take longer than that to do)."""
        queued, since = _queued(sock), self._loop.time()
        while (left := since + WRITE_TIMEOUT - self._loop.time()) > 0:
            try:
                async with asyncio.timeout(left if queued is None else min(left, WRITE_TIMEOUT / 4)):
                    await self._ready(sock, self._loop.add_writer, self._loop.remove_writer)
                return
            except TimeoutError:
                now = _queued(sock)
                if queued is not None and now is not None and now < queued:
                    since = self._loop.time()  # progress
                queued = now
        raise TimeoutError(f"the reader took nothing for {WRITE_TIMEOUT:.0f} s")

    async def _ready(self, sock: ssl.SSLSocket, add: Callable[..., Any],
                     remove: Callable[[int], Any]) -> None:
        future = self._loop.create_future()
        fd = sock.fileno()
        add(fd, _resolve, future)
        try:
            await future
        finally:
            remove(fd)

    @staticmethod
    def _head(status: int, kind: str, length: int, extra: str = "") -> bytes:
        return (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {length}\r\n{extra}Connection: close\r\n\r\n").encode()

    def _error(self, status: int, message: str) -> bytes:
        body = message.encode("utf-8", "replace")
        extra = f"Retry-After: {RETRY_AFTER}\r\n" if status == 503 else ""
        return self._head(status, "text/plain; charset=utf-8", len(body), extra) + body

    def _log_once(self, kind: Any, message: str, *args: Any, exc_info: bool = False) -> None:
        level = logging.DEBUG if kind in self._logged else logging.WARNING
        self._logged.add(kind)
        logger.log(level, message, *args, exc_info=exc_info)


def _queued(sock: socket.socket) -> int | None:
    """The bytes in ``sock``'s kernel send queue, not yet acknowledged by the reader's
    (None where the kernel does not tell)."""
    try:
        import fcntl
        import termios

        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (ImportError, AttributeError, OSError, struct.error):
        return None


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
