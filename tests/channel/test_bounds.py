"""What the driver's channel keeps, and for how long, under load (issue 43's review): a
real server on 127.0.0.1, real TLS, real schedules.

* Pins: a streaming query's micro-batches take one pin, the others go least recently
  asked first, and a worker keeps the answer of a scope it uses: an action is scored by
  one version however many micro-batches and actions ask meanwhile.
* Pool: a slow check of a watched model file runs in a thread of its own: every other
  model's requests, and the other requests of its own model, are answered meanwhile.
* Overflow: at the cap, connections that do not show the token at once keep no place.
* Copies: the driver deletes a version's copy once it is neither current nor pinned.
"""

from __future__ import annotations

import collections
import io
import os
import socket
import threading
import time
import types

import pytest

from spark_keras.channel import answers as channel_answers
from spark_keras.channel import client as channel_client
from spark_keras.channel import server as channel_server
from spark_keras.channel import versions
from spark_keras.channel.client import ask, download
from spark_keras.channel.version_server import Server
from spark_keras.channel.versions import Schedule, Version
from spark_keras.errors import SparkKerasError
from spark_keras.executor import task_version
from tests.channel.test_security import _hold_the_cap, _model, blind  # noqa: F401 (a fixture)


@pytest.fixture
def server():
    server = Server("127.0.0.1")
    yield server
    server.close()


# --- pins -----------------------------------------------------------------------------


def test_a_long_action_keeps_its_version_while_a_stream_and_other_actions_ask(monkeypatch):
    """A long action pinned to version 1; a streaming query with frequent triggers asks
    for many more micro-batches than MAX_PINS (here 20), and other actions ask, the
    action's tasks among them: after an update, its later tasks still get version 1.
    Only a scope nobody asked for while MAX_PINS others were asked loses its pin."""
    monkeypatch.setattr(versions, "MAX_PINS", 20)
    schedule = Schedule(Version(1, "1", "m", 3))
    assert schedule.pin("sql:spark1:1").label == "1"
    for batch in range(1000):  # one query: each micro-batch replaces its earlier one
        assert schedule.pin(f"stream:q:{batch}").label == "1"
    schedule.add(Version(2, "2", "m.v2", 3))
    assert schedule.pin("sql:spark1:1").label == "1"
    assert schedule.pin("stream:q:999").label == "1"  # the query's latest, run again
    assert schedule.pin("stream:q:3").label == "2"  # a straggler of a done one: current
    assert [v.label for v in schedule.released()] == []  # the query's latest holds 1
    assert schedule.pin("stream:q:1000").label == "2"
    assert [v.label for v in schedule.released()] == ["1"]  # batch 999 is done
    for n in range(2, 100):  # other actions; the long one's tasks keep asking
        assert schedule.pin(f"sql:spark1:{n}").label == "2"
        if n % 10 == 0:
            assert schedule.pin("sql:spark1:1").label == "1"
    assert schedule.pin("sql:spark1:1").label == "1"
    schedule.add(Version(3, "3", "m.v3", 3))
    assert schedule.pin("sql:spark1:99").label == "2"  # asked lately: kept
    assert schedule.pin("sql:spark1:2").label == "3"  # asked by none of 20 later: gone


def test_a_worker_keeps_the_answer_of_a_scope_it_uses(server, monkeypatch):
    """A worker's answers are kept least recently used first (here 5): a scope whose
    tasks keep running here is never asked of the driver again, however many other
    scopes come and go (the driver, which forgot handle "live", would answer 404);
    one unused while 5 others were used is asked again."""
    monkeypatch.setattr(task_version, "_MAX_CHOSEN", 5)
    monkeypatch.setattr(task_version, "_chosen", collections.OrderedDict())
    for name in ("live", "other"):
        server.register(name, Schedule(Version(1, "1", name, 3)))
    live = types.SimpleNamespace(_name="live", _versions=_model(server, "live"), _planned=1)
    other = types.SimpleNamespace(_name="other", _versions=_model(server, "other"), _planned=1)
    assert task_version.version_for(live, "sql:1") is live
    server.forget("live")  # asked again from now on, it answers 404
    for n in range(2, 30):
        assert task_version.version_for(other, f"sql:{n}") is other
        assert task_version.version_for(live, "sql:1") is live  # from this worker's answers
    for n in range(30, 35):
        task_version.version_for(other, f"sql:{n}")
    with pytest.raises(SparkKerasError, match="404"):
        task_version.version_for(live, "sql:1")


# --- the answering pool -------------------------------------------------------------------


