"""What a Spark worker acts on from the driver's channel (issue 43, items 1, 5 and 6), on
real local Spark, a real version server and real relays on 127.0.0.1.

* Trust: the payload of every version served from the driver is refused unless its
  SHA-256 is the one the driver fixed (a file swapped on the driver after shipping is
  caught before anything is built); ``safe_mode`` comes from the plan, never from the
  answer; custom objects never travel in an answer: an update's new ones are a file
  Spark ships, unpickled only if its digest is the one the answer names.
* A download the network cuts (a reset, a stall) is tried again into the executor's one
  shared file, never reported as a local disk error nor copied privately.
* A driver slow to answer is asked again: one action, one version. A driver that cannot
  be reached at all (a reset forged on the path looks the same) fails the task, never
  scores the plan's version while other workers score the current one; only the
  driver's opt-in (``SPARK_KERAS_UNREACHABLE_DRIVER=plan``) leaves the plan's version,
  kept for the whole scope.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import pickle
import socket
import ssl
import struct
import textwrap
import time

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.channel import client as channel_client
from spark_keras.channel import socket_io
from spark_keras.channel.client import Address
from spark_keras.channel.version_server import Server
from spark_keras.channel.versions import Schedule, Version
from spark_keras.errors import ChannelError, LocalWriteError, PayloadError, SparkKerasError
from spark_keras.executor import shipped_objects, task_version
from spark_keras.executor.transport.executor_file import executor_folder
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.inference import predictor_for
from spark_keras.payload import host_file
from spark_keras.payload.shipment import Shipment
from tests import models
from tests.channel.test_security import _model
from tests.conftest import REPO_ROOT, build_records, run_script
from tests.relay import Relay


class StallingRelay(Relay):
    """A relay to ``target`` whose connections with a number (from 0, see
    :meth:`reset_count`) in ``stall`` hold the server's bytes back for ``stall_for``
    seconds; those in ``reset_after`` are reset (RST) once that many of the server's
    bytes came through."""

    def __init__(self, target: tuple[str, int], *, stall: set[int] = frozenset(),
                 stall_for: float = 0.0, reset_after: dict[int, int] | None = None):
        self.stall, self.stall_for = set(stall), stall_for
        self.reset_after = dict(reset_after or {})
        self.stalled = self.resets = 0
        self.passed: dict[int, int] = {}  # the server's bytes passed, by connection
        super().__init__(target)

    def via(self, address: Address) -> Address:
        """``address`` reached through this relay."""
        return Address(("127.0.0.1", self.port, address.token, address.fingerprint))

    def reset_count(self) -> None:
        with self._lock:
            self.count = 0

    def pump(self, src: socket.socket, dst: socket.socket, number: int | None) -> None:
        passed, first = 0, True
        while data := src.recv(65536):
            if number is not None and first and number in self.stall:
                self.stalled += 1
                time.sleep(self.stall_for)
            first = False
            limit = self.reset_after.get(number) if number is not None else None
            if limit is not None and passed + len(data) > limit:
                dst.sendall(data[:limit - passed])
                self.resets += 1
                dst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                break
            dst.sendall(data)
            passed += len(data)
            if number is not None:
                self.passed[number] = passed


def _frame(spark, x, partitions: int = 4):
    return spark.createDataFrame([(i, x[i].tolist()) for i in range(len(x))],
                                 "id long, features array<float>").repartition(partitions)


def _expected(model, x):
    return predictor_for(model)([x], 1024)[0].reshape(-1)


def _scored(bm, df):
    got = bm.transform(df, "features", version_col="v").toPandas().sort_values("id")
    return got, got.prediction.to_numpy(np.float32)


def _same_size_other_weights(model) -> bytes:
    """A payload of ``model``'s very config (so the same size) with other weights."""
    weights = model.get_weights()
    model.set_weights([w + 1.0 for w in weights])
    try:
        return sk.dumps(model)
    finally:
        model.set_weights(weights)


