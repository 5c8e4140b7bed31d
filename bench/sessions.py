"""The benchmarks' local Spark sessions: the scoring section's, and one with the settings
of conf/spark-defaults.conf (the cold-start and stream-rebuild benchmarks'); and when a
worker process was forked."""

from __future__ import annotations

import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")


def worker_paths() -> dict[str, str]:
    """Executor settings so Python workers import the spark_keras the driver imports: the
    PYTHONPATH entries first (``PYTHONPATH=<older checkout> python -m bench`` measures that
    one), then this checkout, and not their working directory (PYTHONSAFEPATH)."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"spark.executorEnv.PYTHONPATH": os.pathsep.join([*paths, ROOT]),
            "spark.executorEnv.PYTHONSAFEPATH": "1"}


def local_session(app: str, *, driver_memory: str = "6g", master: str = "local[2]",
                  **conf: str) -> Any:
    """A ``master`` (``local[2]``) session whose workers run this venv's Python with one
    TensorFlow and OpenMP thread each (as conf/spark-defaults.conf sets them), plus ``conf``."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", driver_memory)
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.KERAS_BACKEND", "tensorflow")
               .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
               .config("spark.executorEnv.TF_NUM_INTRAOP_THREADS", "1")
               .config("spark.executorEnv.TF_NUM_INTEROP_THREADS", "1")
               .config("spark.executorEnv.OMP_NUM_THREADS", "1"))
    for key, value in {**worker_paths(), **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_seconds(pid: int | str = "self") -> float:
    """When process ``pid`` started (forked), in seconds since boot, as
    ``time.clock_gettime(CLOCK_BOOTTIME)`` counts (1/CLK_TCK resolution)."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[19]) / CLK_TCK  # field 22, starttime


def scoring_session(master: str = "local[2]") -> Any:
    """The scoring section's local session (also the inputs and memory sections'), whose
    Python workers run this venv's Python, reused across tasks."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's Python
    return (SparkSession.builder.master(master).appName("spark-keras-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "6g")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.python.worker.reuse", "true")
            .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
            .config(map=worker_paths())
            .getOrCreate())
