"""``BroadcastModel.update``: new model versions under running plans on real local Spark
(batch actions, and Structured Streaming queries with no restart), ``version_col``, a
watched model URI, and the release of old versions. The schedule that pins each
micro-batch to one version is tested on its own first."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.channel.scopes import scope_of
from spark_keras.channel.versions import Schedule, Version
from spark_keras.inference import predictor_for
from tests import models
from tests.channel.test_security import _model
from tests.conftest import builds_by_worker
from tests.spark.test_streaming import Source, executor_state

# --- the schedule (no Spark) ----------------------------------------------------------


def test_a_scope_keeps_the_version_it_was_first_given_and_old_versions_are_released():
    schedule = Schedule(Version(1, "1", "m", 10))
    q = "stream:q1:{}".format
    assert schedule.pin(q(0)).label == "1"
    schedule.add(Version(2, "2", "m.v2", 10))
    assert schedule.pin(q(0)).label == "1"  # a micro-batch run again keeps its version
    assert [v.label for v in schedule.released()] == []  # batch 0 may still run
    assert schedule.pin(q(1)).label == "2"
    assert [v.label for v in schedule.released()] == ["1"]  # batch 0 is done: 1 goes
    assert schedule.pin(q(0)).label == "2"  # a straggler of it: done, the current one
    assert schedule.pin("sql:7").label == "2" and schedule.pin(None).label == "2"
    schedule.add(Version(3, "blue", "m.v3", 10))
    assert schedule.pin("sql:7").label == "2" and schedule.pin("sql:8").label == "blue"
    assert [v.label for v in schedule.released()] == ["1"]  # query q1's batch 1 holds 2
    assert scope_of({"sql.streaming.queryId": "q", "streaming.sql.batchId": "3",
                     "spark.sql.execution.id": "9"}, 4) == "stream:q:3"
    assert scope_of({"spark.sql.execution.id": "9"}, 4) == "sql:9"
    assert scope_of({}, 4) == "stage:4" and scope_of({}, None) is None


def test_the_version_server_answers_only_those_with_its_token():
    import io

    from spark_keras.channel.client import Address, ask, download
    from spark_keras.channel.version_server import Server

    server = Server("127.0.0.1")
    try:
        server.register("m", Schedule(Version(1, "1", "m", 3)))
        server.keep_payload("m", 1, b"abc")
        assert ask(_model(server, "m"), "m", "sql:1")["version"]["label"] == "1"
        out = io.BytesIO()
        assert download(_model(server, "m"), "m", 1, out) == 3 and out.getvalue() == b"abc"
        stranger = Address((*_model(server)[:2], "not-the-token", *_model(server)[3:]))
        with pytest.raises(sk.SparkKerasError, match="refused /resolve: 403"):
            ask(stranger, "m", None)
        server.forget("m")  # destroyed
        with pytest.raises(sk.SparkKerasError, match="404"):
            ask(_model(server, "m"), "m", None)
    finally:
        server.close()


def test_a_worker_that_cannot_reach_the_driver_fails_unless_the_driver_opted_in():
    import socket
    import types

    from spark_keras.channel.client import Address
    from spark_keras.executor import task_version

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handle = types.SimpleNamespace(_name="lost", _versions=Address(("127.0.0.1", port, "t")),
                                   _planned=1)
    with pytest.raises(sk.ChannelError, match="task fails .*SPARK_KERAS_UNREACHABLE_DRIVER=plan"):
        task_version.version_for(handle, "sql:1")  # never another version than the others'
    handle._versions = Address(("127.0.0.1", port, "t", None, True))  # the driver opted in
    assert task_version.version_for(handle, "sql:1") is handle  # as planned (warned once)
    handle._planned = 2  # planned with a version only the driver has
    with pytest.raises(sk.SparkKerasError, match="cannot reach the driver .*SPARK_KERAS_DRIVER_HOST"):
        task_version.version_for(handle, "sql:2")


# --- batch actions --------------------------------------------------------------------

def _frame(spark, x):
    return spark.createDataFrame([(i, x[i].tolist()) for i in range(len(x))],
                                 "id long, features array<float>")


def _predictions(model, x):
    return predictor_for(model)([x], 1024)[0].reshape(-1)


def test_an_action_after_update_scores_with_the_new_version(spark):
    """A DataFrame planned before ``update``: its next action scores with the new
    version, bit-identical, and ``version_col`` says which; so does a plan made after."""
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"m{i}") for i in (1, 2))
    x = np.random.default_rng(0).standard_normal((60, 4), dtype=np.float32)
    bm = sk.BroadcastModel(spark, v1)
    try:
        scored = bm.transform(_frame(spark, x), "features", version_col="model_version")
        first = scored.toPandas().sort_values("id")
        assert bm.version == "1" and set(first.model_version) == {"1"}
        np.testing.assert_array_equal(first.prediction.to_numpy(np.float32), _predictions(v1, x))

        assert bm.update(v2) == "2" and bm.version == "2" and bm.value is v2
        again = scored.toPandas().sort_values("id")  # the same plan, made before update
        assert set(again.model_version) == {"2"}
        np.testing.assert_array_equal(again.prediction.to_numpy(np.float32), _predictions(v2, x))
        later = bm.transform(_frame(spark, x), "features", version_col="v").toPandas()
        assert set(later.v) == {"2"}
        assert bm.update(v1, version="rollback") == "rollback"
        assert set(scored.toPandas().model_version) == {"rollback"}
    finally:
        bm.destroy()


def test_update_refuses_a_model_that_does_not_fit_and_a_label_taken(spark):
    bm = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8), version="a")
    try:
        with pytest.raises(sk.ArgumentError, match=r"does not fit .*inputs \[\(\(5,\)"):
            bm.update(models.mlp(n_features=5, hidden=8))
        with pytest.raises(sk.ArgumentError, match=r"does not fit .*outputs \[\(\(3,\)"):
            bm.update(models.mlp(n_features=4, hidden=8, outputs=3))
        with pytest.raises(sk.ArgumentError, match="'a' was shipped already"):
            bm.update(models.mlp(n_features=4, hidden=8), version="a")
        assert bm.version == "a"
    finally:
        bm.destroy()
    with pytest.raises(sk.SparkKerasError, match="destroyed"):
        bm.update(models.mlp(n_features=4, hidden=8))


# --- a running stream -----------------------------------------------------------------

def _sink(spark, folder) -> pd.DataFrame:
    return spark.read.parquet(os.path.join(folder, "sink")).toPandas().sort_values("id")


def _assert_scored_by(sink: pd.DataFrame, source: Source, files_by_version) -> None:
    """Every row of the files once, each file scored by its version alone, exactly."""
    assert len(sink) == sink.id.nunique() == source.rows * source.files, "rows lost or doubled"
    for (label, model), files in files_by_version.items():
        expected = source.expected(model, files)
        rows = sink[sink.id.isin(list(expected))]
        assert set(rows.model_version) == {label}, (label, files, set(rows.model_version))
        np.testing.assert_array_equal(rows.prediction.to_numpy(np.float32),
                                      np.array([expected[i] for i in rows.id], np.float32))


def _stream(spark, bm, source, folder):
    stream = source.stream(spark)
    return (bm.transform(stream, "features", version_col="model_version")
            .writeStream.format("parquet").option("path", os.path.join(folder, "sink"))
            .option("checkpointLocation", os.path.join(folder, "checkpoint"))
            .trigger(processingTime="0 seconds").start())


def test_a_running_stream_takes_each_update_at_its_next_micro_batch(spark, build_log, tmp_path):
    """Four micro-batches, an update between each: no restart (one query), each
    micro-batch scored by the version current when it started, every row once; the
    version a stream left is gone from the executor within the next micro-batch."""
    folder = str(tmp_path)
    versions = [models.mlp(n_features=8, hidden=16, name=f"v{i}") for i in range(4)]
    source = Source(tmp_path / "in")
    bm = sk.BroadcastModel(spark, versions[0])
    labels = ["1"]
    query = _stream(spark, bm, source, folder)
    try:
        for i, model in enumerate(versions):
            if i:
                labels.append(bm.update(model, version=None if i != 2 else "blue"))
            source.add(1)
            query.processAllAvailable()
            if i == 1:  # one micro-batch on version 2: version 1 is released
                state = executor_state(spark)
                v1_files = [f for s in state.values() for f in s["files"]
                            if f.startswith(bm._name) and not f.startswith(bm._name + ".v")]
                assert not v1_files, state
                v2_key = f"{bm._name}.v2"
                for pid in {pid for _, pid in builds_by_worker(build_log, v2_key)} & set(state):
                    assert bm._name not in state[pid]["keys"], state[pid]
        assert query.isActive and query.exception() is None
        assert [p["batchId"] for p in query.recentProgress if p["numInputRows"]] == [0, 1, 2, 3]
    finally:
        query.stop()
    assert labels == ["1", "2", "blue", "4"]
    _assert_scored_by(_sink(spark, folder), source,
                      {(label, model): [i] for i, (label, model) in enumerate(zip(labels, versions))})
    files = {f for s in executor_state(spark).values() for f in s["files"]}
    assert not any(f.startswith(f"{bm._name}.v2") or f.startswith(f"{bm._name}.v3") for f in files), files
    bm.destroy()


def test_a_query_restarted_from_its_checkpoint_after_an_update(spark, tmp_path):
    """Stopped on version 1, updated, restarted from the checkpoint with a plan made
    then: the rest is scored by version 2, every row once."""
    folder = str(tmp_path)
    v1, v2 = (models.mlp(n_features=8, hidden=16, name=f"r{i}") for i in (1, 2))
    source = Source(tmp_path / "in")
    bm = sk.BroadcastModel(spark, v1)
    source.add(2)
    query = _stream(spark, bm, source, folder)
    query.processAllAvailable()
    query.stop()
    bm.update(v2)
    source.add(2)
    query = _stream(spark, bm, source, folder)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    _assert_scored_by(_sink(spark, folder), source, {("1", v1): [0, 1], ("2", v2): [2, 3]})
    bm.destroy()


def _fail_once(marker: str):
    """A preprocess function raising on the first batch it meets while ``marker`` exists
    (removing it): a micro-batch that fails after its version was pinned."""
    def preprocess(frame):
        if os.path.exists(marker):
            os.remove(marker)
            raise RuntimeError("a worker lost mid-batch")
        return np.stack(frame["features"].to_numpy())
    return preprocess


def test_a_micro_batch_run_again_after_a_failure_keeps_its_version(spark, tmp_path):
    """Micro-batch 1 fails after it was pinned to version 1; version 2 is shipped; the
    query restarted from its checkpoint runs micro-batch 1 again with version 1 (what it
    was planned with: the sink stays exactly-once), and the next one with version 2."""
    folder = str(tmp_path)
    v1, v2 = (models.mlp(n_features=8, hidden=16, name=f"f{i}") for i in (1, 2))
    marker = str(tmp_path / "fail-next-batch")
    bm = sk.BroadcastModel(spark, v1, preprocess=_fail_once(marker))
    source = Source(tmp_path / "in")
    query = _stream(spark, bm, source, folder)
    source.add(1)
    query.processAllAvailable()
    open(marker, "w").close()
    source.add(1)
    with pytest.raises(Exception, match="a worker lost mid-batch"):
        query.processAllAvailable()
    assert not query.isActive
    bm.update(v2)
    query = _stream(spark, bm, source, folder)
    try:
        query.processAllAvailable()
        source.add(1)
        query.processAllAvailable()
    finally:
        query.stop()
    _assert_scored_by(_sink(spark, folder), source, {("1", v1): [0, 1], ("2", v2): [2]})
    bm.destroy()


# --- a watched URI --------------------------------------------------------------------

def test_a_replaced_model_file_is_adopted_at_a_boundary_with_refresh(spark, tmp_path):
    folder = str(tmp_path)
    v1, v2 = (models.mlp(n_features=8, hidden=16, name=f"u{i}") for i in (1, 2))
    path = tmp_path / "current.skp"
    sk.save(v1, path)
    bm = sk.BroadcastModel(spark, path.as_uri(), refresh=0)
    source = Source(tmp_path / "in")
    query = _stream(spark, bm, source, folder)
    try:
        source.add(1)
        query.processAllAvailable()
        sk.save(v2, tmp_path / "next.skp")
        os.replace(tmp_path / "next.skp", path)  # as a deployment replaces it
        source.add(1)
        query.processAllAvailable()
        assert bm.version == "2"
        source.add(1)
        query.processAllAvailable()
    finally:
        query.stop()
    _assert_scored_by(_sink(spark, folder), source, {("1", v1): [0], ("2", v2): [1, 2]})
    bm.destroy()


def _rebuild_everywhere(spark) -> None:
    """What executors turning over do: the workers forget their models and the
    executor's payload files are gone, so the next task builds from the source again."""
    def forget(batches):
        from spark_keras.cache import model_cache
        from spark_keras.executor.transport.executor_file import executor_folder

        for _ in batches:
            pass
        model_cache.clear()
        folder = executor_folder()
        for name in os.listdir(folder) if folder and os.path.isdir(folder) else []:
            with contextlib.suppress(FileNotFoundError):  # another worker was first
                os.remove(os.path.join(folder, name))
        yield pa.RecordBatch.from_arrays([pa.array([os.getpid()])], names=["pid"])

    spark.range(8, numPartitions=8).mapInArrow(forget, "pid long").collect()


def test_a_model_file_replaced_without_refresh_never_fails_the_job(spark, tmp_path):
    """Without ``refresh`` the file replaced under a running stream is ignored: workers
    that build again (fresh executors) get the version the job was planned with, from
    the driver, where they failed on the digest before."""
    folder = str(tmp_path)
    v1, v2 = (models.mlp(n_features=8, hidden=16, name=f"w{i}") for i in (1, 2))
    path = tmp_path / "current.skp"
    sk.save(v1, path)
    bm = sk.BroadcastModel(spark, path.as_uri())
    source = Source(tmp_path / "in")
    query = _stream(spark, bm, source, folder)
    try:
        source.add(1)
        query.processAllAvailable()
        sk.save(v2, path)
        _rebuild_everywhere(spark)
        source.add(2)
        query.processAllAvailable()
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    _assert_scored_by(_sink(spark, folder), source, {("1", v1): [0, 1, 2]})
    bm.destroy()


def test_refresh_needs_a_uri(spark, tmp_path):
    with pytest.raises(sk.ArgumentError, match="refresh= watches a model file given as a URI"):
        sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8), refresh=5)