def _executor_files(spark, key: str) -> list[str]:
    """The executors' payload files of ``key`` (and writers' temporary files)."""
    def files(_):
        folder = executor_folder()
        names = os.listdir(folder) if folder and os.path.isdir(folder) else []
        return [os.path.join(folder, n) for n in names
                if n == f"{key}{host_file.SUFFIX}" or n.startswith(f"{key}{host_file.SUFFIX}.tmp-")]

    return sorted(set(spark.sparkContext.parallelize(range(4), 4).mapPartitions(files).collect()))


# --- trust: digests, safe_mode, custom objects --------------------------------------------

@pytest.mark.slow  # 34 s of make test's 15 min
def test_a_payload_swapped_on_the_driver_after_shipping_is_refused_by_its_digest(spark):
    """The driver's copy of a version replaced after it was shipped (what a compromised
    answer would serve): same size, a sound payload, other weights. Workers refuse it
    before anything is built from it, naming the model, the version and both digests;
    no file of it is published on the executor, no row is scored."""
    x = np.random.default_rng(0).standard_normal((24, 8), dtype=np.float32)
    # one task: a sibling task killed by the job's failure while writing would leave its
    # temporary file for the next writer (or the release) to sweep, not this check
    df = _frame(spark, x, partitions=1)
    v1, v2 = models.mlp(name="t1"), models.mlp(name="t2")
    for ship, index in (("auto", 2), ("driver", 1)):
        bm = sk.BroadcastModel(spark, v1, ship=ship)
        try:
            if index == 2:
                bm.update(v2)
            key = bm._key if index == 1 else f"{bm._name}.v2"
            copy = bm._server.payload_path(bm._name, index)
            forged = _same_size_other_weights(v2 if index == 2 else v1)
            assert len(forged) == os.path.getsize(copy)
            with open(copy, "wb") as f:
                f.write(forged)
            with pytest.raises(Exception) as caught:
                _scored(bm, df)
            message = str(caught.value)
            assert "PayloadError" in message and f"model {bm._name} version {index}" in message
            assert "the digest the driver fixed" in message, message
            assert _executor_files(spark, key) == []  # nothing published, no temporary left
        finally:
            bm.destroy()


def _lambda_version():
    """A model that fits :func:`models.mlp`'s plans, with a Lambda layer (refused under
    ``safe_mode``)."""
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(1), keras.layers.Lambda(lambda t: t * 2.0)])


