"""The driver's channel (``spark_keras.channel.version_server``) against hostile networks
and clients: a real server, real TLS, real relays and floods on 127.0.0.1.

* On the path: a relay that records what it passes sees neither the token nor the
  weights; one that alters bytes, shows its own certificate or answers plain HTTP makes
  the worker's request fail with a clear error, and its answer is never used.
* Load: idle and header-flooding connections leave the driver's threads and memory
  bounded while a real request is answered; out of file descriptors, accepting pauses
  instead of spinning.
* Bad requests get 4xx without a traceback, logged once; a malformed scope is never
  pinned; a deleted payload copy answers 410.
* Where it listens (``spark.driver.bindAddress``), and the payload folders a killed
  driver leaves.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.channel import client as channel_client
from spark_keras.channel import driver_address, payload_folder, version_server
from spark_keras.channel import server as channel_server
from spark_keras.channel.client import Address, ask, download
from spark_keras.channel.credentials import model_scope, tls_context
from spark_keras.channel.scopes import active_context, in_context
from spark_keras.channel.version_server import Server
from spark_keras.channel.versions import Schedule, Version
from spark_keras.errors import ChannelError, ChannelTrustError, SparkKerasError
from spark_keras.executor.transport import served
from tests import models
from tests.conftest import REPO_ROOT, run_script
from tests.relay import Relay


@pytest.fixture
def server():
    server = Server("127.0.0.1")
    server.register("m", Schedule(Version(1, "1", "m", 3)))
    server.keep_payload("m", 1, b"abc")
    yield server
    server.close()


@pytest.fixture
def blind(monkeypatch):
    """The driver cannot tell which scopes its Spark runs (as a Spark Connect client, or
    with no Spark in the process): the made-up scopes of a test are pinned as they are
    asked, whether or not an earlier module's Spark session is still up."""
    monkeypatch.setattr(version_server, "running", lambda scope: None)


@pytest.fixture(scope="module")
def weights():
    """A real model's payload, and 64 bytes of its first kernel as the payload holds them."""
    model = models.mlp(n_features=32, hidden=64, name="secret")
    payload = sk.dumps(model)
    pattern = np.ascontiguousarray(model.get_weights()[0]).tobytes()[:64]
    assert pattern in payload  # the weights travel as they are in the payload
    return payload, pattern


def _model(server: Server, name: str = "m") -> Address:
    """``server``'s address with handle ``name``'s own token (what that handle carries)."""
    return server.address_for(model_scope(name))


def _via(address: Address, port: int) -> Address:
    """``address`` reached through a relay listening at ``port``."""
    return Address(("127.0.0.1", port, address.token, address.fingerprint))


class RecordingRelay(Relay):
    """A relay to ``target`` that records every byte it passes; ``rewrite`` changes what
    the server sends, ``cut_after`` closes both sides once that many bytes of the
    server's came through."""

    def __init__(self, target: tuple[str, int], rewrite=None, cut_after: int | None = None):
        self.rewrite, self.cut_after = rewrite, cut_after
        self.captured = bytearray()
        super().__init__(target)

    def pump(self, src, dst, number):
        from_server, passed = number is not None, 0
        while data := src.recv(65536):
            if from_server and self.rewrite is not None:
                data = self.rewrite(data)
            if from_server and self.cut_after is not None and passed + len(data) > self.cut_after:
                dst.sendall(data[:self.cut_after - passed])
                break
            self.captured += data
            dst.sendall(data)
            passed += len(data)


def test_a_relay_on_the_path_sees_neither_the_token_nor_the_weights(weights):
    payload, pattern = weights
    server = Server("127.0.0.1")
    relay = RecordingRelay(("127.0.0.1", _model(server).port))
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        server.keep_payload("m", 1, payload)
        through = _via(_model(server), relay.port)
        assert ask(through, "m", "sql:1")["version"]["key"] == "m"
        out = io.BytesIO()
        assert download(through, "m", 1, out) == len(payload) and out.getvalue() == payload
        captured = bytes(relay.captured)
        assert len(captured) > len(payload)  # all of it went through the relay...
        assert _model(server).token.encode() not in captured  # ...and none of it in clear
        assert pattern not in captured and b'"version"' not in captured
    finally:
        relay.close()
        server.close()


