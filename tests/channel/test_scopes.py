"""What a holder of one handle's token can do over the driver's channel (issue 51, items
5, 7 and 8): a real local[2] driver, real handles, real TLS requests.

* Tokens: each handle carries a token for its own scope (``model:<name>``); it reads
  neither another handle's payloads nor pins another's versions (403).
* Pins: the driver pins only a scope its Spark runs. A token holder's requests for SQL
  executions to come, for a micro-batch its query does not run, or for thousands of
  made-up scopes pin nothing: the next action takes the update, and a running
  micro-batch or action keeps its one version.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.channel import versions
from spark_keras.channel.client import ask, download
from tests import models


def _frame(spark, n: int = 40, n_features: int = 4):
    x = np.random.default_rng(0).standard_normal((n, n_features), dtype=np.float32)
    return spark.createDataFrame([(i, x[i].tolist()) for i in range(n)],
                                 "id long, features array<float>")


# --- tokens (items 5 and 8) -----------------------------------------------------------


def test_a_handles_token_reads_its_own_payload_and_nothing_of_another_handles(spark):
    """Handles A and B, both served from the driver's files: A's token (what A's plans
    carry to every executor) downloads A's payload, and is refused (403) B's payload and
    B's versions; A's own tasks download and score with it."""
    a = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8, name="a"), ship="driver")
    b = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8, name="b"), ship="driver")
    try:
        assert a._versions.token != b._versions.token
        out = io.BytesIO()
        assert download(a._versions, a._name, 1, out) > 0
        with open(a._server.payload_path(a._name, 1), "rb") as f:
            assert out.getvalue() == f.read()
        with pytest.raises(sk.SparkKerasError, match="refused /payload: 403"):
            download(a._versions, b._name, 1, io.BytesIO())
        with pytest.raises(sk.SparkKerasError, match="refused /resolve: 403"):
            ask(a._versions, b._name, "sql:1")
        assert not b._schedule.is_pinned("sql:1")
        scored = a.transform(_frame(spark), "features", version_col="v").toPandas()
        assert len(scored) == 40 and set(scored.v) == {"1"}  # A's workers: A's token
    finally:
        a.destroy()
        b.destroy()


# --- pins (item 7) --------------------------------------------------------------------


def _execution_id(spark) -> int:
    """The id of a SQL execution run now (the next ones follow it)."""
    def report(batches):
        import pandas as pd
        from pyspark import TaskContext

        for _ in batches:
            pass
        yield pd.DataFrame({"e": [int(TaskContext.get().getLocalProperty("spark.sql.execution.id"))]})

    return spark.range(1, numPartitions=1).mapInPandas(report, "e long").collect()[0].e


def test_requests_for_executions_to_come_pin_nothing(spark):
    """Before ``update()``, a holder of the handle's token asks for the next 30 SQL
    executions, as a task of each would: none runs yet, none is pinned, and the plan's
    next action, after ``update(v2)``, scores with version 2 (the pins made in advance
    held it on version 1)."""
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"f{i}") for i in (1, 2))
    bm = sk.BroadcastModel(spark, v1)
    try:
        scored = bm.transform(_frame(spark), "features", version_col="v")
        now = _execution_id(spark)
        for execution in range(now + 1, now + 31):
            assert ask(bm._versions, bm._name, f"sql:{execution}")["version"]["label"] == "1"
        assert bm.update(v2) == "2"
        assert set(scored.toPandas().v) == {"2"}
    finally:
        bm.destroy()


def test_a_request_for_an_unseen_micro_batch_leaves_the_running_ones_pin(spark, tmp_path):
    """Micro-batch 0 of a real query scores (its tasks pin it to version 1), then, while
    it runs, ``update(v2)`` and a token holder's request for micro-batch 999999999 of the
    same query: a later task of batch 0 (a worker asking afresh) still gets version 1 (the
    request replaced the query's pin: it got version 2), and the next real action on the
    batch too."""
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"s{i}") for i in (1, 2))
    bm = sk.BroadcastModel(spark, v1)
    _frame(spark).write.parquet(str(tmp_path / "in"))
    seen: dict = {}

    def body(batch, batch_id):
        query = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
        seen["first"] = set(bm.transform(batch, "features", version_col="v").toPandas().v)
        bm.update(v2)
        seen["unseen"] = ask(bm._versions, bm._name, f"stream:{query}:999999999")["version"]["label"]
        seen["later"] = ask(bm._versions, bm._name, f"stream:{query}:{batch_id}")["version"]["label"]
        seen["again"] = set(bm.transform(batch, "features", version_col="v").toPandas().v)

    query = (spark.readStream.schema("id long, features array<float>")
             .parquet(str(tmp_path / "in")).writeStream.foreachBatch(body)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
        bm.destroy()
    assert seen == {"first": {"1"}, "unseen": "2", "later": "1", "again": {"1"}}


@contextlib.contextmanager
def _running_action(spark, model, folder):
    """A handle of ``model`` whose action runs while the block does: its task asked
    (pinned its SQL execution), built its model, then waits, holding one of local[2]'s
    two task slots; yields the handle, the execution's id and, once the block ended,
    ``rows``: what the action scored. Rows of zeros (other actions') are scored at once."""
    waiting, gate = os.path.join(folder, "waiting"), os.path.join(folder, "go")

    def wait_for_the_gate(frame):  # runs once the task's model is built
        features = np.stack(frame["features"].to_numpy())
        if features.any():
            open(waiting, "w").close()
        while features.any() and not os.path.exists(gate):
            time.sleep(0.05)
        return features

    bm = sk.BroadcastModel(spark, model, preprocess=wait_for_the_gate)
    result: dict = {}
    action = threading.Thread(target=lambda: result.update(
        rows=bm.transform(_frame(spark).coalesce(1), "features", version_col="v").toPandas()))
    try:
        action.start()
        deadline = time.monotonic() + 120
        while not os.path.exists(waiting):
            assert time.monotonic() < deadline and action.is_alive(), "the action never waited"
            time.sleep(0.1)
        [pinned] = [s for s in list(bm._schedule._pins) if s.startswith("sql:")]
        yield bm, int(pinned.rsplit(":", 1)[1]), result
    finally:
        open(gate, "w").close()
        action.join(120)
        bm.destroy()


def test_made_up_scopes_never_evict_a_running_actions_pin(spark, tmp_path, monkeypatch):
    """An action's tasks pin it to version 1 and wait; ``update(v2)``; a token holder asks
    for as many made-up scopes as the driver keeps pins (``MAX_PINS``, lowered to 200: the
    real 10,000 proved the same in 59 s of CI, 10,000 round trips): none of them runs, none
    is pinned, and the action's pin stays (it was the least recently asked: evicted, its
    later tasks got version 2). Every row of the action is scored by version 1."""
    scopes = 200
    monkeypatch.setattr(versions, "MAX_PINS", scopes)
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"e{i}") for i in (1, 2))
    with _running_action(spark, v1, str(tmp_path)) as (bm, execution, result):
        bm.update(v2)
        for n in range(scopes):  # SQL executions and stages: each would take a pin
            ask(bm._versions, bm._name, f"{('sql', 'stage')[n % 2]}:{execution + 1 + n}")
        assert ask(bm._versions, bm._name, f"sql:{execution}")["version"]["label"] == "1"
    assert len(result["rows"]) == 40 and set(result["rows"].v) == {"1"}


def test_past_the_bound_the_pins_of_finished_actions_go_not_a_running_ones(spark, tmp_path,
                                                                          monkeypatch):
    """``MAX_PINS`` lowered to 3: an action runs, pinned to version 1; ``update(v2)``;
    four short real actions each pin their execution and end. Past the bound the pins of
    the finished ones go: the running action, the least recently asked, keeps version 1
    (it was evicted first: its later tasks got version 2)."""
    monkeypatch.setattr(versions, "MAX_PINS", 3)
    v1, v2 = (models.mlp(n_features=4, hidden=8, name=f"b{i}") for i in (1, 2))
    with _running_action(spark, v1, str(tmp_path)) as (bm, execution, result):
        bm.update(v2)
        zeros = spark.createDataFrame([(i, [0.0] * 4) for i in range(4)],
                                      "id long, features array<float>").coalesce(1)
        for _ in range(4):
            rows = bm.transform(zeros, "features", version_col="v").toPandas()
            assert set(rows.v) == {"2"}
        assert ask(bm._versions, bm._name, f"sql:{execution}")["version"]["label"] == "1"
    assert len(result["rows"]) == 40 and set(result["rows"].v) == {"1"}
