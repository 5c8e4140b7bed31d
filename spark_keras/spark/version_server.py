"""The driver's answers to workers about model versions, over HTTP (:mod:`.versions`).

One small threaded HTTP server per driver process (the Spark Connect client's process
on Connect), started by the first BroadcastModel, answers two requests, each carrying
the server's secret token (which travels in the handle, like the rest of a Spark plan):

* ``GET /resolve?name=<handle>&scope=<scope>``: the version that scope scores with,
  and the versions released (JSON);
* ``GET /payload?name=<handle>&index=<n>``: a version's payload bytes (the driver keeps
  a copy of each version it shipped itself or read from storage, until ``destroy``).

Executors reach it at the driver's address: ``spark.driver.host`` on classic Spark, the
Connect server's host's view of this machine on Connect (``127.0.0.1`` for a local
server); set ``SPARK_KERAS_DRIVER_HOST`` (and ``SPARK_KERAS_DRIVER_PORT``, default any
free port) where that is not the address executors can reach.
"""

from __future__ import annotations

import atexit
import base64
import hmac
import http.server
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import urllib.parse
import urllib.request
from typing import Any, BinaryIO, Callable

from ..errors import SparkKerasError
from .versions import Schedule, Version

logger = logging.getLogger("spark_keras")

TIMEOUT = 30.0  # seconds a worker waits for the driver (connecting fails fast)
_CHUNK = 4 << 20


class Address(tuple):
    """``(host, port, token)``: where a worker asks, and the secret it shows."""

    @property
    def url(self) -> str:
        host = self[0] if ":" not in self[0] else f"[{self[0]}]"
        return f"http://{host}:{self[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_HTTPServer"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        owner = self.server.owner
        if not hmac.compare_digest(self.headers.get("X-Spark-Keras-Token", ""), owner.token):
            self.send_error(403, "bad token")
            return
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        try:
            if url.path == "/resolve":
                body = json.dumps(owner.resolve(query["name"], query.get("scope") or None)).encode()
                self._send(body, "application/json")
            elif url.path == "/payload":
                path = owner.payload_path(query["name"], int(query["index"]))
                with open(path, "rb") as f:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(os.path.getsize(path)))
                    self.end_headers()
                    self.wfile.flush()
                    self.connection.sendfile(f)  # by the kernel, from the page cache
            else:
                self.send_error(404)
        except KeyError as exc:
            self.send_error(404, f"unknown {exc}")

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's name)
        logger.debug("version server: " + format, *args)


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: "Server"


