"""Scoring throughput on local Spark: spark_keras against the ways people write it today
and against a hand-written best case.

All methods run in one Spark session on the same cached DataFrame, each warmed up first
(worker start, TensorFlow import, model build) on every 20th row, then timed in three
interleaved rounds (best round counts), writing to Spark's ``noop`` sink so nothing is
collected. The ceiling's two parts are timed the same way: the identity ``mapInArrow`` is
one of the interleaved methods, the raw model runs at the start of each round at its
fastest call size (1,024, 4,096 or 10,000 rows).
The warm-up's predictions are collected and compared with ``model.predict`` on the same
rows: a method that disagrees stops the benchmark (:class:`.frames.PredictionMismatch`).
Peak RSS per Python worker is read from /proc/<pid>/status (VmHWM), reset before each
method through /proc/<pid>/clear_refs (:mod:`.harness`).
"""

from __future__ import annotations

import functools
import uuid
from typing import Any, Callable, Iterator

import numpy as np

from bench.frames import (
    check_predictions,
    expected_predictions,
    feature_array,
    input_columns,
    make_frame,
    workloads,
)
from bench.harness import interleaved, rows_per_second, tf_baseline_rss_mb, warm_up
from bench.sessions import scoring_session

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


def arrow_prediction(y: np.ndarray, scalar: bool):
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
            yield pa.RecordBatch.from_arrays([*batch.columns, arrow_prediction(y, scalar)],
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
        rate = rows_per_second(lambda: predictor([x], size), rows, seconds / len(sizes),
                               first=lambda: predictor([x[:size]], size))  # (first: the tracing)
        best = max(best, (rate, size))
    return best


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

    spark = scoring_session()
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