@pytest.mark.usefixtures("blind")
def test_a_slow_check_of_a_watched_file_holds_no_other_answer(server, monkeypatch):
    """Model A's watched file takes long to read (the check waits until released: slow
    storage) while six new actions of A ask, more than the pool's threads: model B's
    /resolve and /payload are answered at once, and so is A's pinned scope; A's new
    scopes get the current version after CHECK_WAIT (lowered to 1 s), the check running
    once; the version it ships is what the next scope gets."""
    monkeypatch.setattr(channel_client, "TIMEOUT", 3.0)
    monkeypatch.setattr(channel_answers, "CHECK_WAIT", 1.0)
    changed, storage_answers, runs = threading.Event(), threading.Event(), []
    a = Schedule(Version(1, "1", "A", 3))

    def check():  # a watched file's check: once changed, read slowly and shipped
        runs.append(time.monotonic())
        if changed.is_set():
            storage_answers.wait(30)
            a.add(Version(2, "2", "A.v2", 3, {"sha256": "0" * 64}))

    server.register("A", a, check)
    server.register("B", Schedule(Version(1, "1", "B", 3)))
    server.keep_payload("B", 1, b"xyz")
    assert ask(_model(server, "A"), "A", "sql:1")["version"]["label"] == "1"  # unchanged: quick
    changed.set()
    runs.clear()
    answers: dict[str, str] = {}
    askers = [threading.Thread(target=lambda n=n: answers.update(
        {n: ask(_model(server, "A"), "A", f"sql:{100 + n}")["version"]["label"]})) for n in range(6)]
    try:
        for asker in askers:
            asker.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert ask(_model(server, "B"), "B", "sql:2")["version"]["label"] == "1"
        out = io.BytesIO()
        assert download(_model(server, "B"), "B", 1, out) == 3 and out.getvalue() == b"xyz"
        assert ask(_model(server, "A"), "A", "sql:1")["version"]["label"] == "1"
        assert time.monotonic() - started < 1.0
        for asker in askers:
            asker.join(5)
        assert answers == {n: "1" for n in range(6)}  # the current version meanwhile
        assert len(runs) == 1  # one check at a time
    finally:
        storage_answers.set()
    deadline = time.monotonic() + 5
    while a.pin(None).label != "2" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ask(_model(server, "A"), "A", "sql:200")["version"]["label"] == "2"
    assert ask(_model(server, "A"), "A", "sql:100")["version"]["label"] == "1"  # kept its own


# --- overflow places ----------------------------------------------------------------------


def test_silent_connections_at_the_cap_keep_no_overflow_place(monkeypatch):
    """Every place taken by readers of a large payload (a cap of 8: 2 overflow places),
    8 connections that open TCP and send nothing (no TLS, no token) wait ahead of a real
    /resolve in the listen backlog: each used to hold an overflow place for the whole
    OVERFLOW_TIMEOUT (5 s: the request came after 20 s); now one that has not shown a
    request head with the token at once is dropped for the next, and the request is
    answered within a few seconds (its client's timeout lowered to 6 s)."""
    monkeypatch.setattr(channel_server, "MAX_CONNECTIONS", 8)
    monkeypatch.setattr(channel_client, "TIMEOUT", 6.0)
    payload = os.urandom(16 << 20)  # more than the kernel's socket buffers hold
    server = Server("127.0.0.1")
    readers, silent = [], []
    try:
        assert (server._channel.cap, server._channel.overflow_cap) == (8, 2)
        server.register("m", Schedule(Version(1, "1", "m", len(payload))))
        server.keep_payload("m", 1, payload)
        readers = _hold_the_cap(server)
        for _ in range(8):
            silent.append(socket.create_connection(("127.0.0.1", _model(server).port)))
        time.sleep(0.2)
        started = time.monotonic()
        assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"
        assert time.monotonic() - started < 5.0
        for sock in silent[:4]:  # the first ones were taken and dropped: closed
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        for sock in readers + silent:
            sock.close()
        server.close()


# --- the driver's copies ------------------------------------------------------------------


def _copies(server: Server, name: str = "m") -> list[str]:
    """The driver's copies of model ``name``'s versions."""
    return sorted(f for f in os.listdir(server._folder)
                  if f.startswith(f"{name}.") and f.endswith(".skp"))


