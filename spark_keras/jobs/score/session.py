"""The score job's Spark session: classic (its settings for the executors) or Spark
Connect (a local server started here takes this process's environment).

Settings, strongest first: ``--conf k=v``, ``--properties-file``, spark-submit's own, then
the job's defaults below (each only where nothing above set it)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import urllib.parse
from typing import Any, Mapping

from spark_keras._deps import require
from spark_keras.jobs.score.errors import JobError, reason

__all__ = ["APP_NAME", "DAEMON_MODULE", "classic_session", "connect_session", "settings",
           "jvm_log"]

APP_NAME = "spark-keras-score"
DAEMON_MODULE = "spark_keras.executor.daemon"
LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
# a line of a Java properties file: the key, then '=', ':' or blanks, then the value
_PROPERTY = re.compile(r"([^\s=:]+)\s*[=:\s]\s*(.*)$")
QUIET_LOG_LEVEL = "FATAL"  # Spark's own log lines (INFO, WARN and the tasks' ERROR tracebacks)
# the job's one line says what failed; --verbose keeps Spark's logs and progress bars
QUIET = {"spark.log.level": QUIET_LOG_LEVEL, "spark.ui.showConsoleProgress": "false"}
# seconds the job waits for a standalone master to accept a connection (Spark's own client
# retries registration for 60 s before it gives up)
MASTER_CONNECT_TIMEOUT = 10.0

# the file holding the output of the JVM this process started quietly (see jvm_log)
_jvm_log: str | None = None


def jvm_log() -> str | None:
    """The file the JVM's start-up lines, log4j lines and progress bars went to, when the
    job started its JVM quietly (not under spark-submit, not ``--verbose``); else None."""
    return _jvm_log


def _quiet_gateway() -> None:
    """Start PySpark's JVM with its stdout and stderr in a log file (see :func:`jvm_log`):
    its start-up lines (``Using incubator modules``, the log4j profile, loopback-hostname
    WARNs, ``NativeCodeLoader``) come before any log level can be set. Under spark-submit
    the JVM is already running (its output is spark-submit's): nothing to do."""
    global _jvm_log
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or os.environ.get("PYSPARK_GATEWAY_PORT"):
        return
    fd, path = tempfile.mkstemp(prefix="spark-keras-score-", suffix=".log")
    with os.fdopen(fd, "wb") as log:  # the JVM keeps its own descriptor
        gateway = launch_gateway(popen_kwargs={"stdout": log, "stderr": subprocess.STDOUT})
    _jvm_log = path
    SparkContext._ensure_initialized(gateway=gateway)


def forget_jvm_log() -> None:
    """Remove the JVM's log file (after a job that succeeded: nothing to read there)."""
    global _jvm_log
    if _jvm_log is not None:
        try:
            os.remove(_jvm_log)
        except OSError:
            pass
        _jvm_log = None


def check_master_reachable(master: str, timeout: float = MASTER_CONNECT_TIMEOUT) -> None:
    """Stop the job at once when no master of a ``spark://host:port[,host:port]`` URL
    accepts a connection (Spark's client would retry for a minute, then fail without
    saying where it tried)."""
    if not master.startswith("spark://"):
        return
    failures = []
    for part in master[len("spark://"):].split(","):
        parsed = urllib.parse.urlsplit(f"spark://{part}")
        try:
            host, port = parsed.hostname, parsed.port or 7077
        except ValueError:  # a port that is not a number: Spark names it
            return
        if not host:
            return
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            failures.append(f"{host}:{port} ({exc.strerror or exc})")
    raise JobError(f"cannot reach the Spark master {master!r}: nothing accepts connections at "
                   f"{', '.join(failures)}")


def settings(confs: list[str], properties_file: str | None) -> dict[str, str]:
    """The user's Spark settings: ``properties_file`` (Spark's format: ``key value`` or
    ``key=value`` lines, ``#`` comments) overridden by ``confs`` (``key=value`` each)."""
    out: dict[str, str] = {}
    if properties_file is not None:
        try:
            with open(properties_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError as exc:
            raise JobError(f"--properties-file {properties_file!r}: {exc.strerror}") from exc
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            found = _PROPERTY.match(line)
            if found is None or not found[1].startswith("spark."):
                raise JobError(f"--properties-file {properties_file!r} line {number}: "
                               f"{line!r} is not a 'spark.* value' setting")
            out[found[1]] = found[2].strip()
    for conf in confs:
        key, sep, value = conf.partition("=")
        if not sep or not key.strip():
            raise JobError(f"--conf {conf!r}: expected key=value (e.g. "
                           f"spark.sql.shuffle.partitions=64)")
        out[key.strip()] = value
    return out


def _defaults(verbose: bool) -> dict[str, str]:
    """What the job sets for itself where the user did not."""
    out = {
        # workers fork from a daemon that imported TensorFlow and Keras once
        "spark.python.daemon.module": DAEMON_MODULE,
        # executors must run the driver's Keras flavour (Keras 3 or legacy tf-keras)
        "spark.executorEnv.TF_USE_LEGACY_KERAS": os.environ.get("TF_USE_LEGACY_KERAS", "0"),
        # executors log TensorFlow's native lines as the driver does
        "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": os.environ.get(LOG_LEVEL_ENV, "2"),
    }
    return out if verbose else {**out, **QUIET}


def classic_session(master: str | None, user: Mapping[str, str] | None = None,
                    verbose: bool = False) -> Any:
    """A classic session on ``master`` (default: spark-submit's, else ``local[*]``) with
    the ``user`` settings (see :func:`settings`) and the job's defaults where neither
    they nor spark-submit set one: the preloading daemon, the driver's Keras flavour and
    TensorFlow log level, the job's Python for the executors, Spark's logs off unless
    ``verbose``. A master Spark cannot start on stops the job naming it."""
    require("pyspark", "the score job")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    user = dict(user or {})
    builder = SparkSession.builder.appName(APP_NAME)
    if not verbose:
        _quiet_gateway()
    SparkContext._ensure_initialized()  # the JVM, so SparkConf() sees spark-submit's settings
    conf = SparkConf()
    master = master or user.pop("spark.master", None)
    check_master_reachable(master or conf.get("spark.master", None) or "local[*]")
    if master or not conf.get("spark.master", None):  # spark-submit --master wins
        builder = builder.master(master or "local[*]")
    for key, value in _defaults(verbose).items():
        if key not in user and conf.get(key, None) is None:
            builder = builder.config(key, value)
    for key, value in user.items():
        builder = builder.config(key, value)
    # the executors' Python: PySpark's driver takes it from PYSPARK_PYTHON alone (spark-submit
    # sets it from spark.pyspark.python), else runs the PATH's python3: a --conf given here,
    # else what is set, else this job's own interpreter (which has spark_keras)
    os.environ["PYSPARK_PYTHON"] = user.get("spark.pyspark.python") \
        or os.environ.get("PYSPARK_PYTHON") or conf.get("spark.pyspark.python", None) \
        or sys.executable
    try:
        return builder.getOrCreate()
    except Exception as exc:  # a master URL Spark cannot parse or reach
        name = master or conf.get("spark.master", "local[*]")
        raise JobError(f"cannot start Spark on master {name!r}: {reason(exc)}") from exc


def is_local(remote: str) -> bool:
    """``local``, ``local[N]``...: pyspark starts the Connect server in this process."""
    return remote.startswith("local")


def connect_session(remote: str, user: Mapping[str, str] | None = None,
                    verbose: bool = False) -> Any:
    """A Spark Connect session. Connect ignores ``spark.executorEnv.*``: a local server's
    Python workers get the environment this process has when the server starts. The
    ``user`` settings go to the session (a local server takes them all)."""
    require("pyspark.sql.connect.session", "the score job on Spark Connect", "connect")
    from pyspark.sql import SparkSession

    if is_local(remote):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")  # the driver's Keras flavour
    builder = SparkSession.builder.remote(remote).appName(APP_NAME)
    if is_local(remote):  # a server started here takes our settings; a remote one has its own
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
        for key, value in ({} if verbose else QUIET).items():
            builder = builder.config(key, value)
    for key, value in (user or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
