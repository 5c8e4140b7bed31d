"""Spark's Python worker daemon with TensorFlow and Keras already imported.

    spark.python.daemon.module=spark_keras.executor.daemon

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
GPU host). Importing starts neither, but it does start threads: OpenBLAS (numpy's, and
scipy's own copy, which TensorFlow's imports load) starts ``OMP_NUM_THREADS - 1`` idle
pool threads as it loads, and Spark gives the daemon ``OMP_NUM_THREADS=<task CPUs>``.
Those are safe: OpenBLAS's thread server registers a ``pthread_atfork`` handler that
stops its pool before every fork (its threads are joined, so none runs when the process
forks; its next BLAS call starts the pool again). An OpenMP runtime's pool (libgomp's has
no such handler) or any other thread is not.

So after preloading, if more than one thread runs, the daemon forks a child that exits at
once, which runs every fork handler, and refuses to fork workers if a thread preloading
started still runs after that (threads are told apart by their kernel ids: OpenBLAS's
have the main thread's name). A thread that ran before preloading, an allocator's thread
from ``LD_PRELOAD`` say, runs in the stock daemon too and does not count. The daemon's
BLAS pools stay stopped (it makes no BLAS call); a worker's pool starts at its first BLAS
call with the size OpenBLAS read from ``OMP_NUM_THREADS`` when it loaded in the daemon:
Spark starts one daemon per worker environment, so that is the task's CPUs, as in a
worker that imports numpy itself. The daemon also refuses if preloading started a Python
thread, TensorFlow's runtime or listed its devices, or an import failed, and so does a
PySpark whose daemon it does not know: it then replaces itself with the stock daemon
(same process, same pipes, nothing written yet), logging one line saying why. Arrow's
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
nor write to, and so copy, the pages it shares with the daemon (and a worker never
unfreezes them: see :func:`spark_keras.heap.inherited`).

``SPARK_KERAS_DAEMON_REPORT=<folder>`` (executor environment) makes each daemon write
``daemon-<pid>.json``: what it preloaded, in how long, and what the fork checks found.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Iterator

from spark_keras import heap

logger = logging.getLogger("spark_keras")

REPORT_ENV = "SPARK_KERAS_DAEMON_REPORT"
STOCK_DAEMON = "pyspark.daemon"
_JEMALLOC_ENV = "JE_ARROW_MALLOC_CONF"
# spark_keras's own worker-side modules (the stock daemon imports pyspark.worker only
# after each fork: we import it once, before)
_WORKER_MODULES = ("pyspark.worker", "spark_keras.payload.codec", "spark_keras.spark.scoring",
                   "spark_keras.spark.map_partitions", "spark_keras.inference.outputs")
_PROBE_SECONDS = 30.0  # a probe fork's child exits at once; one that hangs is killed


def native_threads() -> list[str]:
    """The names of this process's threads, as the kernel lists them (C threads too)."""
    return list(_threads().values())


def _threads() -> dict[int, str]:
    """This process's threads: kernel thread id to name, by id."""
    found = {}
    for tid in sorted(int(t) for t in os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{tid}/comm") as f:
                found[tid] = f.read().strip()
    return found


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
    from spark_keras import flavour
    from spark_keras.preload import preload

    started = time.perf_counter()
    before = _threads()
    report: dict[str, Any] = {"pid": os.getpid(), "threads_before": list(before.values())}
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
        elif len(report["python_threads"]) > 1:
            report["refused"] = f"preloading left {len(report['threads'])} threads running " \
                                f"(Python threads: {', '.join(report['python_threads'])})"
        else:
            report.update(_threads_across_a_fork(before))
    report.setdefault("refused", None)
    return report


def _threads_across_a_fork(before: dict[int, str]) -> dict[str, Any]:
    """The report's ``threads_at_fork`` (the threads still running after a probe fork has
    run every fork handler, when more than one thread runs), ``fork_probe_seconds``, and a
    ``refused`` reason if a thread preloading started (not in ``before``) survived it."""
    if len(_threads()) == 1:
        return {"threads_at_fork": native_threads(), "fork_probe_seconds": None}
    started = time.perf_counter()
    try:
        with _stdout_to_stderr():
            _probe_fork()
    except OSError as exc:
        return {"refused": f"a probe fork failed: {exc}"}
    after = _threads()
    found = {"threads_at_fork": list(after.values()),
             "fork_probe_seconds": round(time.perf_counter() - started, 3)}
    survivors = [name for tid, name in after.items() if tid not in before]
    if survivors:
        found["refused"] = (f"preloading left {len(after)} threads running across a fork "
                            f"({len(survivors)} started by preloading: {', '.join(survivors)})")
    return found


def _probe_fork() -> None:
    """Fork a child that exits at once, so that every ``pthread_atfork`` handler runs
    here as for a real fork (OpenBLAS's stops its pool, which stays stopped until the next
    BLAS call); wait for it.

    Raises:
        OSError: the fork failed, or the child did not exit in time (it is killed).
    """
    with warnings.catch_warnings():  # Python 3.12+ warns of forking with threads running
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + _PROBE_SECONDS
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise OSError(f"its child {pid} did not exit within {_PROBE_SECONDS:.0f} s")
        time.sleep(0.005)


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
