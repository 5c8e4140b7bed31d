"""Where executors get spark_keras from, and what that means for the preloading daemon.

Three ways (README, "Deploying"): installed in the executors' Python (an image, or a
packed environment shipped with ``spark.archives``); as pure-Python code with
``--py-files`` (``spark.submit.pyFiles``) when the executors already have TensorFlow and
Keras; or, on Spark Connect, with ``spark.addArtifacts(path, pyfile=True)``.

The preloading daemon (``spark.python.daemon.module=spark_keras.spark.daemon``) is started
by the executor as ``python -m spark_keras.spark.daemon`` before any task: files shipped
with ``--py-files`` are put on a worker's ``sys.path`` by each task, too late for it. With
the package only in ``--py-files``, every Python task would fail with "No module named
spark_keras"; :func:`check_daemon` says so on the driver, before any task runs.
"""

from __future__ import annotations

import logging
import os
import zipfile
from typing import Any

from ..errors import SparkKerasError

logger = logging.getLogger("spark_keras")

DAEMON_CONF = "spark.python.daemon.module"
PY_FILES_CONF = "spark.submit.pyFiles"


def check_daemon(sc: Any) -> None:
    """Refuse a session whose executors would start spark_keras's daemon while the
    package reaches them only through ``--py-files`` (see the module docstring)."""
    conf = sc.getConf()
    daemon = conf.get(DAEMON_CONF, "") or ""
    if not daemon.startswith("spark_keras"):
        return
    shipped = [p for p in (conf.get(PY_FILES_CONF, "") or "").split(",") if _holds_package(p)]
    if shipped:
        raise SparkKerasError(
            f"{DAEMON_CONF}={daemon}, but spark_keras reaches the executors through "
            f"--py-files ({', '.join(shipped)}), which each task adds to sys.path only after "
            f"the daemon has started: every Python task would fail with 'No module named "
            f"spark_keras'. Install spark-keras in the executors' Python (or ship a packed "
            f"environment with spark.archives), or drop {DAEMON_CONF} (the stock "
            f"pyspark.daemon then starts the workers)")


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
