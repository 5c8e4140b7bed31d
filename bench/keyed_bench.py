"""`python -m bench.keyed_bench [--quick]`: KeyedModels against one BroadcastModel per key.

Twelve scoring MLPs (64-256-256-1, different weights) on local[2], 20,000 rows per key,
into the ``noop`` sink, the modes interleaved over the rounds:

* ``12 x BroadcastModel.transform``: twelve queries, each on the rows of its key
  (``df.where(key == k)`` of one cached frame), the way it is done by hand;
* ``KeyedModels.transform, clustered``: one query on the frame clustered by key
  (``repartition(8, "key").sortWithinPartitions("key")``, cached): a batch mostly holds
  one key;
* ``KeyedModels.transform, random order``: one query on the frame in random key order:
  every batch holds every key, and each worker's cache (4 models by default) turns over.

Every row's prediction is checked first against its key's own BroadcastModel (exact).
Then the executor's payload folder: one file per model that a worker used.

Then the curve (issue 55 item 10): for 2, 5, 12, 20 and 50 models on the same 240,000 rows,
the frame in random key order (8 partitions) against the rows clustered by key in 8
partitions of as many rows (``repartitionByRange(8, "key", "id")``, sorted within: each
task holds a few keys, each in one run), one count at a time, the two modes interleaved
over the rounds, each checked exact first (3 keys' rows against their own BroadcastModel).
Each worker's cache makes room for every key's model (up to 64), so rows in random key
order build each model once per worker; a task puts consecutive batches of mixed keys
together until each key has about two model calls' rows
(:mod:`spark_keras.inference.keyed_batches`). Targets: random order at 0.8x clustered or
better with 12 models and on the curve up to 20 keys, 0.5x with 50.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

KEYS = 12
ROWS_PER_KEY = 20_000
CURVE_KEYS = (2, 5, 12, 20, 50)  # the curve: as many rows, these many models
FEATURES = 64
MODES = ("12 x BroadcastModel.transform", "KeyedModels.transform, clustered",
         "KeyedModels.transform, random order")


def _frame(spark, rows: int, keys: int = KEYS):
    from pyspark.sql import functions as F

    values = [F.rand(seed=j).cast("float") for j in range(FEATURES)]
    return spark.range(rows, numPartitions=8).select(
        "id", F.concat(F.lit("k"), (F.col("id") % keys).cast("string")).alias("key"),
        F.array(*values).alias("features"))


def _noop(df) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def _separate(handles, df) -> float:
    from pyspark.sql import functions as F

    return sum(_noop(bm.transform(df.where(F.col("key") == key), "features"))
               for key, bm in handles.items())


def _payload_files() -> list[tuple[str, int]]:
    """(name, bytes) of the payload files in this executor's folder."""
    from spark_keras.executor.transport.executor_file import executor_folder

    folder = executor_folder()
    if not folder or not os.path.isdir(folder):
        return []
    return [(n, os.path.getsize(os.path.join(folder, n))) for n in os.listdir(folder)
            if n.endswith(".skp")]


def _files(spark) -> list[tuple[str, int]]:
    import json

    import pyarrow as pa

    def report(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(_payload_files())])], names=["f"])

    found = spark.range(2, numPartitions=2).mapInArrow(report, "f string").collect()
    return sorted({tuple(f) for r in found for f in json.loads(r.f)})


def _check(handles, keyed, df) -> None:
    """KeyedModels gives each row the prediction its key's own BroadcastModel gives."""
    from pyspark.sql import functions as F

    sample = df.where(F.col("id") < 50 * KEYS)
    got = {r.id: r.prediction for r in keyed.transform(sample, "features", key="key")
           .select("id", "prediction").collect()}
    want = {r.id: r.prediction for key, bm in handles.items()
            for r in bm.transform(sample.where(F.col("key") == key), "features")
            .select("id", "prediction").collect()}
    assert want and {i: got.get(i) for i in want} == want, \
        sorted(i for i in want if got.get(i) != want[i])[:10]


def run(quick: bool = False, repeats: int = 4) -> list[dict]:
    """One row per mode: rows/s and the ratio to the twelve separate transforms."""
    return run_all(quick, repeats)[0]


