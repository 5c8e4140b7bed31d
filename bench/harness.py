"""The measuring machinery the sections share: warm-up, timing, interleaved rounds, and
the memory of Python workers (peak RSS, PSS).

A run is timed on Spark's ``noop`` sink, so nothing is collected. Peak RSS per Python
worker is read from /proc/<pid>/status (VmHWM), reset before each timed run through
/proc/<pid>/clear_refs. PSS splits each page among the processes mapping it.

Importing this module imports nothing heavy (no numpy, no Keras): the cold-start section's
workers import it when they unpickle their task, before its timer starts.
"""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable

# --- Python worker memory ----------------------------------------------------------------


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process."""
    parents = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    parents[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
    return parents


def worker_pids(workers_only: bool = False) -> list[int]:
    """This driver's PySpark Python processes (its JVM's daemons and the workers they
    forked; no other session's), or only the workers."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    pids, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"python" in cmd and (b"daemon" in cmd or b"pyspark.worker" in cmd):
            pids.append(pid)
    if workers_only:
        daemons = set(pids)
        pids = [pid for pid in pids if parents.get(pid) in daemons]
    return sorted(pids)


def reset_peak_rss() -> None:
    for pid in worker_pids():
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_worker_rss_mb() -> float:
    peak = 0
    for pid in worker_pids():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
    return peak / 1024


def pss_kb() -> dict[str, int]:
    """This process's proportional set size in kB, by kind of memory: ``anon``
    (anonymous), ``file`` (data files: the payload file) and ``code`` (files mapped
    executable: the interpreter, shared libraries, with all their mappings)."""
    by_path: collections.Counter[str] = collections.Counter()
    code: set[str] = set()
    path = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields[0] == "Pss:":
                by_path[path] += int(fields[1])
            elif not fields[0].endswith(":"):  # a mapping: address perms offset dev inode [path]
                path = " ".join(fields[5:]) if fields[4] != "0" else ""  # inode 0: anonymous
                if path and "x" in fields[1]:
                    code.add(path)
    anon = by_path.pop("", 0)
    return {"anon": anon, "code": sum(by_path[p] for p in code),
            "file": sum(v for p, v in by_path.items() if p not in code)}


def pss_mb() -> dict[str, float]:
    """This process's PSS from /proc/self/smaps_rollup, MB: ``Pss`` and, where the kernel
    reports them, ``Pss_Anon`` and ``Pss_File``."""
    found = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Pss", "Pss_Anon", "Pss_File"):
                found[name] = int(rest.split()[0]) / 1024
    return found


def touch_keras() -> None:
    """Import Keras (TensorFlow) and run one op: what every worker has mapped before a
    model arrives."""
    import keras

    keras.ops.convert_to_numpy(keras.ops.ones((2, 2)) @ keras.ops.ones((2, 2)))


def tf_baseline_rss_mb(spark) -> float:
    """Peak RSS of a Python worker that imported TensorFlow/Keras and ran one op."""
    def touch(_):
        touch_keras()
        return [0]

    spark.sparkContext.parallelize(range(4), 4).mapPartitions(touch).collect()
    reset_peak_rss()
    spark.sparkContext.parallelize(range(4), 4).mapPartitions(touch).collect()
    return peak_worker_rss_mb()


# --- timing ----------------------------------------------------------------------------------

def sample(df):
    """The warm-up and check rows: every 20th id (5%), from every partition."""
    return df.where(df["id"] % 20 == 0)


def warm_up(frame_fn, df, check: Callable[[Any], None] | None = None) -> None:
    """Worker start, TensorFlow import, model build and tracing on the sample rows, whose
    predictions are collected and given to ``check`` when there is one."""
    warm = frame_fn(sample(df))
    if check is None:
        warm.write.format("noop").mode("overwrite").save()
    else:
        check(warm.toArrow())


def timed_run(frame_fn, df) -> tuple[float, float]:
    """Seconds for the whole DataFrame written to the ``noop`` sink, and the peak worker
    RSS during it."""
    reset_peak_rss()
    start = time.perf_counter()
    frame_fn(df).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start, peak_worker_rss_mb()


def interleaved(frames: dict[str, Callable], df, rounds: int,
                before_round: Callable[[], None] | None = None) -> dict[str, tuple[float, float]]:
    """Each method timed once per round, the methods interleaved so that a slow minute of
    the machine hits them all alike: ``{name: (best seconds, largest peak RSS)}``.
    ``before_round`` runs at the start of each round (the raw model's timing)."""
    best: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        if before_round is not None:
            before_round()
        for name, frame_fn in frames.items():
            seconds, rss = timed_run(frame_fn, df)
            old = best.get(name, (float("inf"), 0.0))
            best[name] = (min(old[0], seconds), max(old[1], rss))
    return best


def time_action(frame_fn, df, check: Callable[[Any], None] | None = None,
                runs: int = 2) -> tuple[float, float]:
    """:func:`warm_up`, then time the whole DataFrame: best of ``runs`` for short runs
    (under 8 s), else one; ``(seconds, peak worker RSS MB)``."""
    warm_up(frame_fn, df, check)
    times: list[float] = []
    rss = 0.0
    while not times or (len(times) < runs and times[0] < 8.0):
        seconds, peak = timed_run(frame_fn, df)
        times.append(seconds)
        rss = max(rss, peak)
    return min(times), rss


def in_turns(methods: dict[str, Callable], df, rows: int,
             check: Callable[[str], Callable | None] | None,
             rounds: int) -> dict[str, tuple[float, float]]:
    """Rows/s and peak worker RSS of each method's best run, the methods taking turns for
    ``rounds`` rounds, each run after its own :func:`warm_up`; the first round checks
    each method's warm-up predictions with ``check(method)`` (None: not checked)."""
    best: dict[str, tuple[float, float]] = {}
    for r in range(rounds):
        for name, scored in methods.items():
            checker = check(name) if check is not None and r == 0 else None
            seconds, rss = time_action(scored, df, checker, runs=1)
            if name not in best or rows / seconds > best[name][0]:
                best[name] = (rows / seconds, rss)
    return best


def rows_per_second(call: Callable[[], Any], rows: int, seconds: float,
                    first: Callable[[], Any] | None = None) -> float:
    """Rows/s of ``call()`` (``rows`` rows per call) in this process for ``seconds``,
    after one untimed call of ``first`` (``call`` itself by default: the tracing)."""
    (first or call)()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        done += rows
    return done / (time.perf_counter() - start)
