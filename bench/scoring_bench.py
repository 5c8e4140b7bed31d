"""Scoring throughput on local Spark: spark_keras against the ways people write it today.

All methods run in one Spark session on the same cached DataFrame, each warmed up first
(worker start, TensorFlow import, model build) and then timed (best of two when a run
takes under 8 s), writing to Spark's ``noop`` sink so nothing is collected. Peak RSS per Python worker is read from
/proc/<pid>/status (VmHWM), reset before each method through /proc/<pid>/clear_refs.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Workload:
    name: str
    build: Callable[[], Any]
    input_shape: tuple[int, ...]
    rows: int
    batch_size: int
    variants: tuple[str, ...]  # "array", "scalars", "vector"


def mlp_model():
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)],
                            name="mlp_64_256_256_1")


def actor_model():
    sys.path.insert(0, ROOT)
    from tests.models import actor_cnn

    return actor_cnn()


def workloads(quick: bool) -> list[Workload]:
    if quick:
        return [Workload("MLP", mlp_model, (64,), 1_000, 256, ("array", "scalars", "vector")),
                Workload("CNN", actor_model, (120, 160, 2), 16, 8, ("array",))]
    return [Workload("MLP", mlp_model, (64,), 200_000, 1024, ("array", "scalars", "vector")),
            Workload("CNN", actor_model, (120, 160, 2), 3_000, 64, ("array",))]


# --- Python worker memory ----------------------------------------------------------------

def _worker_pids() -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
            pids.append(int(pid))
    return pids


def reset_peak_rss() -> None:
    for pid in _worker_pids():
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def peak_worker_rss_mb() -> float:
    peak = 0
    for pid in _worker_pids():
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
    return peak / 1024


# --- data ----------------------------------------------------------------------------------

def make_frame(spark, workload: Workload, variant: str, partitions: int = 8):
    """A cached DataFrame of random rows: one array column, scalar columns, or a Vector."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    size = int(np.prod(workload.input_shape))
    base = spark.range(workload.rows, numPartitions=partitions)
    if variant == "scalars":
        cols = [F.rand(seed=j).cast("double").alias(f"f{j}") for j in range(size)]
        df = base.select("id", *cols)
    else:
        feats = F.transform(F.sequence(F.lit(1), F.lit(size)),
                            lambda i: (F.rand(seed=7) * i / size).cast("float"))
        df = base.select("id", feats.alias("features"))
        if variant == "vector":
            df = df.select("id", array_to_vector("features").alias("features"))
    df = df.cache()
    df.count()
    return df


def input_columns(workload: Workload, variant: str) -> list[str]:
    if variant == "scalars":
        return [f"f{j}" for j in range(int(np.prod(workload.input_shape)))]
    return ["features"]


# --- the methods -----------------------------------------------------------------------------

def _series_to_batch(series_list, shape):
    if len(series_list) > 1:  # scalar columns
        return np.stack([s.to_numpy(dtype="float32") for s in series_list], axis=1).reshape((-1, *shape))
    column = series_list[0]
    if hasattr(column, "columns"):  # a Vector arrives as a DataFrame of its struct fields
        column = column["values"]  # (all dense here)
    values = column.to_numpy()
    return np.stack(values).astype("float32").reshape((-1, *shape))


def method_predict_batch_udf(spark, model, workload, variant, cols):
    """pyspark.ml.functions.predict_batch_udf, model rebuilt from broadcast config + weights,
    calling model.predict (how its users write it)."""
    from pyspark.ml.functions import predict_batch_udf, vector_to_array
    from pyspark.sql import functions as F

    bc = spark.sparkContext.broadcast((model.to_json(), model.get_weights()))
    scalar = int(np.prod(model.outputs[0].shape[1:])) == 1

    def make_predict_fn():
        import keras

        config, weights = bc.value
        m = keras.models.model_from_json(config)
        m.set_weights(weights)

        def predict(x):
            y = m.predict(x, verbose=0)
            return y.reshape(-1) if scalar else y

        return predict

    from pyspark.sql.types import ArrayType, FloatType

    udf = predict_batch_udf(make_predict_fn, return_type=FloatType() if scalar else ArrayType(FloatType()),
                            batch_size=workload.batch_size,
                            input_tensor_shapes=[list(workload.input_shape)])
    args = [F.col(c) for c in cols]
    if variant == "scalars":  # what its error message tells users to do
        args = [F.array(*cols).cast("array<float>")]
    elif variant == "vector":
        args = [vector_to_array("features", "float32")]
    return lambda df: df.select("id", udf(*args).alias("prediction"))


