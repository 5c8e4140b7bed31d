"""Scoring real inputs on local Spark: text, image bytes and variable-length sequences.

Text and images: a text model (``Input((), dtype="string")`` -> TextVectorization ->
Embedding -> Dense) on a string column of short random sentences, and an image model
(PNG bytes decoded in its graph, 64 x 64, a small CNN) on a binary column of PNGs, each
scored by ``BroadcastModel.transform`` against ``predict_batch_udf`` doing the same work
(the column's strings or bytes to a ``tf.constant``, ``model.predict`` with the same batch
size) and against a hand-written ``mapInArrow`` (the Arrow column to one ``tf.string``
tensor, a cached ``tf.function`` of the model): the best case, the target being transform
within 10% of it. One Spark session, one cached DataFrame per workload; each method is
built once, then the methods take turns, each run following a warm-up on the sample rows
(:func:`.harness.in_turns`), best of the rounds. The first warm-up's predictions
are checked against the model called directly on the same rows.

Variable-length sequences: a masked GRU (``Input((None, 3))``, ``Masking(0.0)``) scored by
transform on sequences whose lengths are all equal, of 4 or of 64 distinct lengths (the
same mean length), so the cost of grouping rows by shape is visible, and on the 64 lengths
with ``buckets=8`` (the rows padded into 8 lengths, one call per bucket), every variant
and transform taking turns in each round; for reference the model alone, called on one batch of each kind
grouped by length by hand (one call per length), and on the 64 lengths bucketed as
``buckets=8`` buckets them (the same lengths chosen, padded by hand, one call per bucket).
The padding share is the padded steps among all the steps fed to the model.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from bench import models
from bench.frames import Expected, Workload, check_predictions
from bench.harness import in_turns, rows_per_second, sample
from bench.scoring_bench import (
    BEST_CASE,
    IDENTITY,
    PREDICT_BATCH_UDF,
    TRANSFORM,
    arrow_prediction,
    method_identity,
    method_transform,
    table_rows,
)
from bench.sessions import scoring_session

# Workload names, which the targets pick rows by (targets.inputs_targets)
TEXT, IMAGE, GRU = "text", "image", "GRU"
STRINGS, PNGS = "string column", "binary column (PNG)"
IMAGE_SIZE = 64
MEAN_LENGTH = 40  # of every set of sequence lengths, so each holds the same work
RAW_BY_LENGTH = "raw model (1 process, one call per length)"
BUCKETS = 8
BUCKETED = f"BroadcastModel.transform (buckets={BUCKETS})"
RAW_BUCKETED = f"raw model (1 process, {BUCKETS} buckets)"
EQUAL, MANY = "equal lengths (40)", "64 distinct lengths"
LENGTH_SETS = {EQUAL: [MEAN_LENGTH],
               "4 distinct lengths": [10, 30, 50, 70],
               MANY: list(range(8, 72))}
ARROW_BATCH = 10_000  # rows per Arrow batch (the session's maxRecordsPerBatch): what buckets sees


@dataclass
class Sizes:
    sentences: int
    images: int
    sequences: int
    partitions: int
    rounds: int  # timed runs per method, taken in turns
    raw_seconds: float


def sizes(quick: bool) -> Sizes:
    if quick:
        return Sizes(2_000, 200, 400, 2, 1, 0.5)
    return Sizes(200_000, 20_000, 20_000, 8, 3, 3.0)


# --- data ------------------------------------------------------------------------------------

def sentences(n: int, seed: int = 0) -> list[str]:
    """Short random sentences (3 to 12 words of :data:`models.WORDS`)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(models.WORDS), (n, 12)).tolist()
    return [" ".join(models.WORDS[i] for i in row[:k]) for row, k in zip(picks, rng.integers(3, 13, n).tolist())]


