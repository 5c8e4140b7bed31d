"""BroadcastModel's versions and lifecycle (review issue 42, items 9-14; issue 43, item 7):
unique labels, concurrent updates, versions released after ``unpersist()``, refused calls
that leave no file, a watched file read again after a failure, and the driver's copies,
server thread and port released with the handle and with Spark, on real local Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.channel import version_server
from spark_keras.inference import predictor_for
from tests import models
from tests.conftest import DAEMON, REPO_ROOT
from tests.spark.test_streaming import executor_state


def _frame(spark, x):
    return spark.createDataFrame([(i, x[i].tolist()) for i in range(len(x))],
                                 "id long, features array<float>")


def _scored(bm, df) -> tuple[set, np.ndarray]:
    """The labels of ``version_col`` and the predictions, by id."""
    got = bm.transform(df, "features", version_col="v").toPandas().sort_values("id")
    return set(got.v), got.prediction.to_numpy(np.float32)


def _predictions(model, x):
    return predictor_for(model)([x], 1024)[0].reshape(-1)


def _folder_files() -> set[str]:
    server = version_server._server
    folder = None if server is None else server._folder
    return set(os.listdir(folder)) if folder and os.path.isdir(folder) else set()


# --- item 9: labels ---------------------------------------------------------------------

def test_default_labels_skip_the_labels_taken(spark):
    """update(version="3") then update(): "4", not a second "3"; an explicit label taken
    is refused, naming it."""
    model = models.mlp(n_features=4, hidden=8)
    bm = sk.BroadcastModel(spark, model)
    try:
        assert bm.update(model, version="3") == "3"
        assert bm.update(model) == "4"
        with pytest.raises(sk.ArgumentError, match="version '4' was shipped already"):
            bm.update(model, version="4")
        assert bm._schedule.labels() == ["1", "3", "4"] and bm.version == "4"
    finally:
        bm.destroy()


def test_a_watched_file_gets_a_label_not_taken(spark, tmp_path):
    """A handle whose first label is "2": the file replaced is adopted as "3", and
    version_col tells the two models' rows apart."""
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"l{i}") for i in (1, 2))
    x = np.random.default_rng(0).standard_normal((12, 4), dtype=np.float32)
    path = tmp_path / "current.skp"
    sk.save(v1, path)
    bm = sk.BroadcastModel(spark, path.as_uri(), version="2", refresh=0)
    try:
        df = _frame(spark, x)
        labels, _ = _scored(bm, df)
        assert labels == {"2"}
        sk.save(v2, tmp_path / "next.skp")
        os.replace(tmp_path / "next.skp", path)
        labels, predictions = _scored(bm, df)
        assert labels == {"3"} and bm.version == "3"
        np.testing.assert_allclose(predictions, _predictions(v2, x), rtol=1e-5, atol=1e-6)
        assert bm._schedule.labels() == ["2", "3"]
    finally:
        bm.destroy()


# --- item 10: concurrent updates --------------------------------------------------------

def test_concurrent_updates_get_distinct_labels_and_none_is_lost(spark):
    n = 8
    candidates = [models.mlp(n_features=4, hidden=8, name=f"c{i}") for i in range(n)]
    bm = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8))
    start = threading.Barrier(n)
    labels: list[str] = []
    errors: list[BaseException] = []

    def update(model):
        try:
            start.wait()
            labels.append(bm.update(model))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=update, args=(m,)) for m in candidates]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        schedule = bm._schedule
        assert len(labels) == len(set(labels)) == n, labels
        assert sorted(schedule.labels()) == sorted(["1", *labels])
        assert len(schedule.versions) == n + 1  # no update lost
        assert schedule.versions[schedule.current].label == bm.version
        current = bm._server.payload_path(bm._name, schedule.current)  # under its number
        assert os.path.isfile(current) and current.endswith(f".{schedule.current}.skp")
        kept = [f for f in os.listdir(os.path.dirname(current)) if f.startswith(f"{bm._name}.")]
        assert kept == [os.path.basename(current)]  # the others, unused, were deleted
    finally:
        bm.destroy()


# --- item 12: unpersist, then update ------------------------------------------------------