def method_closure_pandas_udf(spark, model, workload, variant, cols):
    """A plain pandas_udf with the Keras model captured in its closure, model.predict."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    shape = workload.input_shape
    scalar = int(np.prod(model.outputs[0].shape[1:])) == 1

    def predict(batches: Iterator[Any]) -> Iterator[pd.Series]:
        for batch in batches:
            series = list(batch) if isinstance(batch, tuple) else [batch]
            y = model.predict(_series_to_batch(series, shape), batch_size=workload.batch_size, verbose=0)
            yield pd.Series(y.reshape(-1)) if scalar else pd.Series(list(y))

    from typing import Tuple

    item = pd.Series if len(cols) == 1 else Tuple[(pd.Series,) * len(cols)]
    predict.__annotations__ = {"batches": Iterator[item], "return": Iterator[pd.Series]}
    udf = pandas_udf(predict, "float" if scalar else "array<float>")
    return lambda df: df.select("id", udf(*cols).alias("prediction"))


def method_predict_udf(spark, model, workload, variant, cols):
    import spark_keras as sk

    bm = sk.BroadcastModel(spark, model)
    udf = bm.predict_udf(batch_size=workload.batch_size)
    return lambda df: df.select("id", udf(*cols).alias("prediction"))


def method_transform(spark, model, workload, variant, cols):
    import spark_keras as sk

    bm = sk.BroadcastModel(spark, model)
    return lambda df: bm.transform(df, cols, batch_size=workload.batch_size).select("id", "prediction")


def method_identity(spark, model, workload, variant, cols):
    """Spark moving every row to a Python worker and back, no model: the data ceiling."""
    import pyarrow as pa

    def identity(batches):
        for batch in batches:
            yield pa.RecordBatch.from_arrays([batch.column("id"), pa.array(np.zeros(batch.num_rows, "float32"))],
                                             names=["id", "prediction"])

    return lambda df: df.mapInArrow(identity, "id long, prediction float")


METHODS = {
    "predict_batch_udf": method_predict_batch_udf,
    "closure pandas_udf": method_closure_pandas_udf,
    "BroadcastModel.predict_udf": method_predict_udf,
    "BroadcastModel.transform": method_transform,
    "identity mapInArrow": method_identity,
}


def raw_rows_per_second(model, workload, seconds: float = 3.0) -> float:
    """The model alone, one process, numpy batches, the same compiled call spark_keras uses."""
    from spark_keras.inference import predictor_for

    predictor = predictor_for(model)
    rows = min(workload.rows, 20 * workload.batch_size)
    x = np.random.default_rng(0).random((rows, *workload.input_shape), dtype=np.float32)
    predictor([x[: workload.batch_size]], workload.batch_size)  # trace
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        predictor([x], workload.batch_size)
        done += rows
    return done / (time.perf_counter() - start)


def time_action(frame_fn, df) -> tuple[float, float]:
    """Warm up (worker start, TensorFlow import, model build, tracing) on 5% of the rows,
    taken from every partition, then time the whole DataFrame."""
    frame_fn(df.where(df["id"] % 20 == 0)).write.format("noop").mode("overwrite").save()
    reset_peak_rss()
    times: list[float] = []
    while not times or (len(times) < 2 and times[0] < 8.0):  # best of 2 for short runs
        start = time.perf_counter()
        frame_fn(df).write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - start)
    return min(times), peak_worker_rss_mb()


def tf_baseline_rss_mb(spark) -> float:
    """Peak RSS of a Python worker that imported TensorFlow/Keras and ran one op."""
    def touch(_):
        import keras

        keras.ops.convert_to_numpy(keras.ops.ones((2, 2)) @ keras.ops.ones((2, 2)))
        return [0]

    spark.sparkContext.parallelize(range(4), 4).mapPartitions(touch).collect()
    reset_peak_rss()
    spark.sparkContext.parallelize(range(4), 4).mapPartitions(touch).collect()
    return peak_worker_rss_mb()


def session(quick: bool):
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's Python
    return (SparkSession.builder.master("local[2]").appName("spark-keras-bench")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.memory", "6g")
            .config("spark.pyspark.python", sys.executable)
            .config("spark.python.worker.reuse", "true")
            .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
            .config("spark.executorEnv.PYTHONPATH", ROOT)
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
            .getOrCreate())


def run(quick: bool = False) -> tuple[list[dict], dict]:
    """Rows for the table, and facts (baseline RSS, weights) for the notes."""
    import keras

    spark = session(quick)
    spark.sparkContext.setLogLevel("ERROR")
    rows: list[dict] = []
    facts: dict = {"tf_baseline_rss_mb": tf_baseline_rss_mb(spark)}
    try:
        for workload in workloads(quick):
            model = workload.build()
            weights_mb = sum(w.numpy().nbytes for w in model.weights) / 2**20
            raw = raw_rows_per_second(model, workload, seconds=1.0 if quick else 4.0)
            for variant in workload.variants:
                df = make_frame(spark, workload, variant, partitions=2 if quick else 8)
                cols = input_columns(workload, variant)
                measured: dict[str, tuple[float, float]] = {}
                for name, make in METHODS.items():
                    seconds, rss = time_action(make(spark, model, workload, variant, cols), df)
                    measured[name] = (workload.rows / seconds, rss)
                identity = measured["identity mapInArrow"][0]
                ceiling = 1 / (1 / raw + 1 / identity)
                pbu = measured["predict_batch_udf"][0]
                transform = measured["BroadcastModel.transform"][0]
                for name, (rps, rss) in measured.items():
                    rows.append({
                        "workload": f"{workload.name} ({workload.rows:,} rows)",
                        "input": variant, "method": name, "rows/s": rps,
                        "x predict_batch_udf": rps / pbu, "x ceiling": rps / ceiling,
                        "x transform": rps / transform, "peak worker RSS MB": rss,
                    })
                rows.append({"workload": f"{workload.name} ({workload.rows:,} rows)", "input": variant,
                             "method": "raw model (1 process)", "rows/s": raw,
                             "x predict_batch_udf": raw / pbu, "x ceiling": raw / ceiling,
                             "x transform": raw / transform, "peak worker RSS MB": None})
                rows.append({"workload": f"{workload.name} ({workload.rows:,} rows)", "input": variant,
                             "method": "ceiling 1/(1/raw+1/identity)", "rows/s": ceiling,
                             "x predict_batch_udf": ceiling / pbu, "x ceiling": 1.0,
                             "x transform": ceiling / transform, "peak worker RSS MB": None})
                df.unpersist()
            facts[f"{workload.name} weights MB"] = weights_mb
            keras.backend.clear_session()
    finally:
        spark.stop()
    return rows, facts