def test_a_relay_that_alters_bytes_fails_the_request_and_its_bytes_are_not_used(server):
    def flip_last(data: bytes) -> bytes:
        return data[:-1] + bytes([data[-1] ^ 0x01])

    relay = RecordingRelay(("127.0.0.1", _model(server).port), rewrite=flip_last)
    try:
        with pytest.raises(ChannelError, match="/resolve"):
            ask(_via(_model(server), relay.port), "m", "sql:1")
        out = io.BytesIO()
        with pytest.raises(ChannelError):
            download(_via(_model(server), relay.port), "m", 1, out)
        assert out.getvalue() == b""
    finally:
        relay.close()


def _forging_server(context: ssl.SSLContext | None, received: list[bytes]) -> socket.socket:
    """A server on 127.0.0.1 answering any request with a forged version (over TLS with
    ``context``, else plain HTTP), recording what it could read."""
    forged = json.dumps({"version": {"index": 2, "label": "forged", "key": "evil", "nbytes": 1,
                                     "source": {"objects": "", "safe_mode": False, "stored": None}},
                         "released": []}).encode()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            data = b""
            try:
                conn.settimeout(5)
                if context is not None:
                    conn = context.wrap_socket(conn, server_side=True)
                data = conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(forged), forged))
            except OSError:
                pass
            finally:
                received.append(data)
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener


def test_a_server_with_another_certificate_gets_nothing_and_its_answer_is_refused(server):
    impostor_context, impostor_fingerprint = tls_context()  # its own key
    assert impostor_fingerprint != _model(server).fingerprint
    received: list[bytes] = []
    impostor = _forging_server(impostor_context, received)
    try:
        with pytest.raises(ChannelTrustError, match="not the driver's .*nothing was sent"):
            ask(_via(_model(server), impostor.getsockname()[1]), "m", "sql:1")
        with pytest.raises(ChannelTrustError):
            download(_via(_model(server), impostor.getsockname()[1]), "m", 1, io.BytesIO())
        deadline = time.monotonic() + 5
        while len(received) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert received == [b"", b""]  # the impostor read nothing: no request, no token
        with pytest.raises(ChannelTrustError):  # a handle without the fingerprint trusts no one
            ask(Address(_model(server)[:3]), "m", "sql:1")
    finally:
        impostor.close()


def test_a_plain_http_answer_is_refused(server):
    received: list[bytes] = []
    faker = _forging_server(None, received)
    try:
        with pytest.raises(ChannelError, match="/resolve"):
            ask(_via(_model(server), faker.getsockname()[1]), "m", "sql:1")
        assert _model(server).token.encode() not in b"".join(received)  # a TLS hello, no token
    finally:
        faker.close()


