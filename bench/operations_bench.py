"""`python -m bench.operations_bench [--quick]`: what operating a scoring job costs.
``BroadcastModel.transform`` on local[2] with ``on_invalid="null"``, plain against with
``error_col`` (a reason per invalid row), with ``observe`` (rows / invalid rows / model
builds / build seconds gathered by ``df.observe``) and with both.

One session; the input (an MLP's 64 features per row, one row in 1,000 null) is cached
first and the model built in every worker by a warm-up of each mode; then the modes
run interleaved, best of three timed runs each, written to the ``noop`` sink. The
observed figures of every run are checked against the input.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FEATURES = 64
INVALID_EVERY = 1_000  # one null row in so many
MODES = ("plain", "error_col", "observe", "error_col + observe")


def _model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(8)])


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

    observation = Observation("operations") if "observe" in mode else None
    extra = {"error_col": "error"} if "error_col" in mode else {}
    if observation is not None:
        extra["observe"] = observation
    started = time.perf_counter()
    bm.transform(df, "features", on_invalid="null", **extra) \
        .write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - started
    if observation is not None:
        figures = observation.get
        invalid = (rows + INVALID_EVERY - 1) // INVALID_EVERY
        assert figures["rows"] == rows and figures["invalid_rows"] == invalid, figures
    return seconds


def run(quick: bool = False, repeats: int = 3) -> list[dict]:
    """One row per mode: rows/s of transform, and the ratio to the plain transform."""
    import spark_keras as sk

    from .sessions import local_session

    rows = 4_000 if quick else 200_000
    repeats = 1 if quick else repeats
    spark = local_session("operations-bench", driver_memory="4g")
    try:
        df = _frame(spark, rows)
        df.count()
        bm = sk.BroadcastModel(spark, _model())
        for mode in MODES:  # warm-up: builds the model in every worker
            _score(bm, df, mode, rows)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(repeats):  # interleaved: drifts of a shared machine hit both
            for mode in MODES:
                times[mode].append(_score(bm, df, mode, rows))
    finally:
        spark.stop()
    plain = rows / min(times["plain"])
    return [{"transform (on_invalid='null')": mode, "rows": rows,
             "rows/s": rows / min(times[mode]), "x plain": rows / min(times[mode]) / plain}
            for mode in MODES]


def main(argv: list[str] | None = None) -> int:
    from .report import section_main

    return section_main("python -m bench.operations_bench", "transform of a 64-256-256-8 MLP", run,
                        "{:,.3f}", argv)


if __name__ == "__main__":
    sys.exit(main())
