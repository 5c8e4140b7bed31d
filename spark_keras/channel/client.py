"""In a worker: requests to the driver's channel (:mod:`.version_server`), over TLS with
the driver's certificate pinned.

The handle carries an :class:`Address` through Spark's own channel (the task's closure
or plan): the driver's host and port, its secret token and the SHA-256 fingerprint of
its certificate. A request connects with TLS, compares the certificate the server shows
with that fingerprint right after the handshake and before sending anything (the token
included), and goes on only if they match: only the holder of the driver's private key
can read the token or answer, so answers and payloads are authenticated and private
whatever Spark's own settings. Needs only the standard library (no ``cryptography``).

Errors: :class:`~spark_keras.errors.ChannelTrustError` when the certificate is not the
driver's (nothing was sent); :class:`~spark_keras.errors.ChannelError` when the driver
cannot be reached or the connection fails in transit (refused, reset, timed out, a TLS
failure, an answer cut short), never an ``OSError`` a caller could take for a local disk
error, and its :class:`DriverBusy` when the driver says to come back later (503);
:class:`~spark_keras.errors.SparkKerasError` when the driver refuses the request.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import math
import ssl
import urllib.parse
from typing import Any, BinaryIO, Iterator

from spark_keras.errors import ChannelError, ChannelTrustError, SparkKerasError

TIMEOUT = 30.0  # seconds a worker waits for the driver at each step (connecting fails fast)
TOKEN_HEADER = "X-Spark-Keras-Token"
_CHUNK = 4 << 20
_REFUSAL_BYTES = 4096  # of a refusal's message read


class DriverBusy(ChannelError):
    """The driver answered 503: it serves its maximum of connections, all reading payloads;
    ask again in :attr:`retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float:
    """A ``Retry-After`` header's seconds, kept within 0.1 and 60 (1 if absent or not a
    number of seconds)."""
    try:
        seconds = float(value or "1")
    except ValueError:
        return 1.0
    return min(max(seconds, 0.1), 60.0) if math.isfinite(seconds) else 1.0


class Address(tuple):
    """``(host, port, token, fingerprint, plan_if_unreachable)``: where a worker asks, the
    secret it shows, the SHA-256 (hex) of the certificate the driver's server must show,
    and whether a worker that cannot reach the driver at all scores with the version its
    plan was made with (the driver's opt-in, ``SPARK_KERAS_UNREACHABLE_DRIVER=plan``)
    rather than fail its task."""

    @property
    def host(self) -> str:
        return self[0]

    @property
    def port(self) -> int:
        return self[1]

    @property
    def token(self) -> str:
        return self[2]

    @property
    def fingerprint(self) -> str | None:
        return self[3] if len(self) > 3 else None

    @property
    def plan_if_unreachable(self) -> bool:
        return bool(self[4]) if len(self) > 4 else False

    @property
    def url(self) -> str:
        host = self[0] if ":" not in self[0] else f"[{self[0]}]"
        return f"https://{host}:{self[1]}"


def ask(address: Address, name: str, scope: str | None) -> dict[str, Any]:
    """The driver's answer for handle ``name`` and ``scope``: the version that scope
    scores with and the versions released.

    Raises:
        ChannelError: the driver cannot be reached, or the connection failed.
        ChannelTrustError: the server is not the driver (its certificate).
        SparkKerasError: the driver refused (an unknown or destroyed handle).
    """
    return _answer(address, "/resolve", {"name": name, "scope": scope or ""})


def report(address: Address, fields: dict[str, str]) -> dict[str, Any]:
    """The driver's answer to a task's report of its invalid rows (``fields``: the query
    :mod:`.budget_ledger` reads; ``name`` is the budget's key).

    Raises:
        as :func:`ask`.
    """
    return _answer(address, "/invalid", fields)


def _answer(address: Address, route: str, fields: dict[str, str]) -> dict[str, Any]:
    """The JSON answer to ``GET route?fields``."""
    with _exchange(address, f"{route}?{urllib.parse.urlencode(fields)}", fields["name"]) as response:
        with _in_transit(address, route):
            body = response.read()
        _check_length(address, route, response, len(body))
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ChannelError(f"the driver at {address.url} answered {route} with text that is "
                           f"not JSON ({exc})") from exc


def download(address: Address, name: str, index: int, out: BinaryIO, start: int = 0,
             stop: int | None = None) -> int:
    """Write version ``index``'s payload from the driver into ``out``, from byte ``start``
    on (a transfer cut short, resumed: ``Range``) up to byte ``stop`` (excluded; by
    default its end); the number of bytes written.

    Raises:
        ChannelError: the driver cannot be reached, or the transfer failed (reset, timed
            out, fewer bytes than announced); what ``out`` holds then is incomplete (every
            byte written to it is the payload's, in order).
        ChannelTrustError: the server is not the driver (its certificate).
        SparkKerasError: the driver refused, or its copy of that version is missing.
    """
    query = urllib.parse.urlencode({"name": name, "index": index})
    buffer = memoryview(bytearray(_CHUNK))
    total = 0
    wanted = None if stop is None else stop - start
    if wanted is not None and wanted <= 0:
        return 0
    with _exchange(address, f"/payload?{query}", name, index, start, stop) as response:
        while wanted is None or total < wanted:
            with _in_transit(address, "/payload"):
                n = response.readinto(buffer if wanted is None else buffer[:wanted - total])
            if not n:
                break
            out.write(buffer[:n])  # a local error here is the caller's (an OSError)
            total += n
        if wanted is None or total < wanted:  # (else the rest is left unread)
            _check_length(address, "/payload", response, total)
    return total


@contextlib.contextmanager
def _exchange(address: Address, path: str, name: str, index: int | None = None,
              start: int = 0, stop: int | None = None) -> Iterator[http.client.HTTPResponse]:
    """A response of status 200 to ``GET path`` (206 from byte ``start`` to ``stop``,
    excluded, if not 0 and None), from the pinned server only."""
    route, message = path.split("?")[0], ""
    headers = {TOKEN_HEADER: address.token}
    if start or stop is not None:
        headers["Range"] = f"bytes={start}-{'' if stop is None else stop - 1}"
    connection = http.client.HTTPSConnection(address.host, address.port, timeout=TIMEOUT,
                                             context=_context())
    try:
        with _in_transit(address, route, connecting=True):
            connection.connect()
        _check_pinned(connection.sock, address)
        with _in_transit(address, route):
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            if response.status not in (200, 206):
                message = response.read(_REFUSAL_BYTES).decode("utf-8", "replace").strip()
        if response.status == 503:
            raise DriverBusy(f"the driver at {address.url} is serving its maximum of readers "
                             f"({message})", _retry_after(response.getheader("Retry-After")))
        if response.status == 410 and index is not None:
            raise SparkKerasError(f"the driver's copy of version {index} of model {name} is "
                                  f"missing ({message})")
        if response.status not in (200, 206):
            hint = " (a destroyed BroadcastModel, or another driver's?)" \
                if response.status in (403, 404) else ""
            raise SparkKerasError(f"the driver's model versions at {address.url} refused {route}: "
                                  f"{response.status} {response.reason}: {message}{hint}")
        ranged = "Range" in headers
        resumed = (response.getheader("Content-Range") or "").startswith(f"bytes {start}-")
        if (response.status == 206) != ranged or (ranged and not resumed):
            raise ChannelError(f"the driver at {address.url} answered {route} from byte {start} "
                               f"with {response.status} (Content-Range "
                               f"{response.getheader('Content-Range')!r})")
        yield response
    finally:
        connection.close()


def _check_pinned(sock: Any, address: Address) -> None:
    """Refuse a server whose certificate is not the one pinned in ``address``."""
    der = sock.getpeercert(binary_form=True)
    shown = hashlib.sha256(der).hexdigest() if der else "none"
    pinned = address.fingerprint
    if pinned is None or not hmac.compare_digest(shown, pinned):
        raise ChannelTrustError(
            f"the server at {address.url} showed a certificate (sha256 {shown[:16]}...) that is "
            f"not the driver's (sha256 {(pinned or 'none')[:16]}..., carried by the handle): "
            f"something on the path between this executor and the driver intercepts the "
            f"connection, or another process holds the driver's port; nothing was sent to it")


def _check_length(address: Address, route: str, response: http.client.HTTPResponse,
                  got: int) -> None:
    announced = response.getheader("Content-Length")
    if announced is None or not announced.isdigit() or int(announced) != got:
        raise ChannelError(f"the driver's answer to {route} from {address.url} was cut short: "
                           f"{got} bytes of {announced}")


@contextlib.contextmanager
def _in_transit(address: Address, route: str, connecting: bool = False) -> Iterator[None]:
    """Network failures as :class:`ChannelError` (TLS failures included: a connection
    tampered with fails there)."""
    try:
        yield
    except (OSError, http.client.HTTPException) as exc:
        if connecting and not isinstance(exc, ssl.SSLError):
            raise ChannelError(f"cannot reach the driver at {address.url} for {route}: "
                               f"{exc}") from exc
        raise ChannelError(f"the connection to the driver at {address.url} failed during "
                           f"{route} ({type(exc).__name__}: {exc}); a network failure, or "
                           f"something on the path altering it") from exc


_client_context: ssl.SSLContext | None = None


def _context() -> ssl.SSLContext:
    """TLS without the CA and host name checks: the certificate is checked by its
    pinned fingerprint instead (:func:`_check_pinned`)."""
    global _client_context
    if _client_context is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _client_context = context
    return _client_context