def pngs(n: int, size: int = IMAGE_SIZE, seed: int = 0, distinct: int = 2_000) -> list[bytes]:
    """``n`` photo-like RGB PNGs (smooth colour fields plus noise, so they compress as
    photos do: about 8.6 kB at 64 x 64): ``distinct`` of them (encoding takes about 1 ms
    each), repeated."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (min(n, distinct), 8, 8, 3)).astype("float32")
    fields = tf.image.resize(coarse, (size, size)).numpy()
    noise = rng.integers(-10, 11, fields.shape, dtype=np.int16)
    images = np.clip(fields + noise, 0, 255).astype(np.uint8)
    encoded = [tf.io.encode_png(image).numpy() for image in images]
    return [encoded[i % len(encoded)] for i in range(n)]


def frame(spark, column: str, values: Sequence[Any], partitions: int):
    """A cached DataFrame of ``id`` and ``column`` (string or binary), ``partitions`` parts."""
    import pyarrow as pa

    table = pa.table({"id": pa.array(np.arange(len(values)), pa.int64()),
                      column: pa.array(values, pa.string() if isinstance(values[0], str) else pa.binary())})
    df = spark.createDataFrame(table).repartition(partitions, "id").cache()
    df.count()
    return df


def sequence_frame(spark, rows: int, lengths: list[int], partitions: int):
    """A cached DataFrame of ``id`` and ``sequence`` (array<array<float>>, rows of
    ``(length, 3)``): row ``id`` has ``lengths[id % len(lengths)]`` steps, so every batch
    holds every length; the values are a deterministic function of id, step and feature."""
    from pyspark.sql import functions as F

    length = F.element_at(F.array(*map(F.lit, lengths)), (F.col("id") % len(lengths) + 1).cast("int"))
    steps = F.transform(F.sequence(F.lit(1), length), lambda t: F.array(
        *[F.sin(F.col("id") * 0.37 + t * (0.5 + j) + j).cast("float") for j in range(3)]))
    df = spark.range(rows, numPartitions=partitions).select("id", steps.alias("sequence")).cache()
    df.count()
    return df


# --- the model called directly --------------------------------------------------------------

def rebuild(config: str, weights: list[np.ndarray]) -> Any:
    """A model from its JSON config and weights, as the hand-written methods ship it
    (DecodePng registered first: it is made on first use, see :mod:`.models`)."""
    import keras

    models.decode_png_class()  # registers the layer
    model = keras.models.model_from_json(config)
    model.set_weights(weights)
    return model


def compiled(model: Any) -> Callable[[Any], np.ndarray]:
    """``model(x, training=False)`` as one ``tf.function`` for any batch (and any length
    where the input has unknown dimensions), returning numpy."""
    import tensorflow as tf

    spec = model.inputs[0]
    call = tf.function(lambda x: model(x, training=False), autograph=False,
                       input_signature=[tf.TensorSpec((None, *spec.shape[1:]), spec.dtype)])
    return lambda x: call(x).numpy()


def batched(call: Callable[[Any], np.ndarray], x: Any, batch_size: int) -> np.ndarray:
    """``call`` on ``x`` in batches of ``batch_size`` rows, concatenated."""
    return np.concatenate([call(x[i:i + batch_size]) for i in range(0, max(len(x), 1), batch_size)])


def by_length(call: Callable[[Any], np.ndarray], rows: Sequence[np.ndarray]) -> np.ndarray:
    """``call`` once per distinct row length, on that length's rows stacked: each row's
    prediction is the model's on that row alone."""
    lengths = np.array([len(r) for r in rows])
    out = None
    for length in np.unique(lengths):
        at = np.flatnonzero(lengths == length)
        y = call(np.stack([rows[i] for i in at]).astype(np.float32))
        out = np.empty((len(rows), *y.shape[1:]), y.dtype) if out is None else out
        out[at] = y
    return out


def by_bucket(call: Callable[[Any], np.ndarray], rows: Sequence[np.ndarray], buckets: int) -> np.ndarray:
    """``call`` once per bucket, ``buckets`` lengths chosen for the rows as spark_keras
    chooses them, each row padded with zeros (the GRU's mask value) to its bucket's length."""
    from spark_keras.inference.buckets import bucket_lengths

    lengths = np.array([len(r) for r in rows])
    target = bucket_lengths(lengths, buckets)
    out = None
    for length in np.unique(target):
        at = np.flatnonzero(target == length)
        x = np.zeros((len(at), int(length), *rows[0].shape[1:]), np.float32)
        for k, i in enumerate(at):
            x[k, :lengths[i]] = rows[i]
        y = call(x)
        out = np.empty((len(rows), *y.shape[1:]), y.dtype) if out is None else out
        out[at] = y
    return out


def transform_padding(rows: int, lengths: list[int], partitions: int, buckets: int) -> float:
    """The padding share of ``buckets`` on :func:`sequence_frame`'s rows: each partition
    (a range of ids) in Arrow batches of :data:`ARROW_BATCH` rows, each batch bucketed."""
    from spark_keras.inference.buckets import bucket_lengths

    fed = padded = 0
    for part in np.array_split(np.arange(rows), partitions):
        for start in range(0, len(part), ARROW_BATCH):
            own = np.asarray(lengths)[part[start:start + ARROW_BATCH] % len(lengths)]
            steps = int(bucket_lengths(own, buckets).sum())
            fed, padded = fed + steps, padded + steps - int(own.sum())
    return padded / fed