def test_version_1_is_released_in_the_workers_after_unpersist_and_update(spark):
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"p{i}") for i in (1, 2))
    x = np.random.default_rng(1).standard_normal((16, 4), dtype=np.float32)
    df = _frame(spark, x).repartition(8)
    bm = sk.BroadcastModel(spark, v1)
    try:
        _scored(bm, df)
        bm.unpersist()
        _scored(bm, df)  # built again under the new key
        renewed = f"{bm._name}.1"
        assert bm.key == renewed
        assert any(renewed in s["keys"] for s in executor_state(spark).values())
        assert bm.update(v2) == "2"
        labels, _ = _scored(bm, df)  # the workers that ask learn version 1 is released
        assert labels == {"2"}
        state = executor_state(spark)
        asked = [pid for pid, s in state.items() if f"{bm._name}.v2" in s["keys"]]
        assert asked, state
        for pid in asked:
            assert not [k for k in state[pid]["keys"] if k.startswith(renewed)], state[pid]
        files = {f for s in state.values() for f in s["files"]}
        assert not [f for f in files if f.startswith(renewed + ".")], files
    finally:
        bm.destroy()


# --- item 13: refused calls leave no file ---------------------------------------------------

def test_a_refused_constructor_leaves_no_file_and_no_entry(spark):
    model = models.mlp(n_features=4, hidden=8)
    before = _folder_files()
    names = set(version_server._server._schedules) if version_server._server else set()
    with pytest.raises(sk.ArgumentError, match="refresh= watches a model file given as a URI"):
        sk.BroadcastModel(spark, model, ship="driver", refresh=5)
    assert _folder_files() == before
    server = version_server._server
    assert server is None or (set(server._schedules) == names
                              and not [k for k in server._payloads if k[0] not in names])


# --- issue 43, item 7: a watched file read again after a failure ------------------------------

def test_a_watched_file_is_adopted_after_a_failed_read_and_a_failed_write(spark, tmp_path):
    """A read that fails (the bytes read were damaged) and a copy the driver could not
    write (its folder gone a moment) leave the new file to the next check, which adopts
    it; neither records the file as seen."""
    v1, v2, v3 = (models.mlp(n_features=4, hidden=8, name=f"r{i}") for i in (1, 2, 3))
    x = np.random.default_rng(2).standard_normal((12, 4), dtype=np.float32)
    path = tmp_path / "current.skp"
    sk.save(v1, path)
    bm = sk.BroadcastModel(spark, path.as_uri(), refresh=0)
    try:
        df = _frame(spark, x)
        assert _scored(bm, df)[0] == {"1"}
        # the read fails: a byte of the body damaged, then repaired, the stamp unchanged
        sk.save(v2, tmp_path / "v2.skp")
        good = (tmp_path / "v2.skp").read_bytes()
        damaged = bytearray(good)
        damaged[-1000] ^= 0xFF
        path.write_bytes(bytes(damaged))
        stamp = time.time_ns() - 10**9
        os.utime(path, ns=(stamp, stamp))
        assert _scored(bm, df)[0] == {"1"}  # refused by its digest: still version 1
        path.write_bytes(good)
        os.utime(path, ns=(stamp, stamp))  # same size, same time: only a retry sees it
        labels, predictions = _scored(bm, df)
        assert labels == {"2"}
        np.testing.assert_allclose(predictions, _predictions(v2, x), rtol=1e-5, atol=1e-6)
        # the driver's copy cannot be written: its folder is away for a moment
        folder = bm._server._folder
        sk.save(v3, tmp_path / "v3.skp")
        os.replace(tmp_path / "v3.skp", path)
        os.rename(folder, folder + ".away")
        try:
            assert _scored(bm, df)[0] == {"2"}
        finally:
            os.rename(folder + ".away", folder)
        labels, predictions = _scored(bm, df)
        assert labels == {"3"}
        np.testing.assert_allclose(predictions, _predictions(v3, x), rtol=1e-5, atol=1e-6)
        assert not [f for f in os.listdir(folder) if f.endswith(".part")]
    finally:
        bm.destroy()


# --- items 11 and 14: a new SparkContext; release with the handle and with Spark ----------------

