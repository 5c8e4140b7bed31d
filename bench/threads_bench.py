"""`python -m bench --only threads` (or `python -m bench.threads_bench [--quick]`).

``BroadcastModel.transform`` throughput on local[2] with TensorFlow's thread pools sized
by spark_keras to each task's CPUs (the default: one intra-op and one inter-op thread per
worker here) against TensorFlow's own defaults (``SPARK_KERAS_TF_THREADS=off``: every worker
sizes its pools to all cores).

Each mode runs in its own session (thread pools are fixed per Python worker), after a
warm-up that builds the model in every worker; best of three timed runs written to the
``noop`` sink. The pool sizes printed are the ones the workers' build log recorded.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODES = {"TensorFlow defaults (all cores)": "off", "task's CPUs (spark_keras default)": "task"}


def session(threads: str, build_log: str):
    """local[2] like bench.sessions.local_session, without its pinned TF_NUM_*_THREADS."""
    from pyspark.sql import SparkSession

    from bench.sessions import worker_paths

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # as local_session: this venv's workers
    builder = (SparkSession.builder.master("local[2]").appName("threads-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "4g")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.python.daemon.module", "spark_keras.executor.daemon")
               .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
               .config("spark.executorEnv.SPARK_KERAS_TF_THREADS", threads)
               .config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", build_log))
    for key, value in worker_paths().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def measure(threads: str, rows: int, features: int, repeats: int) -> dict:
    import keras
    import numpy as np

    import spark_keras as sk
    from spark_keras.cache import read_build_log

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(8)])
    with tempfile.TemporaryDirectory(prefix="threads-bench-") as log:
        spark = session(threads, log)
        try:
            x = np.random.default_rng(0).standard_normal((rows, features)).astype("float32")
            df = spark.createDataFrame([(i, x[i].tolist()) for i in range(rows)],
                                       "id long, features array<float>").repartition(8).cache()
            df.count()
            bm = sk.BroadcastModel(spark, model)
            out = bm.transform(df.limit(64), "features").toPandas().sort_values("id")  # warm-up
            np.testing.assert_allclose(np.stack(out["prediction"]), np.asarray(model(x[out["id"]])),
                                       atol=1e-4)
            bm.transform(df, "features").write.format("noop").mode("overwrite").save()
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                bm.transform(df, "features").write.format("noop").mode("overwrite").save()
                times.append(time.perf_counter() - started)
            pools = {(r.get("intra_op_threads"), r.get("inter_op_threads"))
                     for r in read_build_log(log) if r["key"].startswith(bm.key)}
        finally:
            spark.stop()
    return {"rows/s": rows / min(times), "pools": sorted(pools)}


def run(quick: bool = False, repeats: int = 3) -> list[dict]:
    """One row per mode: rows/s of transform, the pools the workers used, the ratio to
    TensorFlow's defaults (the ``threads`` section of ``python -m bench``)."""
    rows = 4_000 if quick else 100_000
    results = {name: measure(mode, rows, 256, 1 if quick else repeats) for name, mode in MODES.items()}
    base = results["TensorFlow defaults (all cores)"]["rows/s"]
    return [{"TensorFlow thread pools": name, "rows": rows,
             "(intra, inter) per worker": ", ".join(f"({a}, {b})" for a, b in r["pools"]),
             "rows/s": r["rows/s"], "x defaults": r["rows/s"] / base}
            for name, r in results.items()]


def main(argv: list[str] | None = None) -> int:
    from bench.report import section_main

    return section_main("python -m bench.threads_bench", "transform of a 256-512-512-8 MLP", run,
                        "{:,.2f}", argv)


if __name__ == "__main__":
    sys.exit(main())
