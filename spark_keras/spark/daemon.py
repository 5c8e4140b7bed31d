"""Spark's Python worker daemon with TensorFlow and Keras already imported.

    spark.python.daemon.module=spark_keras.spark.daemon

Spark forks every Python worker of an executor from one daemon process (by default
``pyspark.daemon``), at the first task, again after a worker sat idle for a minute, after
a task that stopped early, and for every task with ``spark.python.worker.reuse=false``.
Each fresh worker then imports TensorFlow and Keras: seconds of CPU and hundreds of MB.
This daemon imports them once, before it forks, then runs the stock daemon: workers start
with Keras (or tf-keras under ``TF_USE_LEGACY_KERAS=1``, on the backend ``KERAS_BACKEND``
selects), the ``SPARK_KERAS_PRELOAD`` modules and spark_keras's own worker code imported,
their pages shared copy-on-write with the daemon.

Forking is only safe when the parent runs no other thread (a lock one holds would stay
locked in every child) and has not initialized TensorFlow's runtime (its thread pools and
eager context do not survive a fork) nor its devices (listing them initializes CUDA on a
GPU host). Importing does none of these; the daemon checks all three after preloading
(counting the threads preloading started: one that ran before, an allocator's thread from
``LD_PRELOAD`` say, runs in the stock daemon too), and otherwise replaces itself with the
stock daemon (same process, same pipes, nothing written yet), logging one line saying
why. So does a failed import, and a PySpark whose daemon it does not know. Arrow's
allocator starts a background thread when pyarrow loads (Keras imports pandas, pandas
imports pyarrow); it is turned off while the daemon preloads
(``JE_ARROW_MALLOC_CONF=background_thread:false``, unless you set it), as it would be in
any forked worker, and nothing imports pyarrow before that (``spark_keras.spark`` loads
its modules on first use).

While it preloads, anything printed goes to stderr (stdout is how the daemon tells Spark
its port), less TensorFlow's native start-up lines that ``TF_CPP_MIN_LOG_LEVEL`` hides but
TensorFlow prints before reading it (:mod:`spark_keras.quiet`):
with ``spark.executorEnv.TF_CPP_MIN_LOG_LEVEL=2`` (conf/spark-defaults.conf), an executor
prints no absl or oneDNN start-up lines.

Before forking, the daemon freezes its objects out of the garbage collector's reach
(:mod:`spark_keras.heap`): a worker's collections then neither walk TensorFlow's objects
nor write to, and so copy, the pages it shares with the daemon.

``SPARK_KERAS_DAEMON_REPORT=<folder>`` (executor environment) makes each daemon write
``daemon-<pid>.json``: what it preloaded, in how long, and what the fork checks found.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import sys
import threading
import time
from typing import Any, Iterator

from .. import heap

logger = logging.getLogger("spark_keras")

REPORT_ENV = "SPARK_KERAS_DAEMON_REPORT"
STOCK_DAEMON = "pyspark.daemon"
_JEMALLOC_ENV = "JE_ARROW_MALLOC_CONF"
# spark_keras's own worker-side modules (the stock daemon imports pyspark.worker only
# after each fork: we import it once, before)
_WORKER_MODULES = ("pyspark.worker", "spark_keras.payload.codec", "spark_keras.spark.scoring",
                   "spark_keras.inference.outputs")


def native_threads() -> list[str]:
    """The names of this process's threads, as the kernel lists them (C threads too)."""
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
    return names


def tensorflow_runtime_started() -> bool:
    """True if TensorFlow's eager context (and with it its thread pools) exists."""
    context = sys.modules.get("tensorflow.python.eager.context")
    ctx = getattr(context, "_context", None)
    return ctx is not None and getattr(ctx, "_context_handle", None) is not None


def tensorflow_devices_listed() -> bool:
    """True if TensorFlow enumerated its physical devices (which initializes CUDA on a
    GPU host: a CUDA context does not survive a fork)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    ctx = getattr(context, "_context", None)
    return ctx is not None and getattr(ctx, "_physical_devices", None) is not None


def preload_for_fork() -> dict[str, Any]:
    """Import everything a worker needs; a report whose ``refused`` says why forking
    from this process would be unsafe (None when it is safe)."""
    from .. import flavour
    from ..preload import preload

    started = time.perf_counter()
    report: dict[str, Any] = {"pid": os.getpid(), "threads_before": native_threads()}
    try:
        with _stdout_to_stderr(), _no_allocator_thread():
            names = preload()
            for module in _WORKER_MODULES:
                __import__(module)
        fl = flavour.current()
        report.update(keras=f"{fl.name} {fl.version}", backend=fl.backend, preloaded=names)
    except Exception as exc:  # any failure: the stock daemon, not a broken executor
        report["refused"] = f"preloading failed: {type(exc).__name__}: {exc}"
    report.update(seconds=round(time.perf_counter() - started, 3),
                  threads=native_threads(),
                  python_threads=[t.name for t in threading.enumerate()],
                  tensorflow_runtime_started=tensorflow_runtime_started(),
                  tensorflow_devices_listed=tensorflow_devices_listed())
    if "refused" not in report:
        if report["tensorflow_runtime_started"]:
            report["refused"] = "preloading started TensorFlow's runtime (an op ran at import)"
        elif report["tensorflow_devices_listed"]:
            report["refused"] = ("preloading listed TensorFlow's devices (which initializes CUDA "
                                 "on a GPU host)")
        elif _started_threads(report["threads_before"], report["threads"]) \
                or len(report["python_threads"]) > 1:
            report["refused"] = f"preloading left {len(report['threads'])} threads running " \
                                f"(Python threads: {', '.join(report['python_threads'])})"
    report.setdefault("refused", None)
    return report


def _started_threads(before: list[str], after: list[str]) -> list[str]:
    """The threads running after preloading that did not run before it. One that ran
    before (an allocator's thread from ``LD_PRELOAD``, say) runs in the stock daemon too."""
    return list((collections.Counter(after) - collections.Counter(before)).elements())


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Keep file descriptor 1 clean: the daemon tells Spark its port through it."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _no_allocator_thread() -> Iterator[None]:
    """No jemalloc background thread in Arrow's allocator while it initializes here."""
    if _JEMALLOC_ENV in os.environ:
        yield
        return
    os.environ[_JEMALLOC_ENV] = "background_thread:false"
    try:
        yield
    finally:
        del os.environ[_JEMALLOC_ENV]


def _write_report(report: dict[str, Any]) -> None:
    folder = os.environ.get(REPORT_ENV)
    if folder:
        with contextlib.suppress(OSError):
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"daemon-{os.getpid()}.json"), "w") as f:
                json.dump(report, f)


def _stock_daemon(reason: str) -> None:
    """Become ``python -m pyspark.daemon`` (same pid, same pipes); does not return."""
    logging.basicConfig()
    logger.warning("spark_keras daemon: %s; using the stock PySpark daemon", reason)
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", STOCK_DAEMON, *sys.argv[1:]])


def main() -> None:
    try:
        from pyspark.daemon import manager
    except ImportError as exc:
        _stock_daemon(f"this PySpark has no pyspark.daemon.manager ({exc})")
        return
    report = preload_for_fork()
    if not report["refused"]:
        # the preloaded objects move to a generation the collector never visits, so a
        # worker's collections do not touch (and copy) the pages it shares with the daemon
        report["gc_frozen_objects"] = heap.freeze(collect=False)  # imports leave no cycles
    _write_report(report)
    if report["refused"]:
        _stock_daemon(report["refused"])
        return
    manager()


if __name__ == "__main__":
    main()
