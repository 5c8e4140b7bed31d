"""Scoring throughput of the non-UDF front-ends, each through its public API, against the
model alone, side by side in one run, on the scoring section's MLP (64 float32 features,
batch size 1024):

- ``df.select("features").rdd.mapPartitions(bm.predict_partition).count()`` on local[2]
  (a cached DataFrame of 4 partitions, one ``array<float>`` column), after a warm-up;
- ``spark_keras.multiprocessing.pool_predict(model, x, processes=2)`` on a numpy array,
  pool start included: every call spawns its pool;
- ``spark_keras.dask.predict_dask(ship(client, model), ...)`` on a dask array and on a
  dask DataFrame of 64 scalar columns (both persisted on a 2-worker LocalCluster, 4
  chunks), ``.compute()`` after a warm-up compute;
- the raw model: ``model(x, training=False)`` in this process on numpy batches.

Only calls that exist in older versions of spark_keras too, so that
``PYTHONPATH=<old checkout> python -m bench --only frontends`` measures that version: the
Spark session puts the PYTHONPATH entries first in its workers' path (and, with
PYTHONSAFEPATH, not their working directory), Dask workers and pool processes are spawned
with this process's path; the section checks that the Spark and Dask workers import the
same ``spark_keras`` file as this process. Each front-end's
predictions are checked against ``model.predict`` on a few rows (:class:`PredictionMismatch`).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import numpy as np

from bench.frames import PredictionMismatch, Workload, make_frame
from bench.harness import rows_per_second, sample
from bench.models import mlp_model
from bench.sessions import local_session

FEATURES, BATCH, PARTITIONS = 64, 1024, 4


def rows_for(quick: bool) -> int:
    return 2_000 if quick else 200_000


def _spark_keras_file() -> str:
    import spark_keras

    return spark_keras.__file__


def _same_package(where: str, files: list[str]) -> None:
    if set(files) != {_spark_keras_file()}:
        raise RuntimeError(f"{where} import spark_keras from {sorted(set(files))}, this process "
                           f"from {_spark_keras_file()}")


def check(name: str, got: Any, expected: np.ndarray, atol: float = 1e-4) -> None:
    got = np.asarray(got, dtype=np.float64).reshape(expected.shape)
    if not np.allclose(got, expected, rtol=0, atol=atol):
        bad = int(np.argmax(np.abs(got - expected).max(axis=1)))
        raise PredictionMismatch(f"{name}: predictions differ from model.predict (atol {atol}); "
                                 f"row {bad}: {got[bad]} instead of {expected[bad]}")


def best_of(times: int, action: Callable[[], Any], before: Callable[[], Any] = lambda: None) -> float:
    seconds = []
    for _ in range(times):
        before()
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def raw_rows_per_second(model, x: np.ndarray, seconds: float) -> float:
    """``model(x, training=False)`` on numpy batches in this process, for ``seconds``."""
    x = x[: 20 * BATCH]

    def batches() -> None:
        for i in range(0, len(x), BATCH):
            np.asarray(model(x[i:i + BATCH], training=False))

    return rows_per_second(batches, len(x), seconds,
                           first=lambda: np.asarray(model(x[:BATCH], training=False)))  # build, warm up


def spark_predict_partition(model, rows: int, runs: int = 2) -> float:
    """Seconds of ``rdd.mapPartitions(bm.predict_partition).count()``, best of ``runs``, after
    the check on every 20th row (from every partition) warmed both workers up."""
    import spark_keras as sk

    spark = local_session("spark-keras-bench-frontends")  # workers: sessions.worker_paths
    try:
        sc = spark.sparkContext
        _same_package("Spark workers", sc.parallelize(range(2), 2).map(
            lambda _: _spark_keras_file()).collect())
        df = make_frame(spark, Workload("MLP", mlp_model, (FEATURES,), rows, BATCH, ("array",)),
                        "array", partitions=PARTITIONS)
        bm = sk.BroadcastModel(spark, model)
        predict = functools.partial(bm.predict_partition, batch_size=BATCH)
        few = sample(df).select("features")
        x = np.array([r.features for r in few.collect()], dtype=np.float32)
        check("predict_partition", few.rdd.mapPartitions(predict).collect(),
              model.predict(x, batch_size=BATCH, verbose=0))
        rdd = df.select("features").rdd
        return best_of(runs, lambda: rdd.mapPartitions(predict).count())
    finally:
        spark.stop()


def pool(model, x: np.ndarray, few: np.ndarray, expected: np.ndarray, runs: int = 2) -> float:
    """Seconds of ``pool_predict``, pool start included, best of ``runs``."""
    from spark_keras.multiprocessing import pool_predict

    out = []
    seconds = best_of(runs, lambda: out.append(pool_predict(model, x, processes=2, batch_size=BATCH)))
    for y in out:
        check("pool_predict", y[few], expected)
    return seconds


def _settle(client, keys: int, timeout: float = 30.0) -> None:
    """Wait until the scheduler holds ``keys`` keys again: it drops a compute's results a
    moment after returning them, and a compute of the same graph before that would only
    fetch them."""
    deadline = time.monotonic() + timeout
    while len(client.who_has()) > keys and time.monotonic() < deadline:
        time.sleep(0.02)


def dask(model, x: np.ndarray, few: np.ndarray, expected: np.ndarray,
         runs: int = 2) -> dict[str, float]:
    """Seconds of ``predict_dask(...).compute()`` on a dask array and on a dask DataFrame
    of scalar columns (both persisted on the workers), best of ``runs`` after a warm-up."""
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd
    from distributed import Client, LocalCluster, wait

    from spark_keras.dask import predict_dask, ship

    chunk = -(-len(x) // PARTITIONS)
    columns = [f"f{j}" for j in range(FEATURES)]
    out = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        _same_package("Dask workers", list(client.run(_spark_keras_file).values()))
        handle = ship(client, model)
        inputs = {"dask array": (da.from_array(x, chunks=(chunk, FEATURES)), {}),
                  "dask DataFrame": (dd.from_pandas(pd.DataFrame(x, columns=columns), chunksize=chunk),
                                     {"columns": columns})}
        inputs = {name: (client.persist(collection), kw) for name, (collection, kw) in inputs.items()}
        wait([collection for collection, _ in inputs.values()])
        keys = len(client.who_has())  # the inputs'
        for name, (collection, kw) in inputs.items():
            scored = predict_dask(handle, collection, batch_size=BATCH, **kw)
            y = scored.compute()  # warm-up: every worker builds the model
            check(f"predict_dask ({name})", np.asarray(y)[few], expected)
            out[name] = best_of(runs, scored.compute, before=lambda: _settle(client, keys))
    return out


def run(quick: bool = False) -> list[dict]:
    """One row per front-end: best seconds, rows/s and the ratio to the raw model."""
    import keras

    print(f"spark_keras: {_spark_keras_file()}")
    rows = rows_for(quick)
    runs = 1 if quick else 2  # timed runs per front-end (a quick run is a smoke test)
    model = mlp_model()
    x = np.random.default_rng(0).random((rows, FEATURES), dtype=np.float32)
    few = np.arange(0, rows, max(1, rows // 16))
    expected = model.predict(x[few], batch_size=BATCH, verbose=0)
    raw = raw_rows_per_second(model, x, seconds=1.0 if quick else 4.0)
    measured = {("BroadcastModel.predict_partition (rdd.mapPartitions, local[2])",
                 f"array<float> column, {PARTITIONS} partitions"): spark_predict_partition(model, rows, runs),
                ("pool_predict (processes=2, pool start included)", "numpy array"):
                    pool(model, x, few, expected, runs)}
    for name, seconds in dask(model, x, few, expected, runs).items():
        measured[("predict_dask (LocalCluster, 2 workers)", f"{name}, {PARTITIONS} chunks")] = seconds
    out = [{"front-end": "raw model (1 process)", "input": f"numpy batches of {BATCH}",
            "rows": rows, "best s": None, "rows/s": raw, "x raw": 1.0}]
    out += [{"front-end": name, "input": variant, "rows": rows, "best s": seconds,
             "rows/s": rows / seconds, "x raw": rows / seconds / raw}
            for (name, variant), seconds in measured.items()]
    keras.backend.clear_session()
    return out