@pytest.mark.usefixtures("blind")
def test_a_versions_copy_goes_once_it_is_neither_current_nor_pinned(server, monkeypatch):
    """Nineteen versions shipped while a micro-batch and an action hold version 1: the
    driver keeps the copies of 1 and of the current one only. The query's next
    micro-batch and the action's pin going (MAX_PINS lowered to 2) delete 1's; a
    download of a deleted copy says so."""
    monkeypatch.setattr(versions, "MAX_PINS", 2)
    schedule = Schedule(Version(1, "1", "m", 2))
    server.register("m", schedule)
    server.keep_payload("m", 1, b"v1")
    assert ask(_model(server, "m"), "m", "stream:q:0")["version"]["index"] == 1
    assert ask(_model(server, "m"), "m", "sql:1")["version"]["index"] == 1
    for index in range(2, 20):
        server.keep_payload("m", index, b"v%d" % index)
        schedule.add(Version(index, str(index), f"m.v{index}", 3, {"sha256": "0" * 64}))
    assert _copies(server) == ["m.1.skp", "m.19.skp"]
    assert ask(_model(server, "m"), "m", "stream:q:1")["version"]["index"] == 19
    assert _copies(server) == ["m.1.skp", "m.19.skp"]  # the action sql:1 holds 1
    assert ask(_model(server, "m"), "m", "sql:2")["version"]["index"] == 19  # sql:1's pin goes
    assert _copies(server) == ["m.19.skp"]
    with pytest.raises(SparkKerasError, match="copy of version 5 of model m is missing .*"
                                              "neither current nor pinned"):
        download(_model(server, "m"), "m", 5, io.BytesIO())
    out = io.BytesIO()
    assert download(_model(server, "m"), "m", 19, out) == 3 and out.getvalue() == b"v19"


def test_updates_leave_the_driver_one_copy_when_no_scope_holds_the_old_ones(spark):
    """A real handle shipped from the driver, updated five times without a job: one
    copy left, the current version's (there were six)."""
    import spark_keras as sk
    from tests import models

    bm = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8, name="c1"), ship="driver")
    try:
        for n in range(2, 7):
            bm.update(models.mlp(n_features=4, hidden=8, name=f"c{n}"))
        assert _copies(bm._server, bm._name) == [f"{bm._name}.6.skp"]
    finally:
        bm.destroy()


# --- the second review of these bounds ----------------------------------------------------


def test_a_micro_batch_run_again_below_its_querys_latest_keeps_one_version():
    """A query restarted in this driver from an older checkpoint runs batch 7 after batch
    10 asked: batch 7 is pinned like any scope (it was answered the current version and
    never pinned: an update during it gave its tasks two versions); a scope spelled with
    a leading zero is not a scope the workers send, and is refused."""
    schedule = Schedule(Version(1, "1", "m.v1", 4))
    schedule.pin("stream:q:10")
    first = schedule.pin("stream:q:7").index
    schedule.add(Version(2, "2", "m.v2", 4, {"x": 2}))
    assert (first, schedule.pin("stream:q:7").index) == (1, 1)
    assert schedule.pin("stream:q:11").index == 2  # the query going on supersedes batch 10
    assert channel_answers._SCOPE.fullmatch("stream:q:7") and channel_answers._SCOPE.fullmatch("sql:0")
    assert not channel_answers._SCOPE.fullmatch("stream:q:07")
    assert not channel_answers._SCOPE.fullmatch("sql:007")


def test_at_the_cap_a_new_scope_is_answered_without_waiting_for_a_slow_check(monkeypatch):
    """Every place held by readers (a cap of 8) while the watched file's check takes 20 s:
    a new scope's /resolve, an overflow connection (5 s in all), used to wait CHECK_WAIT
    (5 s; 2 s here) for the check and be dropped unanswered; it is answered the current version at
    once, and waiters of a check that hangs leave no callback on it behind."""
    monkeypatch.setattr(channel_server, "MAX_CONNECTIONS", 8)
    wait = 2.0  # CHECK_WAIT, 5 s in the server: four waits of it below
    monkeypatch.setattr(channel_answers, "CHECK_WAIT", wait)
    payload = os.urandom(16 << 20)
    server = Server("127.0.0.1")
    readers: list = []
    release = threading.Event()
    try:
        server.register("m", Schedule(Version(1, "1", "m", len(payload))),
                        lambda: release.wait(20))
        server.keep_payload("m", 1, payload)
        assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"  # waits
        readers = _hold_the_cap(server)
        started = time.monotonic()  # an overflow connection's own cost at this load
        assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"  # pinned
        connection = time.monotonic() - started
        started = time.monotonic()
        assert ask(_model(server, "m"), "m", "sql:2")["version"]["label"] == "1"
        assert time.monotonic() - started < connection + 0.5 * wait, connection
        for reader in readers:
            reader.close()
        readers = []
        for i in range(3):  # below the cap: each waits CHECK_WAIT, the check still hung
            ask(_model(server, "m"), "m", f"sql:{10 + i}")
        running = server._boundaries["m"]._running
        assert running is not None and not running.done()
        assert len(running._done_callbacks) <= 2, running._done_callbacks  # not one per request
    finally:
        release.set()
        for reader in readers:
            reader.close()
        server.close()
