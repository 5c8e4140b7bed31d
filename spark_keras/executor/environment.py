"""Where executors get spark_keras from, and what that means for the preloading daemon.

Three ways (docs/guide/deploying.md): installed in the executors' Python (an image, or a
packed environment shipped with ``spark.archives``); as pure-Python code with
``--py-files`` (``spark.submit.pyFiles``) when the executors already have TensorFlow and
Keras; or, on Spark Connect, with ``spark.addArtifacts(path, pyfile=True)``.

The preloading daemon (``spark.python.daemon.module=spark_keras.executor.daemon``) is started
by the executor as ``python -m spark_keras.executor.daemon`` before any task: files shipped
with ``--py-files`` are put on a worker's ``sys.path`` by each task, too late for it. With
the package only in ``--py-files``, every Python task would fail with "No module named
spark_keras"; :func:`check_daemon` says so on the driver, before any task runs.

The executors' Python must be one that imports spark_keras (``PYSPARK_PYTHON``; PySpark
starts ``python3`` from PATH without it): :func:`check_workers_python` finds out before
any task runs. On a local master the workers run on this machine, so it runs the
interpreter Spark will start; on a cluster one small probe task per application says,
and a failure is one :class:`~spark_keras.errors.SparkKerasError` naming the setting
instead of a Java trace per task.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from typing import Any

from spark_keras.errors import WorkersPythonError

logger = logging.getLogger("spark_keras")

DAEMON_CONF = "spark.python.daemon.module"
PY_FILES_CONF = "spark.submit.pyFiles"
# what a worker's Python must import; it prints the versions the driver compares
_PROBE = ("import sys, pyspark, spark_keras; "
          "print(spark_keras.__version__, pyspark.__version__, *sys.version_info[:2])")
PROBE_TIMEOUT = 120.0  # seconds for the local interpreter to answer
# (python executable, master, application) -> checked already in this driver
_checked: set[tuple[str, str, str]] = set()
_checked_lock = threading.Lock()


def check_environment(sc: Any) -> None:
    """Everything the driver can check about the executors before any task runs:
    :func:`check_daemon`, then :func:`check_workers_python`."""
    check_daemon(sc)
    check_workers_python(sc)


def check_workers_python(sc: Any) -> None:
    """Make sure the executors' Python imports spark_keras and the driver's PySpark.

    On a local master (``local``, ``local[N]``, ``local-cluster[...]``) the interpreter
    Spark will start (``sc.pythonExec``: ``PYSPARK_PYTHON``, else ``python3`` from PATH)
    is run here once. It cannot be swapped afterwards: DataFrames made from Python data
    already hold functions bound to it. On a cluster, one task per application imports
    the package. Either way a failure is one error naming the setting, not a Java trace
    per task.

    Raises:
        WorkersPythonError: the workers' Python cannot import spark_keras, or its PySpark's
            version differs from the driver's (major.minor).
    """
    exec_ = getattr(sc, "pythonExec", None) or "python3"
    master = str(sc.master)
    with _checked_lock:
        key = (exec_, master, str(sc.applicationId))
        if key in _checked:
            return
        local = _local_python(sc, exec_) if master.startswith("local") else None
        if local is not None:
            _check_local(exec_, *local)
        else:
            _check_remote(sc, exec_)
        _checked.add(key)


def _local_python(sc: Any, exec_: str) -> tuple[str, dict[str, str]] | None:
    """On a local master: the interpreter a worker runs (found on PATH if a bare name)
    and the environment Spark gives it (``spark.executorEnv.*``, ``--py-files`` entries
    on ``PYTHONPATH``); None where the driver cannot stand in for it (a path relative to
    the executor's folder: an archive's Python)."""
    if not os.path.isabs(exec_) and os.sep in exec_:
        return None
    path = exec_ if os.path.isabs(exec_) else shutil.which(exec_)
    if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
        unset = "" if "PYSPARK_PYTHON" in os.environ else " (PYSPARK_PYTHON is unset)"
        raise WorkersPythonError(
            f"Spark's Python workers would run {exec_!r}{unset}, which "
            f"{'is not on PATH' if path is None else 'is not an executable file'}: set "
            f"PYSPARK_PYTHON to a Python that has spark-keras installed before the "
            f"SparkSession starts, e.g. os.environ['PYSPARK_PYTHON'] = sys.executable "
            f"({sys.executable}), or spark.pyspark.python with spark-submit")
    conf = sc.getConf()
    env = dict(os.environ)
    executor_env = {key[len("spark.executorEnv."):]: value for key, value in conf.getAll()
                    if key.startswith("spark.executorEnv.")}
    env.update(executor_env)
    # as Spark's worker factory joins them: PySpark's zips and --py-files, the executors'
    # PYTHONPATH setting, then the PYTHONPATH the JVM (here, a local master) inherited
    files = [p.strip().removeprefix("file:") for p in (conf.get(PY_FILES_CONF, "") or "").split(",")]
    extra = _spark_python_zips() + [p for p in files if p and os.path.exists(p)]
    extra += [p for p in (executor_env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")) if p]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join(extra)
    return path, env


def _spark_python_zips() -> list[str]:
    """PySpark's and Py4J's zips, which Spark puts on every worker's PYTHONPATH."""
    import glob

    import pyspark

    homes = [os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")]
    if os.environ.get("SPARK_HOME"):
        homes.insert(0, os.path.join(os.environ["SPARK_HOME"], "python", "lib"))
    for home in homes:
        found = sorted(glob.glob(os.path.join(glob.escape(home), "*.zip")))
        if found:
            return found
    return []


def _check_local(exec_: str, path: str, env: dict[str, str]) -> None:
    try:
        done = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        logger.warning("the workers' Python %s did not answer within %.0f s: not checked",
                       path, PROBE_TIMEOUT)
        return
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit status {done.returncode}"
        unset = "" if "PYSPARK_PYTHON" in os.environ else " (PYSPARK_PYTHON is unset: PATH's python3)"
        raise WorkersPythonError(
            f"Spark's Python workers run {exec_!r}{unset}, which cannot import spark_keras "
            f"({why}): set PYSPARK_PYTHON to a Python that has spark-keras installed before "
            f"the SparkSession starts, e.g. os.environ['PYSPARK_PYTHON'] = sys.executable "
            f"({sys.executable}) on a local master, or spark.pyspark.python with spark-submit")
    _compare(done.stdout.split(), exec_)


def _compare(versions: list[str], exec_: str) -> None:
    """Refuse a workers' PySpark of another major.minor than the driver's."""
    import pyspark

    theirs, ours = versions[1], pyspark.__version__
    if theirs.split(".")[:2] != ours.split(".")[:2]:
        raise WorkersPythonError(f"Spark's Python workers ({exec_}) have PySpark {theirs}, the "
                              f"driver {ours}: install the same PySpark in both")


def _versions_in_task(_: Any) -> list[list[str]]:
    """In a worker: what :data:`_PROBE` prints (this module imported: the package is there)."""
    import pyspark

    from spark_keras._version import __version__

    return [[__version__, pyspark.__version__, *map(str, sys.version_info[:2])]]


def _check_remote(sc: Any, exec_: str) -> None:
    try:
        versions = sc.parallelize([0], 1).mapPartitions(_versions_in_task).collect()[0]
    except Exception as exc:  # Py4JJavaError: the worker's traceback, in Java's
        text = str(exc)
        missing = "No module named" in text or "ModuleNotFoundError" in text
        causes = [line.strip() for line in text.splitlines()
                  if "No module named" in line or line.startswith("Caused by: ")]
        # the module missing, else the root cause (Py4J's first line names a Java call)
        first = next((c for c in causes if "No module named" in c),
                     causes[-1].removeprefix("Caused by: ") if causes
                     else text.splitlines()[0] if text else "")
        if not missing:
            raise WorkersPythonError(f"a probe task on master {sc.master} failed before "
                                     f"any model was shipped: {first}") from exc
        raise WorkersPythonError(
            f"the executors' Python ({exec_}) cannot import spark_keras ({first}): set "
            f"PYSPARK_PYTHON / spark.pyspark.python to a Python that has spark-keras "
            f"installed (an image, or a packed environment with spark.archives)") from None
    _compare(versions, exec_)


def check_daemon(sc: Any) -> None:
    """Refuse a session whose executors would start a spark_keras daemon that does not
    exist (an old module path), or spark_keras's daemon while the package reaches them
    only through ``--py-files`` (see the module docstring)."""
    conf = sc.getConf()
    daemon = conf.get(DAEMON_CONF, "") or ""
    if not daemon.startswith("spark_keras"):
        return
    if daemon.split(".")[0] == "spark_keras" and not _has_module(daemon):
        raise WorkersPythonError(
            f"{DAEMON_CONF}={daemon}: spark_keras has no such module (a setting of another "
            f"version?): every executor would fail to start its Python workers. The "
            f"preloading daemon is {__package__}.daemon (`spark-keras conf` prints the "
            f"settings), or drop {DAEMON_CONF} for the stock pyspark.daemon")
    shipped = [p for p in (conf.get(PY_FILES_CONF, "") or "").split(",") if _holds_package(p)]
    if shipped:
        raise WorkersPythonError(
            f"{DAEMON_CONF}={daemon}, but spark_keras reaches the executors through "
            f"--py-files ({', '.join(shipped)}), which each task adds to sys.path only after "
            f"the daemon has started: every Python task would fail with 'No module named "
            f"spark_keras'. Install spark-keras in the executors' Python (or ship a packed "
            f"environment with spark.archives), or drop {DAEMON_CONF} (the stock "
            f"pyspark.daemon then starts the workers)")


def _has_module(name: str) -> bool:
    """True if this driver's Python finds module ``name`` (the executors run the same
    spark_keras version: :func:`check_workers_python` compares them)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _holds_package(entry: str) -> bool:
    """True if the ``--py-files`` entry puts the spark_keras package on a task's
    ``sys.path``: a local zip (or egg, wheel) with ``spark_keras/__init__.py`` at its
    root, or a local folder that is the package or holds it. Decided by what the entry
    holds, not its name (a user's ``spark_keras_udfs.py`` is not the package); an entry
    the driver cannot read (``hdfs:``, ``s3a:``, ``http:``...) is not looked into."""
    path = entry.strip()
    for scheme in ("file:", "local:"):
        if path.startswith(scheme):
            path = "/" + path[len(scheme):].lstrip("/")
    if not path or "://" in path:
        if path:
            logger.debug("--py-files entry %s not looked into (not a local path)", path)
        return False
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "spark_keras", "__init__.py")) or (
            os.path.basename(os.path.normpath(path)) == "spark_keras"
            and os.path.isfile(os.path.join(path, "__init__.py")))
    if not os.path.isfile(path) or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return "spark_keras/__init__.py" in archive.namelist()
