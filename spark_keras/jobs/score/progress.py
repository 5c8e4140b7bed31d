"""The score job's progress lines (``--progress``): a line every ``--progress-seconds``
while Spark runs the scoring, from the tasks of the session's running stages (classic:
``SparkContext.statusTracker()``; Spark Connect: the client's progress handler), the
number formats of those lines, and a resumable run's figures over its commits
(:class:`Progress`: the line after each commit and the summary)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable, Iterator, NamedTuple, Optional

from spark_keras.jobs.score.manifest import Plan

__all__ = ["Running", "Tasks", "Heartbeat", "Progress", "running_tasks", "scoring_line", "count",
           "byte_size", "clock", "eta"]

logger = logging.getLogger("spark_keras.jobs.score")

# the plan nodes that run the scoring's Python, whose "number of output rows" is rows scored
PYTHON_NODES = ("ArrowEvalPython", "MapInArrow", "PythonMapInArrow", "MapInPandas",
                "BatchEvalPython")
_RECENT = 8  # the session's latest SQL executions looked at for running ones


class Running(NamedTuple):
    """The running stages' tasks done and tasks (0 of 0: no stage runs, but a query that
    scored rows does), and the rows the scoring returned so far in the running queries
    (classic Spark; None on Spark Connect, whose progress has none)."""

    done: int
    total: int
    rows: Optional[int] = None


Tasks = Optional[Running]  # None: no stage runs (nor a query that scored rows)


def count(n: float) -> str:
    """1,234 / 12.3k / 1.2M / 3.4B: exact below 10,000, else in thousands, millions or
    billions, one decimal."""
    if abs(n) < 1e4:
        return f"{n:,.0f}"
    for scale, unit in ((1e3, "k"), (1e6, "M")):
        if abs(round(n / scale, 1)) < 1000:
            return f"{n / scale:.1f}{unit}"
    return f"{n / 1e9:.1f}B"


def byte_size(n: float) -> str:
    """12 bytes / 3.4 KiB / 1.2 GiB."""
    for scale, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} bytes"


def clock(seconds: float) -> str:
    """``HH:MM:SS``."""
    whole = int(round(seconds))
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def eta(seconds: float, done: float, total: float) -> str:
    """The time left at the pace so far, ``unknown`` before anything is done."""
    if total <= done:
        return clock(0)
    return clock(seconds * (total - done) / done) if done > 0 else "unknown"


def running_tasks(stages: Any) -> Tasks:
    """``(tasks done, tasks)`` of the stages not done among Spark Connect's ``StageInfo``s
    (``pyspark.sql.connect.shell.progress``); None if none is running."""
    running = [s for s in stages if not s.done]
    if not running:
        return None
    return Running(sum(s.num_completed_tasks for s in running),
                   sum(s.num_tasks for s in running))


def scored_rows(store: Any) -> int:
    """The rows the Python nodes (:data:`PYTHON_NODES`) of the running SQL executions
    returned so far, from the session's SQL status store (``SQLAppStatusStore``: their
    ``number of output rows``, which grows as executors' heartbeats and finished tasks
    report it)."""
    rows = 0
    latest = store.executionsList(max(0, store.executionsCount() - _RECENT), _RECENT)
    for i in range(latest.size()):
        execution = latest.apply(i)
        if execution.completionTime().isDefined():
            continue
        values = store.executionMetrics(execution.executionId())
        nodes = store.planGraph(execution.executionId()).allNodes()
        for j in range(nodes.size()):
            node = nodes.apply(j)
            if node.name() not in PYTHON_NODES:
                continue
            metrics = node.metrics()
            for k in range(metrics.size()):
                metric = metrics.apply(k)
                value = values.get(metric.accumulatorId())
                if metric.name() == "number of output rows" and value.isDefined():
                    rows += int(value.get().replace(",", ""))
    return rows


class _ClassicTasks:
    """The tasks of the running stages, from the driver's status tracker."""

    def __init__(self, spark: Any) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._sql = spark._jsparkSession.sharedState().statusStore()

    def __call__(self) -> Tasks:
        stages = [self._tracker.getStageInfo(i) for i in self._tracker.getActiveStageIds()]
        stages = [s for s in stages if s is not None]
        rows = scored_rows(self._sql)
        if not stages and not rows:
            return None
        return Running(sum(s.numCompletedTasks for s in stages),
                       sum(s.numTasks for s in stages), rows)

    def close(self) -> None:
        pass


