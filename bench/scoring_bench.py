"""Scoring throughput on local Spark: spark_keras against the ways people write it today
and against a hand-written best case.

All methods run in one Spark session on the same cached DataFrame, each warmed up first
(worker start, TensorFlow import, model build) on every 20th row, then timed in three
interleaved rounds (best round counts), writing to Spark's ``noop`` sink so nothing is
collected. The ceiling's two parts are timed the same way: the identity ``mapInArrow`` is
one of the interleaved methods, the raw model runs at the start of each round at its
fastest call size (1,024, 4,096 or 10,000 rows).
The warm-up's predictions are collected and compared with ``model.predict`` on the same
rows: a method that disagrees stops the benchmark (:class:`PredictionMismatch`).
Peak RSS per Python worker is read from /proc/<pid>/status (VmHWM), reset before each
method through /proc/<pid>/clear_refs.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .models import actor_model, mlp_model
from .sessions import worker_paths



@dataclass
class Workload:
    name: str
    build: Callable[[], Any]
    input_shape: tuple[int, ...]
    rows: int
    batch_size: int
    variants: tuple[str, ...]  # "array", "scalars", "vector"


def workloads(quick: bool) -> list[Workload]:
    if quick:
        return [Workload("MLP", mlp_model, (64,), 1_000, 256, ("array", "scalars", "vector")),
                Workload("CNN", actor_model, (120, 160, 2), 16, 8, ("array",))]
    return [Workload("MLP", mlp_model, (64,), 200_000, 1024, ("array", "scalars", "vector")),
            Workload("CNN", actor_model, (120, 160, 2), 3_000, 64, ("array",))]


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


def _worker_pids(workers_only: bool = False) -> list[int]:
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


def feature_array(variant: str, cols: list[str]):
    """The input as one array<float> column: what predict_batch_udf needs (its error
    message tells users to build it) and what the prediction check reads on the driver."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if variant == "scalars":
        return F.array(*cols).cast("array<float>")
    if variant == "vector":
        return vector_to_array("features", "float32")
    return F.col("features")


def sample(df):
    """The warm-up and check rows: every 20th id (5%), from every partition."""
    return df.where(df["id"] % 20 == 0)


# --- the check: every method returns the model's own predictions ---------------------------

class PredictionMismatch(AssertionError):
    """A method's predictions differ from ``model.predict`` on the same rows."""


@dataclass
class Expected:
    ids: np.ndarray      # sorted
    outputs: np.ndarray  # (rows, values per row), in the order of ids


def _column_values(column) -> np.ndarray:
    """A float or array<float> Arrow column's values, flat (nulls as NaN, null lists dropped)."""
    import pyarrow as pa

    array = column.combine_chunks()
    if pa.types.is_list(array.type):
        array = array.flatten()
    return array.to_numpy(zero_copy_only=False)


def expected_predictions(model, df, workload: Workload, variant: str, cols: list[str]) -> Expected:
    """``model.predict`` on the driver for the sample rows, read from the same cached
    DataFrame (same ids, same F.rand features) the methods score."""
    table = sample(df).select("id", feature_array(variant, cols).alias("x")).toArrow().sort_by("id")
    x = _column_values(table.column("x")).reshape(-1, *workload.input_shape)
    y = model.predict(x, batch_size=workload.batch_size, verbose=0)
    return Expected(table.column("id").to_numpy(), y.reshape(len(x), -1))