def test_network_failures_are_channel_errors_never_os_errors(weights):
    payload, _ = weights
    server = Server("127.0.0.1")
    relay = RecordingRelay(("127.0.0.1", _model(server).port), cut_after=len(payload) // 2)
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        server.keep_payload("m", 1, payload)
        with pytest.raises(ChannelError, match="/payload") as cut:
            download(_via(_model(server), relay.port), "m", 1, io.BytesIO())
        assert not isinstance(cut.value, OSError)
    finally:
        relay.close()
        server.close()
    with pytest.raises(ChannelError, match="cannot reach the driver") as refused:
        ask(_model(server, "m"), "m", None)  # closed: nobody listens there now
    assert not isinstance(refused.value, OSError)


# --- requests that are not what a worker sends --------------------------------------------

def _raw(address: Address, head: bytes) -> tuple[int, bytes]:
    """Send ``head`` over TLS (any certificate) and return the status and body."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with context.wrap_socket(socket.create_connection((address.host, address.port), timeout=10)) as s:
        s.sendall(head)
        answer = b""
        while data := s.recv(65536):
            answer += data
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def test_bad_tokens_and_indexes_answer_4xx_without_a_traceback_logged_once(server, capfd, caplog):
    token = _model(server).token.encode()
    with caplog.at_level(logging.DEBUG, logger="spark_keras"):
        for _ in range(3):
            status, _ = _raw(_model(server), b"GET /resolve?name=m HTTP/1.1\r\n"
                                             b"X-Spark-Keras-Token: caf\xc3\xa9\xff\r\n\r\n")
            assert status == 403
        for index in (b"abc", b"1.5", b"%C2%B2", b""):
            status, body = _raw(_model(server), b"GET /payload?name=m&index=%s HTTP/1.1\r\n"
                                                b"X-Spark-Keras-Token: %s\r\n\r\n" % (index, token))
            assert status == 400 and b"index must be a version number" in body
        status, _ = _raw(_model(server), b"GET /resolve?name=m&scope=\xff HTTP/1.1\r\n"
                                         b"X-Spark-Keras-Token: %s\r\n\r\n" % token)
        assert status == 400
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings  # one per status, not one per request
    assert "403 bad token" in warnings[0] and "400 index must be" in warnings[1]
    assert "Traceback" not in capfd.readouterr().err
    assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"  # still answering


def test_a_malformed_scope_is_refused_and_later_resolves_work(server, blind):
    schedule = Schedule(Version(1, "1", "q", 3))
    server.register("q", schedule)
    for bad in ("stream:q:2:extra", "stream:q:x", "sql:1 ", "stage:", "stage:a:b:3", "other:1",
                "stream:q\u00e9:1", "sql:" + "9" * 40):
        with pytest.raises(SparkKerasError, match="400 Bad Request: malformed scope"):
            ask(_model(server, "q"), "q", bad)
        assert not schedule.is_pinned(bad)
    for good in ("stream:2b1e4c5a-77f2-4c1b-9d1e-0c2f3a4b5c6d:0", "sql:12", "stage:7",
                 "stage:app-20260101-0001.ctx:3"):
        assert ask(_model(server, "q"), "q", good)["version"]["label"] == "1"
        # a stage's or a query's id is pinned within the SparkContext running (if any:
        # an earlier test module's session may still be up)
        assert schedule.is_pinned(in_context(good, active_context()))
    schedule.add(Version(2, "2", "q.v2", 3))
    answer = ask(_model(server, "q"), "q", "stream:2b1e4c5a-77f2-4c1b-9d1e-0c2f3a4b5c6d:1")
    assert answer["version"]["label"] == "2"


def test_a_deleted_copy_answers_410_and_the_worker_says_which(server, capfd):
    os.remove(server.payload_path("m", 1))
    with pytest.raises(SparkKerasError, match="the driver's copy of version 1 of model m is missing"):
        download(_model(server, "m"), "m", 1, io.BytesIO())
    assert "Traceback" not in capfd.readouterr().err


# --- load ----------------------------------------------------------------------------------

_ATTACK = textwrap.dedent("""
    import socket, ssl, sys, threading, time
    port, idle, flooders, seconds = map(int, sys.argv[1:])
    end = time.monotonic() + seconds
    held = []
    for _ in range(idle):  # connect and say nothing
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    sent = [0]
    def flood():  # TLS, then header lines without end, again when dropped
        while time.monotonic() < end:
            try:
                with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=2)) as s:
                    s.sendall(b"GET /resolve?name=m HTTP/1.1\\r\\n")
                    while time.monotonic() < end:
                        s.sendall(b"X-Flood: " + b"a" * 1000 + b"\\r\\n")
                        sent[0] += 1
            except OSError:
                time.sleep(0.05)
    threads = [threading.Thread(target=flood) for _ in range(flooders)]
    for t in threads:
        t.start()
    print("attacking", flush=True)
    for t in threads:
        t.join()
    print("header lines sent", sent[0], flush=True)