class _ConnectTasks:
    """The tasks of the running stages, as the Connect server last reported them (every
    ``spark.connect.progress.reportInterval``, 2 s by default) to the client's handler."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._last: Tasks = None
        spark.registerProgressHandler(self._update)

    def _update(self, stages: Any, inflight_tasks: int, operation_id: Any = None,
                done: bool = False) -> None:
        self._last = None if done else running_tasks(stages or ())

    def __call__(self) -> Tasks:
        return self._last

    def close(self) -> None:
        self._spark.removeProgressHandler(self._update)


class Heartbeat:
    """Logs (INFO, ``spark_keras.jobs.score``) a line every ``seconds`` while a block of the
    job runs: what ``describe`` makes of the running stages' tasks. ``seconds=None``: off
    (nothing started, nothing asked of Spark)."""

    def __init__(self, spark: Any, seconds: float | None) -> None:
        self._spark = spark
        self._seconds = seconds

    def rows_of(self, df: Any, fmt: str) -> int | None:
        """The rows of the input ``df`` when the lines can use them (on, classic Spark, and
        a parquet input, whose count Spark reads from the files' footers); else None."""
        from spark_keras.executor.transport import is_connect

        if self._seconds is None or fmt != "parquet" or is_connect(self._spark):
            return None
        return int(df.count())

    @contextlib.contextmanager
    def beating(self, describe: Callable[[Tasks], str]) -> Iterator[None]:
        """Log ``describe(tasks)`` every ``seconds`` until the block ends."""
        if self._seconds is None:
            yield
            return
        from spark_keras.executor.transport import is_connect

        source = _ConnectTasks(self._spark) if is_connect(self._spark) \
            else _ClassicTasks(self._spark)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self._seconds):
                try:
                    logger.info(describe(source()))
                except Exception as exc:  # a progress line must never fail the job
                    logger.debug("no progress line: %s", exc)

        thread = threading.Thread(target=beat, name="spark-keras-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            source.close()


def scoring_line(started: float, total_rows: int | None = None) -> Callable[[Tasks], str]:
    """What a run without ``--resume`` logs of its running ``tasks``, scoring since
    ``started`` (``time.perf_counter()``): the rows scored (of ``total_rows`` if known),
    rows/s, tasks, time elapsed and the ETA (by rows if both are known, else by tasks)."""
    def line(tasks: Tasks) -> str:
        elapsed = time.perf_counter() - started
        if tasks is None:
            return f"scoring: no Spark stage running, {clock(elapsed)} elapsed"
        rows, text = tasks.rows, "scoring: "
        if rows is not None:
            text += (f"{count(rows)}{'' if total_rows is None else f' of {count(total_rows)}'}"
                     f" rows, {count(rows / max(elapsed, 1e-9))} rows/s, ")
        if not tasks.total:
            return f"{text}no Spark stage running, {clock(elapsed)} elapsed"
        left = eta(elapsed, rows, total_rows) if rows is not None and total_rows \
            else eta(elapsed, tasks.done, tasks.total)
        return f"{text}{tasks.done} of {tasks.total} tasks, {clock(elapsed)} elapsed, ETA {left}"
    return line


class Progress:
    """This run's figures, summed over the groups it committed, and the line and summary
    an operator reads after each commit."""

    def __init__(self, plan: Plan, committed: dict[int, dict]) -> None:
        self._plan = plan
        self.total = len(plan.manifest["groups"])
        self.skipped = len(committed)
        self.rows_skipped = sum(int(r["rows"]) for r in committed.values())
        self._left = sum(plan.group_bytes(i) for i in range(self.total) if i not in committed)
        self._done_bytes = 0
        self.groups = self.rows = self.invalid_rows = self.builds = 0
        self.build_seconds = 0.0
        self.by_reason: dict[str, int] = {}
        self._started = time.perf_counter()

    def started(self) -> str:
        left = f"{self.total - self.skipped} group(s), {byte_size(self._left)} of input"
        if self.skipped:
            return (f"resuming {self._plan.output!r}: {self.skipped} of {self.total} groups "
                    f"({count(self.rows_skipped)} rows) committed before; scoring {left}")
        return f"scoring {left} into {self._plan.output!r}"

    def add(self, index: int, record: dict) -> None:
        self.groups += 1
        self.rows += int(record["rows"])
        self.invalid_rows += int(record["invalid_rows"])
        self.builds += int(record["model_builds"])
        self.build_seconds += float(record["build_seconds"])
        for reason, rows in record.get("invalid_by_reason", {}).items():
            self.by_reason[reason] = self.by_reason.get(reason, 0) + int(rows)
        self._done_bytes += self._plan.group_bytes(index)

    def eta(self) -> float | None:
        seconds = time.perf_counter() - self._started
        left = self._left - self._done_bytes
        if not left:
            return 0.0
        return left * seconds / self._done_bytes if self._done_bytes else None

    def line(self, group: int | None = None, tasks: Tasks = None) -> str:
        """After a commit; or while ``group`` is scored, with its running ``tasks`` (the
        ETA counts the part of its bytes their share done)."""
        seconds = time.perf_counter() - self._started
        done: float = self._done_bytes
        if group is not None and tasks is not None and tasks[1]:
            done += self._plan.group_bytes(group) * tasks[0] / tasks[1]
        text = (f"committed {self.skipped + self.groups} of {self.total} groups, "
                f"{count(self.rows_skipped + self.rows)} rows "
                f"({count(self.invalid_rows)} invalid), "
                f"{count(self.rows / max(seconds, 1e-9))} rows/s, "
                f"ETA {eta(seconds, done, self._left)}")
        if group is not None:
            text += f"; group {group + 1}: " + \
                ("no Spark stage running" if tasks is None or not tasks[1]
                 else f"{tasks[0]} of {tasks[1]} tasks")
        return text

    def summary(self) -> dict:
        """The job's figures (those of a run without ``--resume``, for this run's rows)
        and the commit figures: ``rows_skipped``, ``groups`` (committed by this run),
        ``groups_skipped``, ``groups_total``, ``eta_seconds`` and ``done``."""
        seconds = time.perf_counter() - self._started
        eta = self.eta()
        return {"rows": self.rows, "invalid_rows": self.invalid_rows,
                "invalid_by_reason": dict(sorted(self.by_reason.items())),
                "seconds": round(seconds, 3),
                "rows_per_second": round(self.rows / seconds, 1) if seconds else None,
                "model_builds": self.builds, "build_seconds": round(self.build_seconds, 3),
                "rows_skipped": self.rows_skipped, "groups": self.groups,
                "groups_skipped": self.skipped, "groups_total": self.total,
                "eta_seconds": None if eta is None else round(eta, 1),
                "done": self.skipped + self.groups == self.total}
