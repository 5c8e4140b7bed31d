"""A Spark task's *scope*, and the Spark context of this driver it runs in.

A task's scope names the work whose tasks all score with one version (:mod:`.versions`):
a micro-batch of a streaming query, ``stream:<query id>:<batch id>``; a batch action
(one SQL execution, every stage of it), ``sql:<execution id>``; an RDD job,
``stage:<stage id>`` (:func:`scope_of`, made in the worker from the task's local
properties, :data:`SCOPE_PROPERTIES`).

Stage ids start from 0 again in each SparkContext (and SQL execution ids in each JVM:
a new local Spark Connect server): the driver puts the id of the Spark context running
the task into those two kinds of scope (:func:`in_context`, :func:`active_context`), so
a pin made under a stopped context never answers a task of the next one. A
micro-batch's scope is left alone: a query restarted from its checkpoint keeps its id,
and its version.
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from typing import Any

# the task's local properties a scope is made of
SCOPE_PROPERTIES = ("sql.streaming.queryId", "streaming.sql.batchId", "spark.sql.execution.id")


def scope_of(properties: dict[str, str | None], stage: int | None) -> str | None:
    """The scope of a task with these local properties and stage id (None outside one)."""
    query, batch = properties.get("sql.streaming.queryId"), properties.get("streaming.sql.batchId")
    if query is not None and batch is not None:
        return f"stream:{query}:{batch}"
    execution = properties.get("spark.sql.execution.id")
    if execution is not None:
        return f"sql:{execution}"
    return None if stage is None else f"stage:{stage}"


def in_context(scope: str | None, context: str | None) -> str | None:
    """``scope`` (from a worker) as the driver pins it: a stage's or a SQL execution's
    within ``context`` (:func:`active_context`), whose ids start again in the next one;
    a micro-batch's as it is."""
    if scope is None or context is None or not scope.startswith(("stage:", "sql:")):
        return scope
    kind, _, number = scope.partition(":")
    return f"{kind}:{context}:{number}"


# Spark contexts of this process, each with its id (weak: a stopped context goes)
_context_ids: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_context_serial = itertools.count(1)
_context_lock = threading.Lock()


def active_context() -> str | None:
    """An id of the Spark context this driver runs tasks in now (its active
    SparkContext, else the default Spark Connect session), unique within the process;
    None when neither is alive. Reads no JVM: cheap enough for every request."""
    context: Any = None
    if "pyspark" in sys.modules:
        from pyspark import SparkContext

        sc = SparkContext._active_spark_context
        if sc is not None and getattr(sc, "_jsc", None) is not None:
            context = sc
    connect = sys.modules.get("pyspark.sql.connect.session")
    if context is None and connect is not None:
        context = default_connect_session(connect.SparkSession)
    if context is None:
        return None
    with _context_lock:
        ident = _context_ids.get(context)
        if ident is None:
            ident = _context_ids[context] = f"spark{next(_context_serial)}"
        return ident


def default_connect_session(cls: Any) -> Any:
    """Spark Connect's default session unless stopped (PySpark 3.5 has no
    ``_get_default_session``, only the attribute it reads)."""
    session = getattr(cls, "_default_session", None)
    return None if session is None or session.is_stopped else session