""")


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.slow  # 12 s of make test's 15 min
def test_idle_and_flooding_connections_leave_threads_and_memory_bounded(server):
    threads_before, rss_before = threading.active_count(), _rss()
    attack = subprocess.Popen([sys.executable, "-c", _ATTACK, str(_model(server).port), "1000",
                               "150", "12"], stdout=subprocess.PIPE, text=True)
    try:
        assert attack.stdout.readline().strip() == "attacking"
        time.sleep(1.5)  # the flood under way
        peak_threads, peak_rss, peak_connections, waits = 0, 0, 0, []
        while attack.poll() is None:
            started = time.monotonic()
            assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"
            waits.append(time.monotonic() - started)
            for _ in range(5):
                peak_threads = max(peak_threads, threading.active_count())
                peak_rss = max(peak_rss, _rss())
                peak_connections = max(peak_connections, server._channel.connections())
                time.sleep(0.1)
        sent = attack.stdout.read()
    finally:
        attack.kill()
        attack.wait()
    assert int(sent.split()[-1]) > 10_000, sent  # the flood was real: 10 MB of header lines
    assert len(waits) >= 5 and max(waits) < 5.0, waits  # a real request gets through
    assert peak_connections <= server._channel.cap
    assert peak_threads <= threads_before + channel_server.WORKERS + 1, peak_threads
    assert peak_rss - rss_before < 50 << 20, (peak_rss - rss_before) >> 20


def _stalled_reader(address: Address, target: bytes) -> ssl.SSLSocket:
    """A reader that sends a real request for ``target`` and reads nothing of the answer
    (a tiny receive buffer: the driver's send stalls once its own buffer is full)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect((address.host, address.port))
    sock = context.wrap_socket(raw)
    sock.sendall(b"GET %s HTTP/1.1\r\nX-Spark-Keras-Token: %s\r\n\r\n"
                 % (target, address.token.encode()))
    return sock


def _hold_the_cap(server: Server) -> list[ssl.SSLSocket]:
    """As many stalled readers of a payload as the server's cap, each shown its token."""
    readers = [_stalled_reader(_model(server), b"/payload?name=m&index=1")
               for _ in range(server._channel.cap)]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (
            server._channel.connections() == server._channel.cap
            and all(c.shown for c in list(server._channel._connections))):
        time.sleep(0.02)
    assert server._channel.connections() == server._channel.cap
    return readers


def test_past_the_cap_readers_are_told_to_come_back_and_their_downloads_land(monkeypatch, caplog):
    """Every place taken by readers of a large payload (here a cap of 2): a further
    download used to wait in the listen backlog until its attempts timed out ("cannot
    reach the driver"); now the driver answers 503 with Retry-After at once, the worker
    comes back (not counted as an attempt) and lands the payload when a place frees.
    Short answers (/resolve) are still given at the cap."""
    monkeypatch.setattr(channel_server, "MAX_CONNECTIONS", 2)
    monkeypatch.setattr(channel_server, "RETRY_AFTER", 1)
    monkeypatch.setattr(channel_client, "TIMEOUT", 1.0)
    monkeypatch.setattr(served, "DOWNLOAD_ATTEMPTS", 2)  # 1 s + 1 s + 1 s, then failed
    payload = os.urandom(16 << 20)  # more than the kernel's socket buffers hold
    server = Server("127.0.0.1")
    readers: list[ssl.SSLSocket] = []
    try:
        assert server._channel.cap == 2
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        kept = server.keep_payload("m", 1, payload)
        readers = _hold_the_cap(server)
        started = time.monotonic()
        threading.Timer(4.0, lambda: [r.close() for r in readers]).start()
        out = io.BytesIO()
        with caplog.at_level(logging.INFO, logger="spark_keras"):
            served.ServedTransport.of(_model(server), "m", 1, kept).write(out)
        assert out.getvalue() == payload
        assert time.monotonic() - started >= 4.0  # it waited for a place
        busy = [r.getMessage() for r in caplog.records if "maximum of readers" in r.getMessage()]
        assert busy and "asked for again" in busy[0], busy
        readers = _hold_the_cap(server)
        started = time.monotonic()
        assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"
        assert time.monotonic() - started < 1.0
    finally:
        for reader in readers:
            reader.close()
        server.close()


_SERVER_AT_LOW_LIMIT = textwrap.dedent("""
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    from spark_keras.channel.version_server import Server
    from spark_keras.channel.versions import Schedule, Version
    server = Server("127.0.0.1")
    server.register("m", Schedule(Version(1, "1", "m", 3)))
    print(json.dumps(list(server.address_for("model:m"))), server._channel.cap, flush=True)
    hog = []
    for line in sys.stdin:
        if line.strip() == "hog":  # the rest of the driver takes all file descriptors but 4
            try:
                while True:
                    hog.append(open("/dev/null"))
            except OSError:
                pass
            for f in hog[-4:]:
                f.close()
            del hog[-4:]
            print("hogging", len(hog), flush=True)
        elif line.strip() == "cpu":
            print(time.process_time(), flush=True)
        elif line.strip() == "release":
            for f in hog:
                f.close()
            hog.clear()
            print("released", flush=True)
""")


def test_out_of_file_descriptors_the_accept_loop_waits_and_serves_again():
    driver = subprocess.Popen([sys.executable, "-c", _SERVER_AT_LOW_LIMIT], cwd=REPO_ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    idle: list[socket.socket] = []
    try:
        fields, cap = driver.stdout.readline().rsplit(" ", 1)
        address = Address(json.loads(fields))
        assert int(cap) == 128 // 4  # a quarter of the soft limit

        def command(word: str) -> str:
            driver.stdin.write(word + "\n")
            driver.stdin.flush()
            return driver.stdout.readline().strip()

        assert command("hog").startswith("hogging")
        for _ in range(100):  # more than the driver has descriptors left
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", address.port))
            idle.append(s)
        time.sleep(0.5)
        cpu = float(command("cpu"))
        time.sleep(4)
        spent = float(command("cpu")) - cpu
        assert spent < 0.4, f"the driver's process used {spent:.2f} s of CPU in 4 s: spinning"
        assert command("release") == "released"
        for s in idle:
            s.close()
        idle.clear()
        started = time.monotonic()
        assert ask(address, "m", "sql:1")["version"]["label"] == "1"
        assert time.monotonic() - started < 5
    finally:
        for s in idle:
            s.close()
        driver.kill()
        _, err = driver.communicate()
    assert err.count("cannot accept a connection") <= 1, err  # logged once
    assert "Traceback" not in err, err


# --- where it listens, what it leaves ----------------------------------------------------

def _foreign(address: str) -> str:
    """``address`` if it is not one of this machine's (else the test is skipped)."""
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError:
            return address
    pytest.skip(f"{address} is an address of this machine")


def test_a_host_not_of_this_machine_listens_everywhere_with_a_warning_unless_bound(caplog):
    _foreign("203.0.113.8")
    with caplog.at_level(logging.WARNING, logger="spark_keras"):
        everywhere = Server(_foreign("203.0.113.7"))  # TEST-NET-3: documentation addresses
    try:
        assert everywhere._channel._sock.getsockname()[0] == "0.0.0.0"
        (message,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "203.0.113.7" in message and "every interface" in message
        assert "spark.driver.bindAddress" in message and "SPARK_KERAS_DRIVER_BIND_ADDRESS" in message
    finally:
        everywhere.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spark_keras"):
        bound = Server("203.0.113.7", bind="127.0.0.1")
    try:
        assert bound._channel._sock.getsockname()[0] == "127.0.0.1"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        bound.register("m", Schedule(Version(1, "1", "m", 3)))
        assert ask(_via(_model(bound), _model(bound).port), "m", None)["version"]["label"] == "1"
    finally:
        bound.close()
    with pytest.raises(SparkKerasError, match="cannot listen at 203.0.113.8 .*bindAddress"):
        Server("127.0.0.1", bind="203.0.113.8")


def test_the_bind_address_comes_from_the_environment_first(monkeypatch):
    monkeypatch.delenv(driver_address.BIND_ENV, raising=False)
    assert driver_address.bind_address(None, connect=True) is None  # Connect: not the server's
    monkeypatch.setenv(driver_address.BIND_ENV, "127.0.0.1")
    assert driver_address.bind_address(None, connect=True) == "127.0.0.1"


_KILLED_DRIVER = textwrap.dedent("""
    import os, time
    from spark_keras.channel.version_server import Server
    server = Server("127.0.0.1")
    print(os.path.dirname(server.new_file()), flush=True)
    time.sleep(60)
""")


def test_the_folder_a_killed_driver_left_is_removed_at_the_next_start():
    killed = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER], stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tmp = tempfile.gettempdir()
    kept = [os.path.join(tmp, f"spark_keras_versions_{alive.pid}_abcd_123"),  # no lock file:
            os.path.join(tmp, "spark_keras_versions_999999999_abcd_123"),  # an earlier version's
            os.path.join(tmp, "spark_keras_versions_1234_678")]  # the older naming, no pid
    try:
        left = killed.stdout.readline().strip()
        assert os.path.basename(left).startswith(f"spark_keras_versions_{killed.pid}_")
        assert os.stat(left).st_mode & 0o777 == 0o700
        assert os.stat(os.path.join(left, ".lock")).st_mode & 0o777 == 0o600
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert os.path.isdir(left)  # SIGKILL: no clean-up at exit
        for path in kept:
            os.makedirs(path, exist_ok=True)
        server = Server("127.0.0.1")  # the next start
        server.close()
        assert not os.path.exists(left)
        assert all(os.path.isdir(p) for p in kept)
    finally:
        alive.kill()
        alive.wait()
        killed.kill()
        for path in kept:
            if os.path.isdir(path):
                os.rmdir(path)


_LIVE_DRIVER = textwrap.dedent("""
    import os, sys
    from spark_keras.channel.version_server import Server
    server = Server("127.0.0.1")
    path = server.new_file()
    print(os.path.dirname(path), flush=True)
    sys.stdin.readline()
""")


def test_a_live_drivers_folder_stays_whatever_its_pid_means_here():
    """Drivers in other PID namespaces (containers) share one temporary folder: the pid
    in a live driver's folder name is no live process of this one (here: the folder of
    a live driver renamed to a pid that runs nowhere). The sweep used to take it for a
    dead driver's and remove its payload copies; it now removes a folder only once its
    driver's lock is free, as when that driver is killed."""
    driver = subprocess.Popen([sys.executable, "-c", _LIVE_DRIVER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    elsewhere = None
    try:
        folder = driver.stdout.readline().strip()
        name = os.path.basename(folder)
        suffix = name[len(f"spark_keras_versions_{driver.pid}_"):]
        elsewhere = os.path.join(os.path.dirname(folder), f"spark_keras_versions_999999999_{suffix}")
        with pytest.raises(ProcessLookupError):
            os.kill(999999999, 0)
        os.rename(folder, elsewhere)  # the flock goes with the folder's lock file
        assert elsewhere not in payload_folder.remove_stale_folders()
        assert [n for n in os.listdir(elsewhere) if n.endswith(".part")]  # its copy stays
        assert driver.poll() is None
        driver.kill()
        driver.wait()
        assert elsewhere in payload_folder.remove_stale_folders()  # dead: its lock is free
        assert not os.path.exists(elsewhere)
    finally:
        driver.kill()
        driver.wait()
        if elsewhere is not None and os.path.isdir(elsewhere):
            shutil.rmtree(elsewhere)


# --- with Spark's own security on --------------------------------------------------------

_SECURED_SPARK = textwrap.dedent("""
    import numpy as np, sys
    from pyspark.sql import SparkSession
    import spark_keras as sk
    from spark_keras.inference import predictor_for
    from spark_keras.channel import version_server
    from tests import models

    spark = (SparkSession.builder.master("local-cluster[1,1,1024]")
             .config("spark.authenticate", "true")
             .config("spark.authenticate.secret", "a-shared-secret-for-this-test")
             .config("spark.network.crypto.enabled", "true")
             .config("spark.io.encryption.enabled", "true")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "0.0.0.0")  # Spark's, and the channel's
             .config("spark.ui.enabled", "false")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", "{root}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    x = np.random.default_rng(0).standard_normal((40, 4), dtype=np.float32)
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(40)], "id long, features array<float>")
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"m{{i}}") for i in (1, 2))
    expected = lambda m: predictor_for(m)([x], 1024)[0].reshape(-1)
    bm = sk.BroadcastModel(spark, v1, ship="driver")
    assert type(bm._transport).__name__ == "ServedTransport"
    assert version_server._server._channel._sock.getsockname()[0] == "0.0.0.0"
    scored = bm.transform(df, "features", version_col="v")
    first = scored.toPandas().sort_values("id")
    assert set(first.v) == {{"1"}}
    np.testing.assert_allclose(first.prediction.to_numpy(np.float32), expected(v1), rtol=1e-5)
    bm.update(v2)
    again = scored.toPandas().sort_values("id")
    assert set(again.v) == {{"2"}}
    np.testing.assert_allclose(again.prediction.to_numpy(np.float32), expected(v2), rtol=1e-5)
    bm.destroy()
    spark.stop()
    print("SECURED OK")
""")


@pytest.mark.slow
def test_with_spark_authentication_and_network_encryption_versions_still_travel(tmp_path):
    run_script(tmp_path, _SECURED_SPARK.format(root=REPO_ROOT), "SECURED OK", timeout=400)