class _RunsCode:
    """Unpickling it makes a folder: proof that a pickle ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.slow  # 31 s of make test's 15 min
def test_safe_mode_and_custom_objects_are_never_taken_from_the_answer(spark, tmp_path):
    """The driver's answer edited on the driver (a compromised answer): ``safe_mode``
    false is ignored (the Lambda layer stays refused: nothing is scored by it), and a
    pickle in the objects field is refused unread (it would make a folder)."""
    x = np.random.default_rng(1).standard_normal((16, 8), dtype=np.float32)
    df = _frame(spark, x, partitions=2)
    bm = sk.BroadcastModel(spark, models.mlp(name="safe1"))
    try:
        bm.update(_lambda_version())
        source = bm._schedule.versions[2].source
        assert "safe_mode" not in source and source["objects"] is None
        source["safe_mode"] = False
        with pytest.raises(Exception, match="safe_mode") as caught:
            _scored(bm, df)
        assert "PayloadError" in str(caught.value) or "ValueError" in str(caught.value)
        marker = str(tmp_path / "pickle-ran")
        source["objects"] = base64.b64encode(pickle.dumps(_RunsCode(marker))).decode()
        with pytest.raises(Exception, match="not by a SHA-256: refused"):
            _scored(bm, df)
        assert not os.path.exists(marker), "a pickle from the driver's answer was loaded"
    finally:
        bm.destroy()


@pytest.mark.slow  # 20 s of make test's 15 min
def test_new_custom_objects_of_an_update_travel_through_spark_and_are_checked(spark, tmp_path):
    """An update whose model needs a class the workers cannot import (defined here:
    cloudpickled by value) ships it as a digest-named file added to the application; the
    answer names only its digest. Workers score with it exactly; the file altered on the
    executor is refused before it is unpickled."""
    class Triple(keras.layers.Layer):  # not importable in a worker
        def call(self, t):
            return t * 3.0

    x = np.random.default_rng(2).standard_normal((16, 8), dtype=np.float32)
    df = _frame(spark, x, partitions=2)
    v2 = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(1), Triple()])
    bm = sk.BroadcastModel(spark, models.mlp(name="objects1"))
    try:
        bm.update(v2)
        source = bm._schedule.versions[2].source
        assert set(source) == {"sha256", "objects", "stored"}, source
        digest = source["objects"]
        assert isinstance(digest, str) and len(digest) == 64
        got, found = _scored(bm, df)
        assert set(got.v) == {"2"}
        np.testing.assert_allclose(found, _expected(v2, x[got.id.to_numpy()]), rtol=1e-5, atol=1e-6)
        # the executors' copy of the file (local mode: the driver's SparkFiles folder)
        from pyspark import SparkFiles

        shipped = SparkFiles.get(shipped_objects.file_name(digest))
        marker = str(tmp_path / "pickle-ran")
        with open(shipped, "wb") as f:
            f.write(pickle.dumps(_RunsCode(marker)))
        with pytest.raises(Exception, match="custom objects of model .* altered") as caught:
            _scored(bm, df)
        assert "PayloadError" in str(caught.value)
        assert not os.path.exists(marker), "an unchecked custom objects file was unpickled"
    finally:
        bm.destroy()


# --- downloads the network cuts -------------------------------------------------------------

@pytest.mark.slow  # 40-100 s under load (a reset download waits out its retry)
def test_a_reset_download_is_tried_again_into_the_one_shared_file(spark, build_log):
    """The first download of a ``ship="driver"`` payload is reset part way: the worker
    downloads it again into the executor's shared file; no private copy, no
    ``shared_fallback``, exact predictions."""
    model = models.mlp(n_features=64, hidden=2048, name="reset1")
    x = np.random.default_rng(3).standard_normal((24, 64), dtype=np.float32)
    df = _frame(spark, x)
    bm = sk.BroadcastModel(spark, model, ship="driver")
    relay = None
    try:
        assert bm._nbytes > 256 * 1024
        address = bm._transport.address
        relay = StallingRelay((address.host, address.port), reset_after={0: 128 * 1024})
        bm._transport = dataclasses.replace(bm._transport, address=relay.via(address))
        got, found = _scored(bm, df)
        np.testing.assert_allclose(found, _expected(model, x[got.id.to_numpy()]), rtol=1e-5, atol=1e-6)
        assert relay.resets == 1 and relay.count >= 2
        records = build_records(build_log, bm.key)
        assert records and all(r["shared"] and "shared_fallback" not in r for r in records), records
        assert [os.path.basename(p) for p in _executor_files(spark, bm.key)] == \
            [f"{bm.key}{host_file.SUFFIX}"]
    finally:
        if relay is not None:
            relay.close()
        bm.destroy()


def test_a_stalled_download_is_tried_again_and_lands_whole(tmp_path, monkeypatch):
    """A transfer that stalls past the timeout is tried again into the same file."""
    monkeypatch.setattr(channel_client, "TIMEOUT", 1.0)
    payload = sk.dumps(models.mlp(n_features=32, hidden=64, name="stall1"))
    server = Server("127.0.0.1")
    relay = StallingRelay(("127.0.0.1", _model(server).port), stall={0}, stall_for=3.0)
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        kept = server.keep_payload("m", 1, payload)
        served = ServedTransport.of(relay.via(_model(server)), "m", 1, kept)
        folder = str(tmp_path / "host")
        path = host_file.land(folder, "m", len(payload), write=served.write)
        with open(path, "rb") as f:
            assert f.read() == payload
        assert relay.stalled == 1 and relay.count == 2
        assert sorted(os.listdir(folder)) == ["m.skp", "m.skp.lock"]
    finally:
        relay.close()
        server.close()


def test_a_cut_download_resumes_where_it_stopped(tmp_path):
    """A transfer reset after 1 MiB of a 4 MiB payload: the next attempt asks for the rest
    (Range) and appends it to the same file; the whole is checked against the driver's
    digest. It used to start again from the first byte."""
    payload = os.urandom(4 << 20)
    server = Server("127.0.0.1")
    relay = StallingRelay(("127.0.0.1", _model(server).port), reset_after={0: 1 << 20})
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        served = ServedTransport.of(relay.via(_model(server)), "m", 1,
                                    server.keep_payload("m", 1, payload))
        folder = str(tmp_path / "host")
        path = host_file.land(folder, "m", len(payload), write=served.write)
        with open(path, "rb") as f:
            assert f.read() == payload
        assert relay.resets == 1 and relay.count == 2
        assert relay.passed[1] < len(payload) - (512 << 10), relay.passed  # the rest alone
        assert sorted(os.listdir(folder)) == ["m.skp", "m.skp.lock"]
        with pytest.raises(SparkKerasError, match="416 .* past the answer's"):
            channel_client.download(_model(server, "m"), "m", 1, io.BytesIO(), start=len(payload))
    finally:
        relay.close()
        server.close()


def test_a_part_of_a_payload_costs_the_driver_that_part_alone():
    """A reader of bytes 1 to 2 MiB of an 8 MiB payload (a share at ship time) gets them,
    and the driver sends about that much: the Range asks for the part's last byte, and the
    driver stops there. It used to send the rest of the file, most of it for nothing."""
    payload = os.urandom(8 << 20)
    server = Server("127.0.0.1")
    relay = StallingRelay(("127.0.0.1", _model(server).port))
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        served = ServedTransport.of(relay.via(_model(server)), "m", 1,
                                    server.keep_payload("m", 1, payload))
        assert served.read_range(1 << 20, 2 << 20) == payload[1 << 20:2 << 20]
        assert served.read_range(0, 100) == payload[:100]
        assert relay.count == 2
        assert (1 << 20) <= relay.passed[0] < (1 << 20) + (64 << 10), relay.passed
        assert relay.passed[1] < 64 << 10, relay.passed
        out = io.BytesIO()
        assert channel_client.download(_model(server, "m"), "m", 1, out, start=5, stop=5) == 0
    finally:
        relay.close()
        server.close()


def test_a_slow_reader_is_kept_while_it_makes_progress(monkeypatch):
    """A reader that takes the answer steadily but slowly (1 MB/s, here against a 0.2 s
    timeout, the driver's 30 s scaled down) takes much longer than the timeout in all:
    it gets the whole payload. The timeout used to bound each 256 KiB chunk, so such a
    reader was dropped once the kernel's buffers were full (about 3 MB in)."""
    monkeypatch.setattr(socket_io, "WRITE_TIMEOUT", 0.2)
    payload = os.urandom(6 << 20)  # more than the kernel's socket buffers hold
    server = Server("127.0.0.1")
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        server.keep_payload("m", 1, payload)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        raw.connect(("127.0.0.1", _model(server).port))
        with context.wrap_socket(raw) as sock:
            sock.settimeout(10)
            sock.sendall(b"GET /payload?name=m&index=1 HTTP/1.1\r\nX-Spark-Keras-Token: %s"
                         b"\r\n\r\n" % _model(server).token.encode())
            answer, started = bytearray(), time.monotonic()
            while data := sock.recv(4096):
                answer += data
                time.sleep(len(data) / 1e6)
        assert answer.endswith(payload), (len(answer), len(payload))
        assert time.monotonic() - started > 10 * socket_io.WRITE_TIMEOUT
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        raw.connect(("127.0.0.1", _model(server).port))
        with context.wrap_socket(raw) as stalled:  # a reader that takes nothing is dropped
            stalled.sendall(b"GET /payload?name=m&index=1 HTTP/1.1\r\nX-Spark-Keras-Token: %s"
                            b"\r\n\r\n" % _model(server).token.encode())
            deadline = time.monotonic() + 10
            while server._channel.connections() == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            while server._channel.connections() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server._channel.connections() == 0
            stalled.settimeout(10)
            received = 0
            while data := stalled.recv(65536):
                received += len(data)
            assert received < len(payload)  # cut short: the driver let it go
    finally:
        server.close()


def test_a_network_error_of_a_source_is_not_a_local_write_error(tmp_path):
    """A source that fails with a network error (here a reset, raised as it is) after
    writing part of the payload: the error is its own, not the folder's; nothing is
    published; the model is not built from a private copy."""
    payload = sk.dumps(models.mlp(name="net1"))

    def write(f):
        f.write(payload[:100])
        raise ConnectionResetError(104, "Connection reset by peer")

    folder = str(tmp_path / "host")
    with pytest.raises(ConnectionResetError):
        host_file.land(folder, "k", len(payload), write=write)
    assert sorted(os.listdir(folder)) == ["k.skp.lock"]  # nothing published, no temporary
    fallbacks = []
    with pytest.raises(ConnectionResetError):
        Shipment(b"", b"").build_shared(folder, "k", len(payload), write=write,
                                        fallback=lambda: fallbacks.append(1) or payload)
    assert fallbacks == []
    blocked = tmp_path / "a-file"  # a real local failure still is the folder's
    blocked.write_bytes(b"")
    with pytest.raises(LocalWriteError):
        host_file.land(str(blocked), "k", 3, write=lambda f: f.write(b"abc"))


def test_a_digest_mismatch_is_refused_before_the_file_is_published(tmp_path):
    payload = sk.dumps(models.mlp(name="mismatch1"))
    server = Server("127.0.0.1")
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        kept = server.keep_payload("m", 1, payload)
        served = ServedTransport(_model(server), "m", 1, "0" * 64)
        folder = str(tmp_path / "host")
        with pytest.raises(PayloadError, match=r"model m version 1 .* not 0{64}"):
            host_file.land(folder, "m", len(payload), write=served.write)
        assert sorted(os.listdir(folder)) == ["m.skp.lock"]
        with pytest.raises(PayloadError):
            served.read()
        assert ServedTransport.of(_model(server), "m", 1, kept).read() == payload
    finally:
        server.close()


def test_an_executor_file_replaced_after_it_was_written_is_refused_at_build(tmp_path, monkeypatch):
    """The executor's payload file of a version served from the driver, replaced (a new
    file) or altered in place after the first worker wrote it, by a sound payload of the
    same size with other weights: a worker that builds from it refuses it, naming the
    file and both digests, instead of scoring with those weights. The sound file is
    hashed once per process (not at each build); a damaged one is still written again."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))  # this process as an executor's worker
    model = models.mlp(n_features=8, hidden=16, name="swap1")
    payload = sk.dumps(model)
    forged = _same_size_other_weights(model)
    assert len(forged) == len(payload) and forged != payload
    x = np.random.default_rng(6).standard_normal((4, 8), dtype=np.float32)
    server = Server("127.0.0.1")
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        served = ServedTransport.of(_model(server), "m", 1, server.keep_payload("m", 1, payload))
        recipe = Shipment(b"", b"")

        def predictions():
            built, _, _ = served.build(recipe, "swap1", len(payload), share_weights=True)
            return predictor_for(built)([x], 16)[0].reshape(-1)

        expected = _expected(model, x)
        np.testing.assert_allclose(predictions(), expected, rtol=1e-5, atol=1e-6)  # written
        path = host_file.path_for(executor_folder(), "swap1")
        assert host_file._verified[path] == host_file._stamp(path)  # written here: checked
        np.testing.assert_allclose(predictions(), expected, rtol=1e-5, atol=1e-6)  # found
        (tmp_path / "forged").write_bytes(forged)
        os.replace(tmp_path / "forged", path)  # a new file
        with pytest.raises(PayloadError, match=f"payload file {path} of model m version 1 has "
                                               f"sha256 [0-9a-f]{{64}}, not {served.sha256}"):
            predictions()
        with open(path, "r+b") as f:  # the good bytes back in place, then altered in place
            f.write(payload)
        np.testing.assert_allclose(predictions(), expected, rtol=1e-5, atol=1e-6)
        with open(path, "r+b") as f:
            f.write(forged)
        with pytest.raises(PayloadError, match="replaced or altered on this executor"):
            predictions()
        damaged = bytearray(payload)
        damaged[-100] ^= 0xFF
        with open(path, "r+b") as f:  # bit rot: not a payload that loads, so written again
            f.write(bytes(damaged))
        np.testing.assert_allclose(predictions(), expected, rtol=1e-5, atol=1e-6)
        with open(path, "rb") as f:
            assert f.read() == payload
    finally:
        server.close()


def test_the_executors_payload_files_are_the_owners_alone(tmp_path, monkeypatch):
    """A served version's payload lands in the executor's folder as the owner's alone
    (folder 0700, the file, its lock and users files 0600: the executor's workers all
    run as its user), whatever the umask lets through; a model saved by the user keeps
    the umask's mode."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    model = models.mlp(n_features=8, hidden=16, name="mode1")
    payload = sk.dumps(model)
    server = Server("127.0.0.1")
    umask = os.umask(0o022)
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        served = ServedTransport.of(_model(server), "m", 1, server.keep_payload("m", 1, payload))
        served.build(Shipment(b"", b""), "mode1", len(payload), share_weights=True)
        folder = executor_folder()
        modes = {name: os.stat(os.path.join(folder, name)).st_mode & 0o777
                 for name in os.listdir(folder)}
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert modes == {"mode1.skp": 0o600, "mode1.skp.lock": 0o600, "mode1.skp.users": 0o600}
        sk.save(model, tmp_path / "saved.skp")
        assert os.stat(tmp_path / "saved.skp").st_mode & 0o777 == 0o644
    finally:
        os.umask(umask)
        server.close()


# --- a slow driver: one version per action --------------------------------------------------

def _scoring(handle):
    """An RDD function scoring with ``handle``, under a 1 s channel timeout (restored:
    the worker process is reused), giving ``(id, label, prediction)`` per row."""
    def score(rows):
        saved = channel_client.TIMEOUT
        channel_client.TIMEOUT = 1.0
        try:
            rows = list(rows)
            labels = {handle.version}
            predictions = list(handle.predict_partition([r[1] for r in rows]))
            labels.add(handle.version)
            label = labels.pop() if len(labels) == 1 else "mixed"
            return [(r[0], label, float(p)) for r, p in zip(rows, predictions)]
        finally:
            channel_client.TIMEOUT = saved
    return score


def test_a_slow_driver_gives_one_version_for_the_whole_action(spark):
    """The first request of an action stalls past the timeout: the worker asks again
    and every row is scored by the current version, for a plan made before the update
    (which used to fall back to its own version for that task alone) and after it (which
    used to fail with 'cannot reach the driver')."""
    x = np.random.default_rng(4).standard_normal((32, 8), dtype=np.float32)
    rows = list(enumerate(x.tolist()))
    v1, v2 = models.mlp(name="slow1"), models.mlp(name="slow2")
    bm = sk.BroadcastModel(spark, v1, ship="driver")  # a copy of it can be pickled here
    address = bm._versions
    relay = StallingRelay((address.host, address.port), stall_for=3.0)
    try:
        bm._versions = relay.via(address)  # what the plans carry
        before = pickle.loads(pickle.dumps(bm))  # a plan made before the update
        assert before._planned == 1
        bm.update(v2)
        for handle in (before, bm):
            relay.reset_count()
            relay.stall, relay.stalled = {0}, 0
            got = sorted(spark.sparkContext.parallelize(rows, 4).mapPartitions(_scoring(handle))
                         .collect())
            assert relay.stalled == 1
            assert {label for _, label, _ in got} == {"2"}, got
            np.testing.assert_allclose([p for _, _, p in got], _expected(v2, x), rtol=1e-5, atol=1e-6)
    finally:
        relay.close()
        bm._versions = address
        bm.destroy()


def _opted_in(address: Address) -> Address:
    """``address`` as a driver with ``SPARK_KERAS_UNREACHABLE_DRIVER=plan`` gives it."""
    return Address((*address[:4], True))


def test_refused_connections_fail_the_task_never_score_the_plans_version(spark):
    """Something on the path answers one worker's connections to the driver with resets
    (the relay stops listening: the kernel refuses them). A DataFrame planned before
    update() used to score with its plan's version 1 on that worker while the others
    scored 2 (two versions in one action); the task now fails, naming the driver and the
    settings, and no row is scored. Once connections pass again, the same plan's next
    action scores every row with version 2."""
    x = np.random.default_rng(5).standard_normal((16, 8), dtype=np.float32)
    rows = list(enumerate(x.tolist()))
    v1, v2 = models.mlp(name="forged1"), models.mlp(name="forged2")
    bm = sk.BroadcastModel(spark, v1, ship="driver")
    address = bm._versions
    relay = StallingRelay((address.host, address.port))
    try:
        bm._versions = relay.via(address)
        before = pickle.loads(pickle.dumps(bm))  # a plan made before the update
        bm.update(v2)
        relay.refuse()
        with pytest.raises(Exception) as caught:
            spark.sparkContext.parallelize(rows, 2).mapPartitions(_scoring(before)).collect()
        message = str(caught.value)
        assert "cannot reach the driver" in message and "SPARK_KERAS_DRIVER_HOST" in message
        assert "SPARK_KERAS_UNREACHABLE_DRIVER=plan" in message
        relay.admit()
        got = sorted(spark.sparkContext.parallelize(rows, 2).mapPartitions(_scoring(before))
                     .collect())
        assert {label for _, label, _ in got} == {"2"}, got
        np.testing.assert_allclose([p for _, _, p in got], _expected(v2, x), rtol=1e-5, atol=1e-6)
    finally:
        relay.close()
        bm._versions = address
        bm.destroy()


def test_a_driver_that_does_not_answer_is_told_from_one_that_cannot_be_reached(spark, monkeypatch):
    """A driver that never answers in time: after the wait, 'did not answer within', not
    the unreachable driver's advice about SPARK_KERAS_DRIVER_HOST. A driver that cannot
    be reached: the task fails, and asks again when retried; with the driver's opt-in,
    the plan's version, kept for the scope even once it answers again."""
    monkeypatch.setattr(channel_client, "TIMEOUT", 0.5)
    monkeypatch.setattr(task_version, "SLOW_DRIVER_WAIT", 2.0)
    bm = sk.BroadcastModel(spark, models.mlp(name="mute1"), ship="driver")
    address = bm._versions
    relay = StallingRelay((address.host, address.port), stall=set(range(100)), stall_for=5.0)
    try:
        before = pickle.loads(pickle.dumps(bm))
        bm.update(models.mlp(name="mute2"))
        after = pickle.loads(pickle.dumps(bm))
        after._versions = relay.via(address)
        with pytest.raises(SparkKerasError, match="did not answer .* within") as caught:
            task_version.version_for(after, "sql:900001")
        assert "SPARK_KERAS_DRIVER_HOST" not in str(caught.value)
        assert relay.count >= 2  # asked again
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]
        before._versions = Address(("127.0.0.1", closed, address.token, address.fingerprint))
        with pytest.raises(ChannelError, match="cannot reach the driver .*task fails"):
            task_version.version_for(before, "sql:900004")
        before._versions = address  # reached again (Spark's retry): the current version
        assert task_version.version_for(before, "sql:900004")._version == "2"
        before._versions = _opted_in(Address(("127.0.0.1", closed, *address[2:4])))
        assert task_version.version_for(before, "sql:900002") is before  # the plan's version
        before._versions = _opted_in(address)  # it answers again: the scope keeps its version
        assert task_version.version_for(before, "sql:900002") is before
        assert task_version.version_for(before, "sql:900003")._version == "2"
    finally:
        relay.close()
        bm.destroy()


