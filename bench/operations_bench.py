"""`python -m bench.operations_bench [--quick]`: what operating a scoring job costs.
``BroadcastModel.transform`` on local[2] with ``on_invalid="null"``, plain against with
``error_col`` (a reason per invalid row), with ``observe`` (rows / invalid rows / model
builds / build seconds gathered by ``df.observe``) and with both.

One session, two models (:data:`MODELS`); for each, the input (64 features per row, one
row in 1,000 null) is cached first and the model built in every worker by a warm-up of
each mode; then the modes run interleaved, seven rounds, written to the ``noop`` sink:
the best run of each mode against the best plain run, and the median over the rounds of
each mode's time against the plain run of the same round (robust to one disturbed
round). The last mode observes the plain transform's output with ``df.observe`` alone
(rows, null predictions): what observing costs without the build figures. 1,000,000 rows
in 8 partitions: with small inputs a query's fixed costs (the observation's are ~0.06 s)
would be counted as throughput. The observed figures of every run are checked against
the input.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FEATURES = 64
INVALID_EVERY = 1_000  # one null row in so many
# "plain again" is the plain transform measured a second time: how far two runs of the
# same work differ on this machine (the noise floor the other ratios sit in); ROWS_ONLY
# observes the plain transform's output with df.observe itself, transform's own two
# aggregates (rows, null predictions): what observe costs without the build figures,
# which ride in hidden columns
ROWS_ONLY = "df.observe(rows, invalid_rows)"
MODES = ("plain", "plain again", "error_col", "observe", "error_col + observe", ROWS_ONLY)
# (hidden width, rows): the bench's fast MLP (~350k rows/s here: the worst case for a fixed
# per-row cost) and one 15x heavier (~1.1M multiply-adds per row)
MODELS = ((256, 1_000_000), (1024, 200_000))


def _model(width: int = 256):
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(width, activation="relu"),
                             keras.layers.Dense(width, activation="relu"), keras.layers.Dense(8)])


def _frame(spark, rows: int):
    from pyspark.sql import functions as F

    features = F.array(*[F.rand(seed=j).cast("float") for j in range(FEATURES)])
    return (spark.range(rows, numPartitions=8)
            .select("id", F.when(F.col("id") % INVALID_EVERY == 0, F.lit(None))
                    .otherwise(features).alias("features"))
            .cache())


def _score(bm, df, mode: str, rows: int) -> float:
    """Seconds to score ``df`` in ``mode`` into the noop sink (figures checked)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from spark_keras.spark.transform import _metrics

    observation = Observation("operations") if "observe" in mode else None
    extra = {"error_col": "error"} if "error_col" in mode else {}
    if observation is not None and mode != ROWS_ONLY:
        extra["observe"] = observation
    started = time.perf_counter()
    scored = bm.transform(df, "features", on_invalid="null", **extra)
    if mode == ROWS_ONLY:
        rows_and_invalid = _metrics(F.col, "prediction")[:2]
        scored = scored.observe(observation, *rows_and_invalid)
    scored.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    if observation is not None:
        figures = observation.get
        invalid = (rows + INVALID_EVERY - 1) // INVALID_EVERY
        assert figures["rows"] == rows and figures["invalid_rows"] == invalid, figures
    return seconds


def run(quick: bool = False, repeats: int = 7) -> list[dict]:
    """One row per model and mode: rows/s of transform, and the ratios to the plain
    transform of the same model."""
    import spark_keras as sk
    from bench.sessions import local_session

    repeats = 1 if quick else repeats
    spark = local_session("operations-bench", driver_memory="4g")
    out = []
    try:
        for width, rows in MODELS:
            rows = 4_000 if quick else rows
            df = _frame(spark, rows)
            df.count()
            bm = sk.BroadcastModel(spark, _model(width))
            for mode in MODES:  # warm-up: builds the model in every worker
                _score(bm, df, mode, rows)
            times: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(repeats):  # interleaved: drifts of a shared machine hit all
                for mode in MODES:
                    times[mode].append(_score(bm, df, mode, rows))
            bm.unpersist()
            df.unpersist()
            plain = min(times["plain"])
            out += [{"model": f"MLP {FEATURES}-{width}-{width}-8",
                     "transform (on_invalid='null')": mode, "rows": rows,
                     "rows/s": rows / min(times[mode]), "x plain": plain / min(times[mode]),
                     "x plain, median of rounds": statistics.median(
                         p / t for p, t in zip(times["plain"], times[mode]))}
                    for mode in MODES]
    finally:
        spark.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.report import section_main

    return section_main("python -m bench.operations_bench", "transform of two MLPs", run,
                        "{:,.3f}", argv)


if __name__ == "__main__":
    sys.exit(main())
