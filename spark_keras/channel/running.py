"""On the driver: whether Spark runs a task's scope now, so that only such a scope is
pinned to a version (:meth:`.versions.Schedule.pin`).

A worker's request names its scope; any holder of the handle's token can name any scope,
so the driver pins one only if its own Spark runs it, read from the JVM's state as the
scheduler keeps it (no listener, which lags behind):

* ``sql:<context>:<id>``: SQL execution ``id`` runs (``SQLExecution.getQueryExecution``:
  registered before its first job, removed after its last);
* ``stage:<context>:<id>``: stage ``id`` belongs to an active job (the DAG scheduler's
  ``stageIdToStage``: made before any task of the job, dropped with it);
* ``stream:<query id>:<batch>``: the query runs in this driver and ``batch`` is its
  micro-batch running, or the last it ran (``SharedState.activeStreamingQueries``, the
  query's ``lastExecution``).

A scope of another Spark context than the active one is not running. Where the driver
cannot tell (a Spark Connect client, whose Spark is the server's; no Spark here; a JVM
that fails to answer), :func:`running` says None.
"""

from __future__ import annotations

import logging
from typing import Any

from spark_keras.channel.budget_stages import _runs as stage_runs
from spark_keras.channel.budget_stages import classic
from spark_keras.channel.scopes import active_context

logger = logging.getLogger("spark_keras")


def running(scope: str) -> bool | None:
    """Whether Spark runs ``scope`` (as the driver pins it, :func:`.scopes.in_context`)
    now; None when this driver cannot tell."""
    sc = classic()
    if sc is None:
        return None
    kind, _, rest = scope.partition(":")
    try:
        if kind == "stream":
            query, _, batch = rest.rpartition(":")
            return _micro_batch(sc, query) == int(batch)
        context, _, number = rest.rpartition(":")
        if not context:
            return None  # resolved with no Spark context alive: not one of this driver's
        if context != active_context():
            return False  # a stopped context's: its ids start again in the next one
        if kind == "sql":
            execution = sc._jvm.org.apache.spark.sql.execution.SQLExecution
            return execution.getQueryExecution(int(number)) is not None
        if kind == "stage":  # the DAG scheduler's, as the ledger reads it
            return stage_runs(sc, int(number))
    except Exception as exc:  # noqa: BLE001 (Py4J's errors: a JVM stopping, another Spark)
        logger.debug("cannot tell whether Spark runs %s: %r", scope, exc)
    return None


def _micro_batch(sc: Any, query: str) -> int | None:
    """The micro-batch that streaming query ``query`` (its id) runs, or ran last, in this
    driver; None if it runs none here (stopped, another driver's, not an id)."""
    from pyspark.sql import SparkSession

    session = SparkSession._instantiatedSession
    if session is None:
        return None  # no session: no query of this driver's Python runs
    try:
        uuid = sc._jvm.java.util.UUID.fromString(query)
    except Exception:  # noqa: BLE001 (not a query id: IllegalArgumentException)
        return None
    execution = session._jsparkSession.sharedState().activeStreamingQueries().get(uuid)
    last = None if execution is None else execution.lastExecution()
    return None if last is None else int(last.currentBatchId())
