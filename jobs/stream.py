"""Score a stream of parquet files with a Keras model: Structured Streaming on embedded
local Spark.

    .venv/bin/python jobs/stream.py [--out DIR] [--files 6] [--rows 2000] [--master local[2]]

1. Writes ``--files`` parquet files of ``--rows`` rows each (``id``, ``features``: 16
   floats, ``label``) into ``DIR/input``, and trains a small Keras classifier on data
   drawn the same way.
2. Streams the folder through ``BroadcastModel.transform`` into a parquet sink
   (``DIR/sink``) with a checkpoint (``DIR/checkpoint``): one file per micro-batch
   (``maxFilesPerTrigger=1``), ``trigger(availableNow=True)`` so the query stops once
   everything there is scored. A long-running query would use
   ``trigger(processingTime="10 seconds")`` (or none) and keep picking up new files.
3. Reads the sink back, checks every row is there once with the prediction the driver's
   model gives on the same file, and prints one summary line (wrapped here):

    STREAMED rows=12000 unique_ids=12000 batches=6 mismatches=0 accuracy=0.9712 workers=1
        builds_per_worker=1 seconds=14.2 out=...

``builds_per_worker`` comes from the build log (``SPARK_KERAS_BUILD_LOG``): each Python
worker built the model once, whatever the number of micro-batches. Restarting the query
with the same checkpoint scores only files it has not committed; see docs/guide/models-that-change.md
("Structured Streaming") for stopping, restarting and switching model versions.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

N_FEATURES = 16
SCHEMA = "id long, features array<float>, label int"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="stream.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None,
                   help="a new or empty folder, kept (default: a temporary one, removed at the end)")
    p.add_argument("--files", type=int, default=6, help="input files, one per micro-batch")
    p.add_argument("--rows", type=int, default=2000, help="rows per input file")
    p.add_argument("--master", default="local[2]")
    return p.parse_args(argv)


def draw(seed: int, rows: int):
    """Features and labels: the label is whether a fixed linear score is positive."""
    import numpy as np

    x = np.random.default_rng(seed).standard_normal((rows, N_FEATURES), dtype=np.float32)
    w = np.linspace(-1.0, 1.0, N_FEATURES, dtype=np.float32)
    return x, (x @ w > 0).astype(np.int32)


def write_inputs(folder: str, files: int, rows: int) -> None:
    """``files`` parquet files; each is written aside and renamed in, so the stream never
    lists a half-written file."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder)
    for i in range(files):
        x, y = draw(seed=100 + i, rows=rows)
        flat = pa.array(x.reshape(-1), pa.float32())
        table = pa.table({
            "id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
            "features": pa.FixedSizeListArray.from_arrays(flat, N_FEATURES).cast(pa.list_(pa.float32())),
            "label": y,
        })
        aside = os.path.join(os.path.dirname(folder), f".input-{i}.parquet")
        pq.write_table(table, aside)
        os.replace(aside, os.path.join(folder, f"part-{i:05d}.parquet"))


def train():
    from spark_keras.quiet import quiet_tensorflow_startup

    with quiet_tensorflow_startup():  # TensorFlow's start-up lines that the log level hides
        import keras

    keras.utils.set_random_seed(0)
    x, y = draw(seed=0, rows=4000)
    model = keras.Sequential([keras.Input((N_FEATURES,)),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")], name="stream_mlp")
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=5, batch_size=64, verbose=0)
    return model


def session(master: str, build_log: str):
    """Embedded Spark with the settings of conf/spark-defaults.conf that matter here."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName("spark-keras-stream")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.pyspark.python", sys.executable)
             .config("spark.python.worker.reuse", "true")
             .config("spark.python.daemon.module", "spark_keras.executor.daemon")
             .config("spark.executorEnv.KERAS_BACKEND", "tensorflow")
             .config("spark.executorEnv.TF_USE_LEGACY_KERAS", os.environ.get("TF_USE_LEGACY_KERAS", "0"))
             .config("spark.executorEnv.TF_NUM_INTRAOP_THREADS", "1")
             .config("spark.executorEnv.TF_NUM_INTEROP_THREADS", "1")
             .config("spark.executorEnv.OMP_NUM_THREADS", "1")
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
             .config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", build_log)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # driver and (executorEnv) workers
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    scratch = None if args.out else tempfile.TemporaryDirectory(prefix="spark_keras_stream_")
    out = os.path.abspath(args.out) if args.out else scratch.name
    try:
        return _run(args, out)
    finally:
        if scratch is not None:
            scratch.cleanup()


def _run(args: argparse.Namespace, out: str) -> int:
    if os.path.exists(out) and os.listdir(out):
        print(f"stream.py: {out} is not empty; give a new or empty --out", file=sys.stderr)
        return 2
    inputs, sink, checkpoint, build_log = (os.path.join(out, name) for name in
                                           ("input", "sink", "checkpoint", "builds"))
    write_inputs(inputs, args.files, args.rows)
    model = train()

    import numpy as np

    import spark_keras as sk
    from spark_keras.cache import read_build_log
    from spark_keras.inference import predictor_for

    spark = session(args.master, build_log)
    try:
        started = time.perf_counter()
        bm = sk.BroadcastModel(spark, model)
        stream = (spark.readStream.schema(SCHEMA)
                  .option("maxFilesPerTrigger", 1)  # one file per micro-batch
                  .parquet(inputs))
        query = (bm.transform(stream, "features", "prediction")
                 .writeStream.format("parquet")
                 .option("path", sink)
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True)
                 .start())
        query.awaitTermination()
        if query.exception() is not None:
            print(f"stream.py: the query failed: {query.exception()}", file=sys.stderr)
            return 1
        seconds = time.perf_counter() - started
        batches = sum(1 for p in query.recentProgress if p["numInputRows"])
        scored = spark.read.parquet(sink).select("id", "label", "prediction").toPandas()
        builds = collections.Counter(r["pid"] for r in read_build_log(build_log) if r["key"] == bm.key)
    finally:
        spark.stop()

    # the driver's prediction for each file (one Arrow batch on a worker), to compare with
    predict = predictor_for(model)
    expected = np.concatenate([predict([draw(seed=100 + i, rows=args.rows)[0]], 1024)[0].reshape(-1)
                               for i in range(args.files)])
    scored = scored.sort_values("id")
    ids = scored["id"].to_numpy()
    complete = len(ids) == len(expected) and np.array_equal(ids, np.arange(len(expected)))
    got = scored["prediction"].to_numpy(dtype=np.float32)
    mismatches = int((got != expected).sum()) if complete else len(expected)
    accuracy = float(((got > 0.5) == scored["label"].to_numpy().astype(bool)).mean()) if len(got) else 0.0
    print(f"STREAMED rows={len(scored)} unique_ids={len(set(ids.tolist()))} batches={batches} "
          f"mismatches={mismatches} accuracy={accuracy:.4f} workers={len(builds)} "
          f"builds_per_worker={','.join(str(n) for n in sorted(builds.values())) or '-'} "
          f"seconds={seconds:.1f} out={out}")
    return 0 if complete and mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
