"""A Keras model as a stage of a Spark ML Pipeline: fit, save, load, score.

    python jobs/pipeline.py [--master local[2]] [--out demo-out/pipeline] [--rows 20000]

1. Generates a tabular dataset (four numeric columns on very different scales, a binary
   label) and writes it as parquet; trains a small Keras classifier on the standardized
   features (NumPy, on the driver).
2. Fits ``Pipeline([VectorAssembler, StandardScaler, KerasTransformer, Bucketizer])`` on
   Spark: Spark's stages assemble and scale the columns into an ML Vector, the Keras
   model scores it (``probability``), a Bucketizer turns that into ``predicted``.
3. Saves the PipelineModel (the Keras stage's folder holds its payload, ``payload.skp``),
   loads it back, scores the data with both and checks the predictions are bit-identical.
4. Writes the loaded pipeline's predictions as parquet and prints one summary line:
   ``PIPELINE rows=... accuracy=... identical=yes workers=... builds_per_worker=1 seconds=...``
   (the most times any Python worker built either stage's model).

Python workers fork from ``spark_keras.executor.daemon`` (TensorFlow imported once per
executor); ``--master local-cluster[2,1,1024]`` runs two executor JVMs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES = ["tenure", "spend", "visits", "rating"]
SCALES = [12.0, 800.0, 30.0, 0.9]  # very different scales: the model needs the scaler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="pipeline.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", default=os.path.join(ROOT, "demo-out", "pipeline"),
                   help="folder for the data, the saved pipeline and the predictions (replaced)")
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--partitions", type=int, default=4)
    return p.parse_args(argv)


def make_data(rows: int, seed: int = 0):
    """A pandas frame: id, the feature columns, and a label that depends on all of them."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    z = rng.standard_normal((rows, len(FEATURES)))
    logits = z @ np.array([1.5, -2.0, 1.0, 0.8]) + 0.7 * z[:, 0] * z[:, 2]
    label = (logits + 0.3 * rng.standard_normal(rows) > 0).astype("int32")
    frame = pd.DataFrame(z * SCALES + [24.0, 3000.0, 60.0, 3.5], columns=FEATURES)
    frame.insert(0, "id", np.arange(rows, dtype="int64"))
    frame["label"] = label
    return frame


def train(frame):
    """A small Keras classifier, trained on the features standardized as Spark's
    StandardScaler(withMean=True) does (sample standard deviation)."""
    from spark_keras.quiet import quiet_tensorflow_startup

    with quiet_tensorflow_startup():  # TensorFlow's start-up lines that the log level hides
        import keras

    x = frame[FEATURES].to_numpy()
    x = ((x - x.mean(axis=0)) / x.std(axis=0, ddof=1)).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((len(FEATURES),)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ], name="churn_mlp")
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    model.fit(x, frame["label"].to_numpy(), epochs=8, batch_size=128, verbose=0)
    _, accuracy = model.evaluate(x, frame["label"].to_numpy(), verbose=0)
    print(f"trained {model.name} on {len(x):,} rows; training accuracy in Keras {accuracy:.4f}")
    return model


def session(master: str, build_log: str):
    from pyspark.sql import SparkSession

    # Python workers run this interpreter (the one with TensorFlow), unless told otherwise
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(master).appName("spark-keras-pipeline")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.daemon.module", "spark_keras.executor.daemon")
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
             .config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", build_log)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_data(spark, path: str, partitions: int):
    """The dataset, in the same partitions and row order whichever process reads it (so
    every process scores the very same Arrow batches)."""
    return spark.read.parquet(path).repartition(partitions, "id").sortWithinPartitions("id")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # driver and (executorEnv) workers
    started = time.perf_counter()
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    data_path = os.path.join(args.out, "data.parquet")
    model_path = os.path.join(args.out, "pipeline-model")
    scored_path = os.path.join(args.out, "scored.parquet")

    frame = make_data(args.rows)
    frame.to_parquet(data_path, index=False)
    model = train(frame)

    import numpy as np
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import Bucketizer, StandardScaler, VectorAssembler

    from spark_keras.cache import read_build_log
    from spark_keras.ml import KerasTransformer

    # the workers' build records: the caller's folder, or one removed when the job ends
    scratch = tempfile.TemporaryDirectory(prefix="spark_keras_")
    build_log = os.environ.get("SPARK_KERAS_BUILD_LOG") or scratch.name
    spark = session(args.master, build_log)
    try:
        df = read_data(spark, data_path, args.partitions).cache()
        pipeline = Pipeline(stages=[
            VectorAssembler(inputCols=FEATURES, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="features", withMean=True, withStd=True),
            KerasTransformer(model=model, inputCol="features", outputCol="probability",
                             batchSize=1024),
            Bucketizer(splits=[-float("inf"), 0.5, float("inf")], inputCol="probability",
                       outputCol="predicted"),
        ])
        fitted = pipeline.fit(df)
        columns = ["id", "label", "probability", "predicted"]
        first = fitted.transform(df).select(*columns).toPandas().sort_values("id")

        fitted.write().overwrite().save(model_path)
        loaded = PipelineModel.load(model_path)
        scored = loaded.transform(df).select(*columns)
        scored.write.mode("overwrite").parquet(scored_path)
        again = spark.read.parquet(scored_path).toPandas().sort_values("id")

        identical = all(np.array_equal(first[c].to_numpy(), again[c].to_numpy())
                        for c in ("id", "probability", "predicted"))
        accuracy = float((again["predicted"].to_numpy() == again["label"].to_numpy()).mean())
        # builds of each stage's model (the fitted one, the loaded one) by each Python worker
        keys = {p.stages[2].broadcastModel(spark).key for p in (fitted, loaded)}
        builds: dict[tuple, int] = {}
        for record in read_build_log(build_log):
            if record["key"] in keys:
                worker = (record["key"], record["host"], record["pid"])
                builds[worker] = builds.get(worker, 0) + 1
    finally:
        spark.stop()
        scratch.cleanup()

    stages = os.path.join(model_path, "stages")
    keras_stage = next(name for name in os.listdir(stages) if "KerasTransformer" in name)
    payload = os.path.join(stages, keras_stage, "payload.skp")
    print(f"saved the pipeline at {model_path}; Keras stage payload "
          f"{os.path.getsize(payload) / 1024:.1f} KiB")
    print(f"PIPELINE rows={len(again)} accuracy={accuracy:.4f} "
          f"identical={'yes' if identical else 'NO'} "
          f"workers={len({w[1:] for w in builds})} "
          f"builds_per_worker={max(builds.values(), default=0)} "
          f"seconds={time.perf_counter() - started:.1f}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
