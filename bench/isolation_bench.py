"""`python -m bench.isolation_bench [--quick]`: what isolating the rows that make the
model raise costs. ``BroadcastModel.transform`` on local[2] of two models that raise in
their graph on some rows: the scoring MLP's shape behind a ``tf.debugging.assert_less``
(64 features; a failing row holds 50.0) and the PNG model (bytes decoded in the graph; a
failing row is not a PNG). Modes, interleaved over the rounds, into the ``noop`` sink:

* ``on_invalid='error'``, clean input: the path every clean batch took before isolation;
* ``on_invalid='null'``, clean input: the same batches with isolation armed;
* ``on_invalid='null'``, 1 failing row per 10,000: each failing row costs a failed call of
  its batch and the search for it (:mod:`spark_keras.inference.isolation`).

Each mode's best run against the best ``'error'`` run, and the median over the rounds of
the ratio to the ``'error'`` run of the same round. The failing runs' null rows are
counted and checked.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FAIL_EVERY = 10_000  # one failing row in so many
FEATURES = 64
MODES = ("on_invalid='error', clean", "on_invalid='null', clean",
         f"on_invalid='null', 1 failing row per {FAIL_EVERY:,}")
# (model, rows, partitions)
MODELS = (("MLP 64-256-256-8 + assert", 1_000_000, 8), ("PNG 64x64 decode + CNN", 40_000, 4))


def _mlp_frame(spark, rows: int, partitions: int, failing: bool):
    from pyspark.sql import functions as F

    values = [F.rand(seed=j).cast("float") for j in range(FEATURES)]
    if failing:  # a value over the model's limit on one row in FAIL_EVERY
        values[0] = F.when(F.col("id") % FAIL_EVERY == 7, F.lit(50.0).cast("float")).otherwise(values[0])
    return spark.range(rows, numPartitions=partitions).select("id", F.array(*values).alias("features"))


def _png_frame(spark, rows: int, partitions: int, failing: bool):
    from pyspark.sql import functions as F

    from bench.inputs_bench import pngs

    pool = pngs(256, distinct=256)  # photo-like 64 x 64 PNGs, joined in by id
    images = spark.createDataFrame([(i, b) for i, b in enumerate(pool)], "k long, content binary")
    df = spark.range(rows, numPartitions=partitions).withColumn("k", F.col("id") % len(pool))
    df = df.join(F.broadcast(images), "k").drop("k")
    if failing:
        df = df.withColumn("content", F.when(F.col("id") % FAIL_EVERY == 7, F.lit(b"not a png"))
                           .otherwise(F.col("content")))
    return df


def _score(bm, df, col: str, mode: str, rows: int) -> float:
    """Seconds to score ``df`` in ``mode`` into the noop sink."""
    on_invalid = "error" if "'error'" in mode else "null"
    started = time.perf_counter()
    bm.transform(df, col, on_invalid=on_invalid).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _check(bm, df, col: str, rows: int) -> None:
    """The failing frame's null predictions are exactly its failing rows."""
    from pyspark.sql import functions as F

    scored = bm.transform(df, col, on_invalid="null")
    null = scored.where(F.col("prediction").isNull()).select("id").collect()
    expected = [i for i in range(7, rows, FAIL_EVERY)]
    assert sorted(r.id for r in null) == expected, (len(null), len(expected))


def run(quick: bool = False, repeats: int = 5) -> list[dict]:
    """One row per model and mode: rows/s of transform and the ratios to the clean
    ``'error'`` transform of the same model."""
    import spark_keras as sk
    from bench.models import asserting_mlp_model, png_model
    from bench.sessions import local_session

    repeats = 1 if quick else repeats
    spark = local_session("isolation-bench", driver_memory="4g")
    out = []
    try:
        for name, rows, partitions in MODELS:
            rows = 2 * FAIL_EVERY if quick else rows
            is_png = name.startswith("PNG")
            model, make, col = (png_model(), _png_frame, "content") if is_png \
                else (asserting_mlp_model(FEATURES), _mlp_frame, "features")
            frames = {False: make(spark, rows, partitions, False).cache(),
                      True: make(spark, rows, partitions, True).cache()}
            for df in frames.values():
                df.count()
            bm = sk.BroadcastModel(spark, model)
            _check(bm, frames[True], col, rows)
            by_mode = {mode: frames["failing" in mode] for mode in MODES}
            for mode in MODES:  # warm-up: builds the model in every worker
                _score(bm, by_mode[mode], col, mode, rows)
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(repeats):  # interleaved: drifts of a shared machine hit all
                for mode in MODES:
                    times[mode].append(_score(bm, by_mode[mode], col, mode, rows))
            bm.unpersist()
            for df in frames.values():
                df.unpersist()
            base = min(times[MODES[0]])
            out += [{"model": name, "transform": mode, "rows": rows,
                     "rows/s": rows / min(times[mode]), "x 'error' clean": base / min(times[mode]),
                     "x 'error' clean, median of rounds": statistics.median(
                         b / t for b, t in zip(times[MODES[0]], times[mode]))}
                    for mode in MODES]
    finally:
        spark.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.report import section_main

    return section_main("python -m bench.isolation_bench", "transform of two models that raise "
                        "on some rows", run, "{:,.3f}", argv)


if __name__ == "__main__":
    sys.exit(main())