def check_predictions(method: str, got, expected: Expected, rtol: float = 1e-3,
                      atol: float = 1e-4) -> None:
    """Raise PredictionMismatch unless the Arrow table ``got`` (id, prediction) holds the
    expected rows with the expected predictions."""
    got = got.sort_by("id")
    ids = got.column("id").to_numpy()
    if not np.array_equal(ids, expected.ids):
        raise PredictionMismatch(f"{method} returned {len(ids)} rows whose ids are not the "
                                 f"{len(expected.ids)} rows it was given")
    values = _column_values(got.column("prediction"))
    if values.size != expected.outputs.size:
        raise PredictionMismatch(f"{method} returned {values.size} prediction values for "
                                 f"{len(ids)} rows; model.predict gives {expected.outputs.size}")
    values = values.reshape(expected.outputs.shape)
    close = np.isclose(values, expected.outputs, rtol=rtol, atol=atol).all(axis=1)
    if not close.all():
        i = int(np.argmin(close))
        raise PredictionMismatch(
            f"{method}: {int((~close).sum())} of {len(ids)} rows differ from model.predict on the "
            f"same rows (rtol {rtol}, atol {atol}); first at id {ids[i]}: {values[i]} instead of "
            f"{expected.outputs[i]}")


# --- the methods -----------------------------------------------------------------------------

PREDICT_BATCH_UDF = "predict_batch_udf"
TRANSFORM = "BroadcastModel.transform"
BEST_CASE = "hand-written mapInArrow (best case)"
IDENTITY = "identity mapInArrow"


def _is_scalar(model) -> bool:
    return int(np.prod(model.outputs[0].shape[1:])) == 1