def run_all(quick: bool = False, repeats: int = 4) -> tuple[list[dict], list[dict], list[dict]]:
    """:func:`run`'s rows, the executor's payload files of the KeyedModels' models, and the
    curve (:func:`_curve`)."""
    import spark_keras as sk
    from bench.models import mlp_model
    from bench.sessions import local_session

    per_key = 500 if quick else ROWS_PER_KEY
    repeats = 1 if quick else repeats
    rows = per_key * KEYS
    spark = local_session("keyed-bench", driver_memory="4g")
    try:
        models = {f"k{i}": mlp_model() for i in range(KEYS)}
        random = _frame(spark, rows).cache()
        clustered = random.repartition(8, "key").sortWithinPartitions("key").cache()
        random.count(), clustered.count()
        handles = {k: sk.BroadcastModel(spark, m) for k, m in models.items()}
        keyed = sk.KeyedModels(spark, models)
        _check(handles, keyed, random)
        runs = {MODES[0]: lambda: _separate(handles, random),
                MODES[1]: lambda: _noop(keyed.transform(clustered, "features", key="key")),
                MODES[2]: lambda: _noop(keyed.transform(random, "features", key="key"))}
        for mode in MODES:  # warm-up: every worker builds what it needs
            runs[mode]()
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(repeats):
            for mode in MODES:
                times[mode].append(runs[mode]())
        files = _files(spark)
        keyed_files = [f for f in files if any(f[0].startswith(keyed[k].key) for k in keyed.keys())]
        base = times[MODES[0]]
        out = [{"mode": mode, "rows": rows, "rows/s": rows / min(times[mode]),
                "x 12 transforms": min(base) / min(times[mode]),
                "x 12 transforms, median of rounds": statistics.median(
                    b / t for b, t in zip(base, times[mode]))} for mode in MODES]
        for row in out:
            row["x clustered"] = min(times[MODES[1]]) / min(times[row["mode"]])
        memory = [{"models": KEYS, "payload MB each": keyed["k0"].nbytes / 2**20,
                   "executor payload files": len(keyed_files),
                   "their MB": sum(size for _, size in keyed_files) / 2**20}]
        keyed.destroy()
        for bm in handles.values():
            bm.destroy()
        curve = _curve(spark, rows, (2, 20) if quick else CURVE_KEYS, repeats)
    finally:
        spark.stop()
    return out, memory, curve


def _curve(spark, rows: int, counts: tuple[int, ...], repeats: int) -> list[dict]:
    """Per count of models: KeyedModels on ``rows`` rows in random key order against the
    rows clustered by key in as many balanced partitions, checked exact first on a sample
    against 3 keys' own models, then a warm-up of each mode and ``repeats`` rounds of the
    two interleaved. One count at a time: the models of another count would turn the
    workers' caches over (at most 64 models) and charge their builds to the mode run first."""
    import spark_keras as sk
    from bench.models import mlp_model

    out = []
    for n in counts:
        models = {f"k{i}": mlp_model() for i in range(n)}
        random = _frame(spark, rows, n).cache()
        clustered = random.repartitionByRange(8, "key", "id").sortWithinPartitions(
            "key", "id").cache()
        random.count(), clustered.count()
        keyed = sk.KeyedModels(spark, models)
        handles = {k: sk.BroadcastModel(spark, models[k]) for k in list(models)[:3]}
        try:
            _check(handles, keyed, random)
            modes = {"clustered": clustered, "random": random}
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            for df in modes.values():  # warm-up: every worker builds what it needs
                _noop(keyed.transform(df, "features", key="key"))
            for _ in range(repeats):
                for mode, df in modes.items():
                    times[mode].append(_noop(keyed.transform(df, "features", key="key")))
        finally:
            for handle in [keyed, *handles.values()]:
                handle.destroy()
            random.unpersist()
            clustered.unpersist()
        out.append({"models": n, "rows": rows,
                    "clustered rows/s": rows / min(times["clustered"]),
                    "random order rows/s": rows / min(times["random"]),
                    "x clustered": min(times["clustered"]) / min(times["random"]),
                    "x clustered, median of rounds": statistics.median(
                        c / r for c, r in zip(times["clustered"], times["random"]))})
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.report import section_main

    return section_main("python -m bench.keyed_bench", "KeyedModels against one "
                        "BroadcastModel per key", run, "{:,.3f}", argv)


if __name__ == "__main__":
    sys.exit(main())
