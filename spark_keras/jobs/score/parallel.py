"""How a ``--resume`` run keeps the cluster busy: how many groups it scores at once
(:func:`in_flight`, from the session's task slots, :class:`Jobs`), how big a group is by
default (:func:`default_commit_bytes`), and the Spark jobs of each group tagged so that a
failure cancels the others (:meth:`Jobs.tagged`, :meth:`Jobs.cancel`).

The rule: ``T = min(slots + 2, MAX_IN_FLIGHT)`` groups in flight (every slot busy, and a
group or two queued in Spark's scheduler to take the slot the next task frees while the
driver plans, publishes and records the groups it has), and groups of about
``input / (10 T)`` bytes: about ``10 T`` groups, so that a kill (which loses the groups in
flight, the committed ones stay) loses at most about a tenth of the input. Files are not
cut: a file larger than the bound is a group of its own.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

__all__ = ["MAX_IN_FLIGHT", "LOSS_SHARE", "Jobs", "in_flight", "default_commit_bytes"]

MAX_IN_FLIGHT = 32  # groups scored at once, at most (each a driver thread and a Spark job)
QUEUED = 2  # groups in flight beyond the task slots: the next tasks wait in Spark's queue
LOSS_SHARE = 10  # a kill loses at most about 1/LOSS_SHARE of the input (its groups in flight)


def in_flight(slots: int) -> int:
    """How many groups are scored at once on ``slots`` task slots."""
    return max(1, min(max(slots, 1) + QUEUED, MAX_IN_FLIGHT))


def default_commit_bytes(total_bytes: int, slots: int) -> int:
    """The bound of a group when ``--commit-bytes`` is not given: about
    ``LOSS_SHARE x in_flight(slots)`` groups of the input's ``total_bytes``."""
    return max(1, -(-total_bytes // (LOSS_SHARE * in_flight(slots))))


class Jobs:
    """The session's task slots, and its Spark jobs tagged by group (a job tag of the
    thread, classic or Spark Connect)."""

    def __init__(self, spark: Any) -> None:
        from spark_keras.executor.transport import is_connect

        self._spark = spark
        self._connect = is_connect(spark)

    def slots(self) -> int:
        """Task slots now (``defaultParallelism``: executors added or lost count); on
        Connect, ``spark.default.parallelism`` if set, else 2 (the client cannot tell)."""
        if self._connect:
            try:
                return int(self._spark.conf.get("spark.default.parallelism", "2") or 2)
            except (TypeError, ValueError):
                return 2
        return int(self._spark.sparkContext.defaultParallelism)

    @contextlib.contextmanager
    def tagged(self, tag: str, description: str) -> Iterator[None]:
        """The Spark jobs this thread runs in the block carry ``tag``."""
        if self._connect:
            self._spark.addTag(tag)
            try:
                yield
            finally:
                self._spark.removeTag(tag)
            return
        context = self._spark.sparkContext
        context.addJobTag(tag)
        context.setLocalProperty("spark.job.description", description)
        try:
            yield
        finally:
            context.removeJobTag(tag)
            context.setLocalProperty("spark.job.description", None)

    def cancel(self, tag: str) -> None:
        """Cancel the running and waiting Spark jobs tagged ``tag``."""
        if self._connect:
            self._spark.interruptTag(tag)
        else:
            self._spark.sparkContext.cancelJobsWithTag(tag)