def test_a_port_that_drops_connections_is_unreachable_not_slow(monkeypatch):
    """A port whose connections time out (a firewall dropping them: here a listener whose
    queue is full) is a driver that cannot be reached, not a slow one: the task fails at
    once, not after a wait of SLOW_DRIVER_WAIT; with the driver's opt-in, the plan's
    version at once (kept for the scope)."""
    import types

    monkeypatch.setattr(channel_client, "TIMEOUT", 0.5)
    monkeypatch.setattr(task_version, "SLOW_DRIVER_WAIT", 30.0)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):  # fills its queue: later SYNs dropped
            handle = types.SimpleNamespace(_name="dropped", _planned=1,
                                           _versions=Address(("127.0.0.1", port, "t", "0" * 64)))
            started = time.monotonic()
            with pytest.raises(ChannelError, match="cannot reach the driver"):
                task_version.version_for(handle, "sql:900010")
            assert time.monotonic() - started < 10.0
            assert ("dropped", "sql:900010") not in task_version._chosen  # asked again
            handle._versions = _opted_in(handle._versions)
            started = time.monotonic()
            assert task_version.version_for(handle, "sql:900011") is handle
            assert time.monotonic() - started < 10.0
            assert task_version._chosen[("dropped", "sql:900011")] is None  # kept


