"""How a ``--resume`` run keeps the cluster busy: how big a group (a commit) is by default
(:func:`default_commit_bytes`), how many groups one Spark job scores (a wave,
:func:`wave_size`), and each wave's Spark job tagged so that a failure cancels the others
(:meth:`Jobs.tagged`, :meth:`Jobs.cancel`).

The rule: groups of about ``input / (10 T)`` bytes, ``T = min(slots + 2, MAX_IN_FLIGHT)``
(files are not cut: a file larger than the bound is a group of its own), and
:data:`WAVES_IN_FLIGHT` waves in flight, the next one's Spark job queued in Spark's
scheduler to take the slot the next task frees while the driver commits the groups it has.
A wave holds at least enough groups for every task slot (a task per 128 MiB of a group, at
least one), then at most about ``input / 20`` bytes and, once the run has scored a wave, at
most :data:`WAVE_SECONDS` of its pace: a kill (which loses the waves in flight; the
committed groups stay) loses about a tenth of the input or a few minutes of work, whichever
is less, and never less than what keeps every slot busy.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

__all__ = ["MAX_IN_FLIGHT", "LOSS_SHARE", "WAVES_IN_FLIGHT", "WAVE_SECONDS", "Jobs",
           "in_flight", "default_commit_bytes", "wave_size"]

MAX_IN_FLIGHT = 32  # the groups' count per slot stops growing there (see default_commit_bytes)
QUEUED = 2  # groups beyond the task slots
LOSS_SHARE = 10  # a kill loses at most about 1/LOSS_SHARE of the input (its waves in flight)
WAVES_IN_FLIGHT = 2  # Spark jobs at once: one running, the next queued behind it
WAVE_SECONDS = 60.0  # a wave's work at most at the run's pace (beyond the slots' floor)
SPLIT_BYTES = 128 * 2**20  # spark.sql.files.maxPartitionBytes' default: a task's input


def in_flight(slots: int) -> int:
    """``T``: the groups a default commit bound makes per tenth of the input on ``slots``
    task slots."""
    return max(1, min(max(slots, 1) + QUEUED, MAX_IN_FLIGHT))


def default_commit_bytes(total_bytes: int, slots: int) -> int:
    """The bound of a group when ``--commit-bytes`` is not given: about
    ``LOSS_SHARE x in_flight(slots)`` groups of the input's ``total_bytes``."""
    return max(1, -(-total_bytes // (LOSS_SHARE * in_flight(slots))))


def wave_size(sizes: Sequence[int], total_bytes: int, slots: int,
              pace: float | None = None) -> int:
    """How many of the next groups (their bytes ``sizes``, in order) one Spark job scores:
    tasks for every slot at least, then up to a tenth of the job's ``total_bytes`` over the
    waves in flight and up to :data:`WAVE_SECONDS` at ``pace`` (bytes/s; None before one is
    known); one at least."""
    bound = total_bytes / (LOSS_SHARE * WAVES_IN_FLIGHT)
    if pace:
        bound = min(bound, pace * WAVE_SECONDS)
    taken, tasks, held = 0, 0, 0
    for size in sizes:
        if taken and tasks >= slots and held + size > bound:
            break
        taken, tasks, held = taken + 1, tasks + max(1, -(-size // SPLIT_BYTES)), held + size
    return taken


class Jobs:
    """The session's task slots, and its Spark jobs tagged by wave (a job tag of the
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