def expected(call: Callable[[Any], np.ndarray], df, column: str, batch_size: int) -> Expected:
    """The model called directly (``call``, see :func:`compiled`) on the sample rows of ``df``."""
    table = sample(df).select("id", column).toArrow().sort_by("id")
    values = table.column(column).to_pylist()
    if isinstance(values[0], list):  # sequences: one call per length
        y = by_length(call, [np.asarray(v, np.float32) for v in values])
    else:
        import tensorflow as tf

        y = batched(call, tf.constant(values), batch_size)
    return Expected(table.column("id").to_numpy(), y.reshape(len(values), -1))


# --- the methods for string and binary columns ---------------------------------------------

_CALLS: dict[str, Callable] = {}  # in each worker process: broadcast key -> compiled model


def _cached_call(key: str, bc: Any) -> Callable[[Any], np.ndarray]:
    """The model rebuilt from the broadcast and compiled once per worker process. (A
    module function, so that tasks unpickle a reference to it and share ``_CALLS``: a
    closure naming ``_CALLS`` would carry a copy of the dict, empty in every task.)"""
    call = _CALLS.get(key)
    if call is None:
        call = _CALLS[key] = compiled(rebuild(*bc.value))
    return call


def method_predict_batch_udf(spark, model, workload: Workload, column: str):
    """``pyspark.ml.functions.predict_batch_udf``: the model rebuilt from a broadcast of its
    config and weights; each batch's strings/bytes to a ``tf.constant``, then
    ``model.predict`` with the batch's size (one step per batch)."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    bc = spark.sparkContext.broadcast((model.to_json(), model.get_weights()))

    def make_predict_fn():
        import tensorflow as tf

        m = rebuild(*bc.value)
        return lambda x: m.predict(tf.constant(x), batch_size=len(x), verbose=0)

    udf = predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()),
                            batch_size=workload.batch_size)
    return lambda df: df.select("id", udf(column).alias("prediction"))


def method_best_case(spark, model, workload: Workload, column: str):
    """What a careful user writes by hand for a string or binary column: the model rebuilt
    once per worker from a broadcast, one ``tf.function`` of it, ``mapInArrow`` turning the
    column into one ``tf.string`` tensor per Arrow batch (``tf.constant`` of the column's
    values: the fastest of the ways tried, see docs/benchmarks.md), no input checks,
    returning the input columns and the prediction as transform does."""
    import pyarrow as pa
    from pyspark.sql.types import ArrayType, FloatType, StructField, StructType

    bc = spark.sparkContext.broadcast((model.to_json(), model.get_weights()))
    key, batch_size = uuid.uuid4().hex, workload.batch_size

    def score(batches):
        import tensorflow as tf

        call = _cached_call(key, bc)
        for batch in batches:
            x = tf.constant(batch.column(column).to_numpy(zero_copy_only=False))
            y = batched(call, x, batch_size)
            yield pa.RecordBatch.from_arrays([*batch.columns, arrow_prediction(y, False)],
                                             names=[*batch.schema.names, "prediction"])

    def scored(df):
        schema = StructType([*df.schema.fields, StructField("prediction", ArrayType(FloatType()))])
        return df.mapInArrow(score, schema).select("id", "prediction")

    return scored


def _methods(spark, model, workload: Workload, column: str) -> dict[str, Callable]:
    return {PREDICT_BATCH_UDF: method_predict_batch_udf(spark, model, workload, column),
            TRANSFORM: method_transform(spark, model, workload, None, [column]),
            BEST_CASE: method_best_case(spark, model, workload, column),
            IDENTITY: method_identity(spark, model, workload, None, [column])}


# --- the run ----------------------------------------------------------------------------------

def _strings_rows(spark, workload: Workload, column: str, variant: str, values: list, size: Sizes) -> list[dict]:
    """The table rows of one string or binary workload."""
    import tensorflow as tf

    model = workload.build()
    df = frame(spark, column, values, size.partitions)
    label = f"{workload.name} ({workload.rows:,} rows, batch {workload.batch_size})"
    call = compiled(model)
    want = expected(call, df, column, workload.batch_size)
    measured = in_turns(_methods(spark, model, workload, column), df, workload.rows,
                        lambda name: None if name == IDENTITY else functools.partial(
                            check_predictions, f"{name} ({label})", expected=want),
                        size.rounds)
    x = tf.constant(values[:workload.batch_size])
    raw = rows_per_second(lambda: call(x), len(x), size.raw_seconds)
    df.unpersist()
    return table_rows(label, variant, measured, raw)


def _length_rows(spark, size: Sizes, batch_size: int = 1024) -> list[dict]:
    """Transform on sequences of 1, 4 and 64 distinct lengths (and on the 64 with buckets),
    every variant and method taking turns in each round (a slow minute of the machine hits
    them all alike), and the model alone on one batch of each, grouped by length (and
    bucketed) by hand."""
    import spark_keras as sk
    from spark_keras.inference.buckets import padding_share

    model = models.gru_model()
    bm = sk.BroadcastModel(spark, model)
    label = f"{GRU} (None, 3) ({size.sequences:,} rows, batch {batch_size})"

    def scored(df, buckets=None):
        return bm.transform(df, "sequence", batch_size=batch_size, buckets=buckets).select("id", "prediction")

    call = compiled(model)
    frames = {variant: sequence_frame(spark, size.sequences, lengths, size.partitions)
              for variant, lengths in LENGTH_SETS.items()}
    wants = {variant: expected(call, df, "sequence", batch_size) for variant, df in frames.items()}
    best: dict[str, dict[str, float]] = {variant: {} for variant in frames}  # variant -> method -> rows/s
    for r in range(size.rounds):
        for variant, df in frames.items():
            methods = {TRANSFORM: scored, **({BUCKETED: functools.partial(scored, buckets=BUCKETS)}
                                             if variant == MANY else {})}
            check = (lambda name, v=variant: functools.partial(
                check_predictions, f"{name} ({label}, {v})", expected=wants[v])) if r == 0 else None
            for name, (rps, _) in in_turns(methods, df, size.sequences, check, 1).items():
                best[variant][name] = max(best[variant].get(name, 0.0), rps)
    for df in frames.values():
        df.unpersist()
    measured: dict[str, dict[str, tuple[float, float]]] = {}  # variant -> method -> (rows/s, padding)
    rng = np.random.default_rng(0)
    # the raw model meets the rows transform's engine meets: a partition's Arrow batch
    per_batch = min(ARROW_BATCH, size.sequences // size.partitions)
    in_batches = functools.partial(batched, call, batch_size=batch_size)  # calls of batch_size rows
    for variant, lengths in LENGTH_SETS.items():
        batch = [rng.standard_normal((lengths[i % len(lengths)], 3)).astype(np.float32) for i in range(per_batch)]
        raw = rows_per_second(functools.partial(by_length, in_batches, batch), per_batch, size.raw_seconds)
        measured[variant] = {TRANSFORM: (best[variant][TRANSFORM], 0.0), RAW_BY_LENGTH: (raw, 0.0)}
        if variant == MANY:
            share = transform_padding(size.sequences, lengths, size.partitions, BUCKETS)
            raw = rows_per_second(functools.partial(by_bucket, in_batches, batch, BUCKETS), per_batch, size.raw_seconds)
            measured[variant].update({BUCKETED: (best[variant][BUCKETED], share),
                                      RAW_BUCKETED: (raw, padding_share(np.array([len(r) for r in batch]),
                                                                        BUCKETS))})
    base = {TRANSFORM: measured[EQUAL][TRANSFORM][0], RAW_BY_LENGTH: measured[EQUAL][RAW_BY_LENGTH][0]}
    return [{"workload": label, "input": variant, "method": method, "rows/s": rps,
             "x equal lengths": rps / base[RAW_BY_LENGTH if method.startswith("raw") else TRANSFORM],
             "padding %": 100 * share}
            for variant, by_method in measured.items() for method, (rps, share) in by_method.items()]


def run(quick: bool = False) -> tuple[list[dict], list[dict]]:
    """The text and image rows (as the scoring section's table), and the sequence rows."""
    import keras

    size = sizes(quick)
    spark = scoring_session()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        text = Workload(TEXT, models.text_model, (), size.sentences, 1024, (STRINGS,))
        image = Workload(IMAGE, models.png_model, (), size.images, 256, (PNGS,))
        rows = _strings_rows(spark, text, "text", STRINGS, sentences(size.sentences), size)
        keras.backend.clear_session()
        rows += _strings_rows(spark, image, "png", PNGS, pngs(size.images), size)
        keras.backend.clear_session()
        lengths = _length_rows(spark, size)
    finally:
        spark.stop()
    return rows, lengths