def _prediction_type(scalar: bool):
    from pyspark.sql.types import ArrayType, FloatType

    return FloatType() if scalar else ArrayType(FloatType())


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
    calling model.predict on each batch of batch_size rows in one step (batch_size=len(x):
    the same model batch size as the other methods; Keras's default would be 32)."""
    from pyspark.ml.functions import predict_batch_udf

    bc = spark.sparkContext.broadcast((model.to_json(), model.get_weights()))
    scalar = _is_scalar(model)

    def make_predict_fn():
        import keras

        config, weights = bc.value
        m = keras.models.model_from_json(config)
        m.set_weights(weights)

        def predict(x):
            y = m.predict(x, batch_size=len(x), verbose=0)
            return y.reshape(-1) if scalar else y

        return predict

    udf = predict_batch_udf(make_predict_fn, return_type=_prediction_type(scalar),
                            batch_size=workload.batch_size,
                            input_tensor_shapes=[list(workload.input_shape)])
    return lambda df: df.select("id", udf(feature_array(variant, cols)).alias("prediction"))


def method_closure_pandas_udf(spark, model, workload, variant, cols):
    """A plain pandas_udf with the Keras model captured in its closure, model.predict with
    the same model batch size as the other methods."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    shape = workload.input_shape
    scalar = _is_scalar(model)

    def predict(batches: Iterator[Any]) -> Iterator[pd.Series]:
        for batch in batches:
            series = list(batch) if isinstance(batch, tuple) else [batch]
            y = model.predict(_series_to_batch(series, shape), batch_size=workload.batch_size, verbose=0)
            yield pd.Series(y.reshape(-1)) if scalar else pd.Series(list(y))

    from typing import Tuple

    item = pd.Series if len(cols) == 1 else Tuple[(pd.Series,) * len(cols)]
    predict.__annotations__ = {"batches": Iterator[item], "return": Iterator[pd.Series]}
    udf = pandas_udf(predict, _prediction_type(scalar))
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


_BEST_CASE_CALLS: dict[str, Callable] = {}  # in each worker process: broadcast key -> tf.function


def _best_case_call(key: str, bc, input_shape: tuple[int, ...]) -> Callable:
    """The model rebuilt once per worker process from the broadcast, as one tf.function."""
    call = _BEST_CASE_CALLS.get(key)
    if call is None:
        import keras
        import tensorflow as tf

        config, weights = bc.value
        model = keras.models.model_from_json(config)
        model.set_weights(weights)
        call = tf.function(lambda x: model(x, training=False), autograph=False,
                           input_signature=[tf.TensorSpec((None, *input_shape), tf.float32)])
        _BEST_CASE_CALLS[key] = call
    return call


def _arrow_features(batch, variant: str, cols: list[str], shape: tuple[int, ...]) -> np.ndarray:
    """The batch's features as float32, no per-row objects: a zero-copy view of an
    array<float> column; one copy to stack scalar columns or narrow a Vector's float64."""
    import pyarrow.compute as pc

    if variant == "scalars":
        return np.stack([batch.column(c).to_numpy() for c in cols], axis=1, dtype=np.float32).reshape(-1, *shape)
    column = batch.column(cols[0])
    if variant == "vector":
        column = pc.struct_field(column, "values")  # (all dense here)
    return column.flatten().to_numpy().astype(np.float32, copy=False).reshape(-1, *shape)


def _arrow_prediction(y: np.ndarray, scalar: bool):
    import pyarrow as pa

    values = pa.array(y.reshape(-1))
    if scalar:
        return values
    width = int(np.prod(y.shape[1:]))
    return pa.ListArray.from_arrays(pa.array(np.arange(0, len(values) + 1, width, dtype=np.int32)), values)


def method_best_case(spark, model, workload, variant, cols):
    """What a careful user writes by hand for this one model and input: the model rebuilt
    once per worker from a broadcast of config + weights (kept in a module-level dict under
    a key made with the broadcast), one tf.function of model(x, training=False), mapInArrow
    with zero-copy Arrow-to-numpy. Like transform, it returns the input columns and the
    prediction. No input checks, dense vectors only."""
    import pyarrow as pa
    from pyspark.sql.types import StructField, StructType

    bc = spark.sparkContext.broadcast((model.to_json(), model.get_weights()))
    key = uuid.uuid4().hex  # (a Broadcast has no public id on workers)
    shape, batch_size, scalar = workload.input_shape, workload.batch_size, _is_scalar(model)

    def score(batches):
        call = _best_case_call(key, bc, shape)
        for batch in batches:
            x = _arrow_features(batch, variant, cols, shape)
            # max(.., 1): an empty batch still makes one (empty) call, so concatenate has a part
            y = np.concatenate([call(x[i:i + batch_size]).numpy()
                                for i in range(0, max(len(x), 1), batch_size)])
            yield pa.RecordBatch.from_arrays([*batch.columns, _arrow_prediction(y, scalar)],
                                             names=[*batch.schema.names, "prediction"])

    def frame(df):
        schema = StructType([*df.schema.fields, StructField("prediction", _prediction_type(scalar))])
        return df.mapInArrow(score, schema).select("id", "prediction")

    return frame


def method_identity(spark, model, workload, variant, cols):
    """Spark moving every row to a Python worker and back, no model: the data ceiling."""
    import pyarrow as pa

    def identity(batches):
        for batch in batches:
            yield pa.RecordBatch.from_arrays([batch.column("id"), pa.array(np.zeros(batch.num_rows, "float32"))],
                                             names=["id", "prediction"])

    return lambda df: df.mapInArrow(identity, "id long, prediction float")


METHODS = {
    PREDICT_BATCH_UDF: method_predict_batch_udf,
    "closure pandas_udf": method_closure_pandas_udf,
    "BroadcastModel.predict_udf": method_predict_udf,
    TRANSFORM: method_transform,
    BEST_CASE: method_best_case,
    IDENTITY: method_identity,
}
CEILING = "ceiling 1/(1/raw+1/identity)"


CALL_SIZES = (1024, 4096, 10_000)  # the model's call sizes tried for the raw rate,
RAW_CALL_BYTES = 64 * 2**20  # those whose inputs fit in this (a CNN's activations do not)


def raw_rows_per_second(model, workload, seconds: float = 3.0) -> tuple[float, int]:
    """The model alone, one process, numpy batches, the same compiled call spark_keras
    uses, at its fastest call size on this machine (the workload's batch size, and those of
    :data:`CALL_SIZES` whose inputs take at most :data:`RAW_CALL_BYTES`): ``(rows/s, call
    size)``, each size timed for ``seconds / len(sizes)``."""
    from spark_keras.inference import predictor_for

    predictor = predictor_for(model)
    row_bytes = 4 * int(np.prod(workload.input_shape))
    sizes = sorted({min(size, workload.rows) for size in (workload.batch_size, *CALL_SIZES)
                    if size == workload.batch_size or size * row_bytes <= RAW_CALL_BYTES})
    rows = min(workload.rows, max(20 * workload.batch_size, 2 * sizes[-1]))
    x = np.random.default_rng(0).random((rows, *workload.input_shape), dtype=np.float32)
    best = (0.0, sizes[0])
    for size in sizes:
        predictor([x[:size]], size)  # trace
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / len(sizes):
            predictor([x], size)
            done += rows
        best = max(best, (done / (time.perf_counter() - start), size))
    return best


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


def session(master: str = "local[2]"):
    """A local session whose Python workers run this venv's Python, reused across tasks."""
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


def table_rows(label: str, variant: str, measured: dict[str, tuple[float, float]],
               raw: float) -> list[dict]:
    """One row per method, then the raw model and the ceiling, each with its ratios to
    predict_batch_udf, the hand-written best case, transform and the ceiling."""
    ceiling = 1 / (1 / raw + 1 / measured[IDENTITY][0])
    bases = {"x predict_batch_udf": measured[PREDICT_BATCH_UDF][0], "x best case": measured[BEST_CASE][0],
             "x transform": measured[TRANSFORM][0], "x ceiling": ceiling}
    entries = [*((name, rps, rss) for name, (rps, rss) in measured.items()),
               ("raw model (1 process)", raw, None), (CEILING, ceiling, None)]
    return [{"workload": label, "input": variant, "method": name, "rows/s": rps,
             **{column: rps / base for column, base in bases.items()}, "peak worker RSS MB": rss}
            for name, rps, rss in entries]


ROUNDS = 3  # interleaved timing rounds per input variant (1 with --quick)


def run(quick: bool = False) -> tuple[list[dict], dict]:
    """Rows for the table, and facts (baseline RSS, weights, the raw model's call size)
    for the notes. Per input variant every method is warmed up (its predictions checked),
    then timed once per round with the methods interleaved, the raw model timed at the
    start of each round; each method's best round counts, the ceiling's too."""
    import keras

    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    rows: list[dict] = []
    facts: dict = {"tf_baseline_rss_mb": tf_baseline_rss_mb(spark)}
    try:
        for workload in workloads(quick):
            model = workload.build()
            weights_mb = sum(w.numpy().nbytes for w in model.weights) / 2**20
            label = f"{workload.name} ({workload.rows:,} rows, batch {workload.batch_size})"
            raw_best = [(0.0, 0)]

            def time_raw() -> None:
                raw_best.append(raw_rows_per_second(model, workload, seconds=1.0 if quick else 3.0))

            for variant in workload.variants:
                df = make_frame(spark, workload, variant, partitions=2 if quick else 8)
                cols = input_columns(workload, variant)
                expected = expected_predictions(model, df, workload, variant, cols)
                frames = {name: make(spark, model, workload, variant, cols) for name, make in METHODS.items()}
                for name, frame_fn in frames.items():
                    warm_up(frame_fn, df, None if name == IDENTITY else functools.partial(
                        check_predictions, f"{name} ({label}, {variant})", expected=expected))
                best = interleaved(frames, df, 1 if quick else ROUNDS, before_round=time_raw)
                measured = {name: (workload.rows / seconds, rss) for name, (seconds, rss) in best.items()}
                rows += table_rows(label, variant, measured, max(raw_best)[0])
                df.unpersist()
            facts[f"{workload.name} weights MB"] = weights_mb
            facts[f"{workload.name} raw model's fastest call size"] = max(raw_best)[1]
            keras.backend.clear_session()
    finally:
        spark.stop()
    return rows, facts