# --- across executors, with Spark's own security on ----------------------------------------

_NEW_OBJECTS_ACROSS_EXECUTORS = textwrap.dedent("""
    import numpy as np, sys, keras
    from pyspark.sql import SparkSession
    import spark_keras as sk
    from spark_keras.inference import predictor_for
    from tests import models

    class Triple(keras.layers.Layer):  # in this script's __main__: no executor imports it
        def call(self, t):
            return t * 3.0

    if __name__ == "__main__":
        spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
                 .config("spark.authenticate", "true")
                 .config("spark.authenticate.secret", "a-shared-secret-for-this-test")
                 .config("spark.network.crypto.enabled", "true")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.ui.enabled", "false")
                 .config("spark.pyspark.python", sys.executable)
                 .config("spark.executorEnv.PYTHONPATH", "{root}")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        x = np.random.default_rng(0).standard_normal((40, 8), dtype=np.float32)
        df = spark.createDataFrame([(i, x[i].tolist()) for i in range(40)],
                                   "id long, features array<float>").repartition(8)
        v2 = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                               keras.layers.Dense(1), Triple()])
        bm = sk.BroadcastModel(spark, models.mlp(name="across1"))
        scored = bm.transform(df, "features", version_col="v")
        assert set(scored.toPandas().v) == {{"1"}}
        bm.update(v2)
        assert isinstance(bm._schedule.versions[2].source["objects"], str)
        got = scored.toPandas().sort_values("id")
        assert set(got.v) == {{"2"}}
        np.testing.assert_allclose(got.prediction.to_numpy(np.float32),
                                   predictor_for(v2)([x], 1024)[0].reshape(-1), rtol=1e-5, atol=1e-6)
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        assert executors == 2, executors
        bm.destroy()
        spark.stop()
        print("ACROSS OK")
""")


@pytest.mark.slow  # a cluster of its own: 1-4 min
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_new_custom_objects_reach_other_executors_through_sparks_authenticated_files(tmp_path):
    """On a local cluster (executors in JVMs of their own) with spark.authenticate and
    network encryption on: an update whose class only the driver's ``__main__`` defines
    reaches both executors through Spark's file server, and a DataFrame planned before
    the update scores every row with it, exactly."""
    run_script(tmp_path, _NEW_OBJECTS_ACROSS_EXECUTORS.format(root=REPO_ROOT), "ACROSS OK",
               timeout=400)