class Server:
    """The driver's schedules and payload copies, and the HTTP server answering for them."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.token = secrets.token_urlsafe(24)
        self._lock = threading.Lock()
        self._schedules: dict[str, Schedule] = {}
        self._boundaries: dict[str, Callable[[], None]] = {}
        self._payloads: dict[tuple[str, int], str] = {}
        self._folder: str | None = None  # made on the first payload kept, removed at exit
        self._httpd = _bound(host, port)
        self._httpd.owner = self
        self.address = Address((host, self._httpd.server_address[1], self.token))
        threading.Thread(target=self._httpd.serve_forever, name="spark_keras versions",
                         daemon=True).start()
        logger.info("model versions served at %s", self.address.url)

    def close(self) -> None:
        """Stop answering (the process's server lives as long as the process)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._remove_folder()

    def _remove_folder(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def register(self, name: str, schedule: Schedule,
                 boundary: Callable[[], None] | None = None) -> None:
        """Answer for handle ``name``; ``boundary()`` runs before a new scope is pinned
        (a watched URI checked there)."""
        with self._lock:
            self._schedules[name] = schedule
            if boundary is not None:
                self._boundaries[name] = boundary

    def new_file(self) -> str:
        """A fresh path in the folder of payload copies, for :meth:`keep_payload`."""
        with self._lock:
            if self._folder is None:
                self._folder = tempfile.mkdtemp(prefix="spark_keras_versions_")
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
        os.replace(source, path)
        with self._lock:
            self._payloads[(name, index)] = path
        return path

    def forget(self, name: str) -> None:
        """Stop answering for ``name`` (destroyed); remove its payload copies."""
        with self._lock:
            self._schedules.pop(name, None)
            self._boundaries.pop(name, None)
            paths = [p for (n, _), p in self._payloads.items() if n == name]
            self._payloads = {k: p for k, p in self._payloads.items() if k[0] != name}
        for path in paths:
            try:
                os.remove(path)
            except OSError:
                pass

    def payload_path(self, name: str, index: int) -> str:
        with self._lock:
            return self._payloads[(name, index)]

    def resolve(self, name: str, scope: str | None) -> dict[str, Any]:
        with self._lock:
            schedule = self._schedules[name]
            boundary = self._boundaries.get(name)
        if boundary is not None and scope is not None and not schedule.is_pinned(scope):
            try:
                boundary()
            except Exception as exc:  # a storage hiccup must not fail the tasks asking
                logger.warning("cannot check the model file of %s for a new version: %s",
                               name, exc)
        version = schedule.pin(scope)
        released = [_as_dict(v) for v in schedule.released() if v.index != version.index]
        return {"version": _as_dict(version), "released": released}


def _bound(host: str, port: int) -> "_HTTPServer":
    """A server listening at ``host`` (what executors are told); on every address of
    this machine if ``host`` is not one of its own (a container behind a NAT, say)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("_Server", (_HTTPServer,), {"address_family": family})
    try:
        return server_class((host, port), _Handler)
    except OSError as exc:
        logger.info("cannot listen at %s (%s): listening on every address", host, exc)
        return server_class(("::" if family == socket.AF_INET6 else "0.0.0.0", port), _Handler)


def _as_dict(version: Version) -> dict[str, Any]:
    return {"index": version.index, "label": version.label, "key": version.key,
            "nbytes": version.nbytes, "source": version.source}


_server: Server | None = None
_server_lock = threading.Lock()


def server_for(host: Callable[[], str]) -> Server:
    """This process's server, started on first use at ``host()`` (an address of this
    machine that executors reach; ``SPARK_KERAS_DRIVER_HOST`` instead if set)."""
    global _server
    with _server_lock:
        if _server is None:
            port = int(os.environ.get("SPARK_KERAS_DRIVER_PORT", "0"))
            _server = Server(os.environ.get("SPARK_KERAS_DRIVER_HOST") or host(), port)
        return _server


def driver_host(spark: Any, connect: bool) -> str:
    """This driver's address as the executors of ``spark`` (a Connect session if
    ``connect``) reach it."""
    if connect:
        if getattr(spark.client, "host", None) in (None, "localhost", "127.0.0.1", "::1"):
            return "127.0.0.1"  # a local Connect server: its executors are on this machine
        return socket.gethostbyname(socket.gethostname())
    sc = getattr(spark, "sparkContext", spark)
    return socket.gethostbyname(sc.getConf().get("spark.driver.host") or socket.gethostname())


# --- in a worker -------------------------------------------------------------------------

def ask(address: Address, name: str, scope: str | None) -> dict[str, Any]:
    """The driver's answer for handle ``name`` and ``scope`` (raises ``OSError`` when the
    driver cannot be reached)."""
    query = urllib.parse.urlencode({"name": name, "scope": scope or ""})
    with _open(address, f"/resolve?{query}") as response:
        return json.loads(response.read())


def download(address: Address, name: str, index: int, out: BinaryIO) -> int:
    """Write version ``index``'s payload from the driver into ``out``; its size."""
    query = urllib.parse.urlencode({"name": name, "index": index})
    buffer = memoryview(bytearray(_CHUNK))
    with _open(address, f"/payload?{query}") as response:
        total = 0
        while True:
            n = response.readinto(buffer)
            if not n:
                return total
            out.write(buffer[:n])
            total += n


def _open(address: Address, path: str) -> Any:
    request = urllib.request.Request(address.url + path,
                                     headers={"X-Spark-Keras-Token": address[2]})
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT)
    except urllib.error.HTTPError as exc:
        raise SparkKerasError(f"the driver's model versions at {address.url} refused "
                              f"{path.split('?')[0]}: {exc.code} {exc.reason} (a destroyed "
                              f"BroadcastModel, or another driver's?)") from exc


def objects_text(objects: bytes) -> str:
    """A shipment's custom objects (cloudpickle bytes) as JSON text."""
    return base64.b64encode(objects).decode()


def objects_bytes(text: str) -> bytes:
    return base64.b64decode(text)
