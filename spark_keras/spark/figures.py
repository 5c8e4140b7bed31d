"""The build figures of an observed transform, made in the Python workers (and each
batch's invalid rows by class of reason, :func:`reasons_column`).

A worker process counts the model builds it made while scoring each query (a Spark SQL
execution) and hands them to the first batch of each stage of that query it scores.
Spark runs the scoring plan in more than one job for some queries: a sort (``orderBy``)
first runs a sampling job over the same plan, whose observation Spark discards, so the
model is built there and found cached by the observed job. Reporting the query's builds
to every stage (each stage once) brings the sampling job's builds into the observed one.
Spark 3.5 keeps the sampling job's observation instead, adding it to the observed job's
(a sort's ``rows`` count twice there): each query's builds are then reported once.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, Any, Hashable

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from spark_keras.inference.engine import Scored

# how many recent queries a process keeps figures for (one entry per model and query)
_KEEP = 64


class BuildLedger:
    """Per process: the builds of each model made while scoring each query, and what
    each stage of that query has already reported of them."""

    def __init__(self, keep: int = _KEEP) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        # (model key, query) -> [builds, seconds, {stage: (builds, seconds) reported}]
        self._queries: OrderedDict[tuple[str, Hashable], list[Any]] = OrderedDict()

    def _entry(self, key: str, query: Hashable) -> list[Any]:
        entry = self._queries.get((key, query))
        if entry is None:
            entry = self._queries[(key, query)] = [0, 0.0, {}]
            while len(self._queries) > self._keep:
                self._queries.popitem(last=False)
        self._queries.move_to_end((key, query))
        return entry

    def add(self, key: str, query: Hashable, builds: int, seconds: float) -> None:
        """Record ``builds`` of model ``key`` (taking ``seconds``) made scoring ``query``."""
        with self._lock:
            entry = self._entry(key, query)
            entry[0] += builds
            entry[1] += seconds

    def report(self, key: str, query: Hashable, stage: Hashable) -> tuple[int, float]:
        """The builds (and seconds) of ``key`` made for ``query`` that ``stage`` has not
        reported yet, now counted as reported by it."""
        with self._lock:
            entry = self._entry(key, query)
            builds, seconds = entry[2].get(stage, (0, 0.0))
            entry[2][stage] = (entry[0], entry[1])
            return entry[0] - builds, entry[1] - seconds


ledger = BuildLedger()


def _jobs_observed_apart() -> bool:
    """Whether Spark drops the observation of a query's other jobs (a sort's sampling
    job): PySpark 4 and later; 3.5 adds every job's up."""
    import pyspark

    return int(pyspark.__version__.split(".")[0]) >= 4


def task_ids() -> tuple[Hashable, Hashable]:
    """(query, stage) of the Spark task this process runs: the SQL execution id and the
    stage id (None where every stage's observation counts, see the module's text),
    (None, None) outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None, None
    stage = context.stageId() if _jobs_observed_apart() else None
    return context.getLocalProperty("spark.sql.execution.id"), stage


def builds_of(key: str) -> tuple[int, float]:
    """This process's builds of model ``key`` so far (any device), and their seconds."""
    from spark_keras.cache import model_cache

    return model_cache.builds_of(key)


def builds_columns(rows: int, builds: int, seconds: float) -> list[pa.Array]:
    """The hidden columns of one batch: null but on its first row, which holds the
    builds reported with it (and their seconds)."""
    valid = np.zeros(rows, dtype=bool)
    valid[:1] = True
    return [pa.array(np.full(rows, value, dtype=dtype), mask=~valid)
            for value, dtype in ((builds, np.int64), (seconds, np.float64))]


# a batch's invalid rows by class of reason: [{reason, rows}, ...] on its first row
REASONS_ARROW = pa.list_(pa.struct([("reason", pa.string()), ("rows", pa.int64())]))


def reasons_metric(by_reason: Any) -> Any:
    """The ``invalid_by_reason`` metric as observed: the map itself on PySpark 4; on 3.5,
    whose ``Observation.get`` gives a map as a JVM object, its JSON text."""
    if _jobs_observed_apart():  # PySpark 4 and later
        return by_reason
    from pyspark.sql import functions as F

    return F.to_json(by_reason)


def reasons_observed(value: Any) -> dict[str, int]:
    """An observed ``invalid_by_reason`` (a dict, or the JSON text PySpark 3.5 gets) as
    ``{class: rows}`` sorted by class."""
    found = json.loads(value) if isinstance(value, str) else dict(value or {})
    return {str(k): int(v) for k, v in sorted(found.items())}


def reasons_type() -> Any:
    """The Spark type of :func:`reasons_column`."""
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    return ArrayType(StructType([StructField("reason", StringType()),
                                 StructField("rows", LongType())]))


def reasons_column(scored: "Scored") -> pa.Array:
    """The hidden column of one batch's invalid rows by class of reason: null but on its
    first row, which holds ``[{"reason": class, "rows": count}, ...]`` (sorted by class)
    if the batch has invalid rows (their classes made: ``Scored.classes``)."""
    rows = scored.rows
    if scored.invalid is None or not scored.invalid.any():
        return pa.nulls(rows, REASONS_ARROW)
    assert scored.classes is not None  # asked for with the figures
    counts = Counter(c for c, bad in zip(scored.classes, scored.invalid) if bad)
    first = [{"reason": str(k), "rows": v} for k, v in sorted(counts.items(), key=str)]
    return pa.array([first] + [None] * (rows - 1), REASONS_ARROW)