_LIFECYCLE = r'''
import gc, json, os, socket, sys, threading, time
import numpy as np
from pyspark.sql import SparkSession
import spark_keras as sk
from spark_keras.inference import predictor_for
from spark_keras.channel import version_server
from tests import models

def session():
    spark = (SparkSession.builder.master("local[2]").appName("spark-keras-lifecycle")
             .config("spark.ui.enabled", "false")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.executorEnv.PYTHONPATH", os.environ["REPO_ROOT"])
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
             .config("spark.python.daemon.module", os.environ["DAEMON"]).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark

def until(condition, seconds=20.0):
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.05)
    return condition()

x = np.random.default_rng(0).standard_normal((8, 4), dtype=np.float32)
v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"s{i}") for i in (1, 2))

def scored(spark, bm):  # an RDD job: the scope of its tasks is its stage
    rdd = spark.sparkContext.parallelize(x.tolist(), 2)
    return np.array(rdd.mapPartitions(bm.predict_partition).collect(), np.float32).reshape(-1)

def exact(got, model):
    return bool(np.allclose(got, predictor_for(model)([x], 1024)[0].reshape(-1), rtol=1e-5, atol=1e-6))

def threads():
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("spark_keras"))

def refused(address):
    try:
        socket.create_connection(address[:2], timeout=2).close()
        return False
    except OSError:
        return True

def gone(server):
    return server.closed and not threads() and refused(server.where) and \
        not os.path.exists(server._folder)

out = {}
spark = session()
kept = sk.BroadcastModel(spark, v1, ship="driver")
dropped = sk.BroadcastModel(spark, v2, ship="driver")
server = version_server._server
out["first_context"] = all(exact(scored(spark, kept), v1) for _ in range(4))  # stages 0-3
copy, name = server.payload_path(dropped._name, 1), dropped._name
del dropped
gc.collect()
out["dropped_copy_removed"] = until(lambda: not os.path.exists(copy))
out["dropped_entry_removed"] = until(lambda: name not in server._schedules)
spark.stop()
out["kept_for_a_live_handle"] = not server.closed and bool(threads()) and not refused(server.where)

spark = session()  # a new SparkContext: its stages are numbered from 0 again
kept.update(v2)
out["new_context_scores_the_update"] = exact(scored(spark, kept), v2)
spark.stop()
out["kept_while_the_handle_lives"] = not server.closed
del kept
gc.collect()
out["closed_when_the_last_handle_goes"] = until(lambda: gone(server))

spark = session()
again = sk.BroadcastModel(spark, v1, ship="driver")
out["a_new_server"] = version_server._server is not server and exact(scored(spark, again), v1)
second = version_server._server
del again
gc.collect()
time.sleep(0.5)
out["kept_while_spark_runs"] = not second.closed and not refused(second.where)
spark.stop()
out["closed_when_spark_stops"] = until(lambda: gone(second))
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory) -> dict:
    """The lifecycle script's findings, from a fresh driver process of its own (three
    SparkContexts one after another)."""
    folder = tmp_path_factory.mktemp("lifecycle")
    script = folder / "lifecycle.py"
    script.write_text(_LIFECYCLE)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, REPO_ROOT=REPO_ROOT, DAEMON=DAEMON,
               TF_CPP_MIN_LOG_LEVEL="2", PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(script)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow  # a fresh driver and three SparkContexts: about a minute
def test_a_new_spark_context_scores_the_version_current_then(lifecycle):
    """Stages 0-3 pinned to version 1 in the first SparkContext; in the next one, whose
    stages start from 0 again, an RDD job after update() scores version 2."""
    assert lifecycle["first_context"]
    assert lifecycle["new_context_scores_the_update"], lifecycle


@pytest.mark.slow
def test_the_driver_releases_with_the_handle_and_with_spark(lifecycle):
    """A handle collected: its copy and entry go at once; the server (thread, port,
    folder) closes once no handle remains and Spark stopped, in either order; the next
    handle starts a new one."""
    released = {k: v for k, v in lifecycle.items()
                if k not in ("first_context", "new_context_scores_the_update")}
    assert len(released) == 8 and all(released.values()), lifecycle
