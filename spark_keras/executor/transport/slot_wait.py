"""The driver's side of the ship-time warm-up's Spark jobs: run in a job group of their
own, in a thread, and given up when they wait for task slots too long.

The warm-up's jobs need a slot on every executor: while another job holds the slots
(a long job in another thread, a streaming query that never ends) they would wait as
long as it runs, and ``BroadcastModel(...)`` or ``update()`` with them. A
job of the group that has started no task and finished none for :data:`STALL_SECONDS`
is cancelled (the group's jobs, not the user's); the warm-up then stops as on any failure
(executors download the payload from the driver when they need it), and its clean-up
goes on in the thread while the ship returns. Ctrl-C cancels the group the same way.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable, TypeVar

logger = logging.getLogger("spark_keras")

T = TypeVar("T")

# seconds a job of the warm-up may wait with no task running or finished before it is
# given up (its slots held by other jobs)
STALL_SECONDS = 20.0
POLL_SECONDS = 0.25


def run_unless_stalled(sc: Any, work: Callable[[], T], fallback: T, what: str) -> T:
    """``work()`` (which runs Spark jobs) in a thread under a job group of its own; its
    result, or ``fallback`` when one of its jobs waited :data:`STALL_SECONDS` for slots
    (the group cancelled; ``work`` then fails and cleans up in its thread)."""
    group = f"spark-keras-warm-up-{uuid.uuid4().hex[:12]}"
    done: dict[str, Any] = {}

    def target() -> None:
        sc.setJobGroup(group, f"spark_keras: {what}", False)
        try:
            done["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            done["error"] = exc

    thread = threading.Thread(target=target, name=group, daemon=True)
    thread.start()
    watch = _Progress(sc, group)
    try:
        while thread.is_alive():
            thread.join(POLL_SECONDS)
            if thread.is_alive() and watch.stalled():
                logger.warning("%s: a Spark job waited %.0f s for task slots other jobs hold; "
                               "given up (executors download the payload when they need it)",
                               what, STALL_SECONDS)
                sc.cancelJobGroup(group)
                return fallback
    except BaseException:  # Ctrl-C: the warm-up's jobs go with it
        sc.cancelJobGroup(group)
        raise
    if "error" in done:
        raise done["error"]
    return done["value"]


class _Progress:
    """Whether the group's running jobs have gone :data:`STALL_SECONDS` with no task
    running and none finished (read from Spark's status tracker)."""

    def __init__(self, sc: Any, group: str) -> None:
        self._tracker, self._group = sc.statusTracker(), group
        self._seen: tuple[int, ...] = ()
        self._since = time.monotonic()

    def stalled(self) -> bool:
        state = self._state()
        now = time.monotonic()
        if state is None or state != self._seen:  # no job waiting, or tasks moved
            self._seen, self._since = state or (), now
            return False
        return now - self._since > STALL_SECONDS

    def _state(self) -> tuple[int, ...] | None:
        """The finished tasks of the group's running jobs' stages, or None when a task
        runs or no job of the group is running."""
        finished: list[int] = []
        for job in self._tracker.getJobIdsForGroup(self._group):
            info = self._tracker.getJobInfo(job)
            if info is None or info.status != "RUNNING":
                continue
            for stage in info.stageIds:
                s = self._tracker.getStageInfo(stage)
                if s is None:
                    continue
                if s.numActiveTasks:
                    return None
                finished.append(s.numCompletedTasks + s.numFailedTasks)
        return tuple(finished) if finished else None
