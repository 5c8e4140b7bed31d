"""Score a parquet or CSV dataset with a Keras model on Spark.

    spark-submit --properties-file conf/spark-defaults.conf jobs/score.py \\
        --model model.keras --input data.parquet --output scored.parquet \\
        --features features [--batch-size 1024] [--master local[*]] [--overwrite] \\
        [--on-invalid error|null]

``--model`` is a ``.keras`` file or a spark_keras payload; ``--features`` is one array or
Vector column, or a comma-separated list of scalar columns (or one column per model
input). The output keeps every input column and adds ``--output-col``. It is written to a
temporary folder and renamed into place only when complete. Errors print one line and
exit with status 2; nothing partial is left behind.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
import time
import uuid

logger = logging.getLogger("spark_keras.jobs.score")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="score.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help=".keras file or spark_keras payload")
    p.add_argument("--input", required=True, help="parquet or CSV file/folder")
    p.add_argument("--output", required=True, help="parquet folder to write")
    p.add_argument("--features", required=True, help="comma-separated input column(s)")
    p.add_argument("--output-col", default="prediction")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--master", default=None, help="default: spark-submit's, else local[*]")
    p.add_argument("--format", choices=["parquet", "csv"], default=None,
                   help="input format (default: from the file extension, parquet otherwise)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--on-invalid", choices=["error", "null"], default="error",
                   help="a null/NaN/misshapen row fails the job (error) or gets a null prediction")
    return p.parse_args(argv)


class JobError(Exception):
    """A reason to stop the job, printed as one line."""


def _session(master: str | None):
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("spark-keras-score")
    conf = SparkConf()
    if master or not conf.get("spark.master", None):  # spark-submit --master wins
        builder = builder.master(master or "local[*]")
    if conf.get("spark.executorEnv.TF_USE_LEGACY_KERAS", None) is None:
        # executors must run the driver's Keras flavour (Keras 3 or legacy tf-keras)
        legacy = os.environ.get("TF_USE_LEGACY_KERAS", "0")
        builder = builder.config("spark.executorEnv.TF_USE_LEGACY_KERAS", legacy)
    if not os.environ.get("SPARK_KERAS_BUILD_LOG"):
        build_log = tempfile.mkdtemp(prefix="spark_keras_builds_")
        builder = builder.config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", build_log)
    return builder.getOrCreate()


def _fs(spark, path: str):
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    return hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), hadoop_path


def _read(spark, path: str, fmt: str | None):
    fs, hpath = _fs(spark, path)
    if not fs.exists(hpath):
        raise JobError(f"input path {path!r} does not exist")
    fmt = fmt or ("csv" if path.lower().rstrip("/").endswith(".csv") else "parquet")
    try:
        if fmt == "csv":
            return spark.read.csv(path, header=True, inferSchema=True)
        return spark.read.parquet(path)
    except Exception as exc:  # AnalysisException and friends
        raise JobError(f"cannot read {fmt} input {path!r}: {str(exc).splitlines()[0]}") from exc


def _builds_per_worker(spark) -> dict:
    from spark_keras.cache import read_build_log

    folder = spark.sparkContext.getConf().get("spark.executorEnv.SPARK_KERAS_BUILD_LOG", None) \
        or os.environ.get("SPARK_KERAS_BUILD_LOG")
    counts: dict = {}
    for record in read_build_log(folder) if folder else []:
        worker = f"{record['host']}:{record['pid']}"
        counts[worker] = counts.get(worker, 0) + 1
    return counts


def run(args: argparse.Namespace) -> dict:
    import spark_keras as sk

    spark = _session(args.master)
    try:
        out_fs, out_path = _fs(spark, args.output)
        if out_fs.exists(out_path) and not args.overwrite:
            raise JobError(f"output path {args.output!r} exists; pass --overwrite to replace it")
        df = _read(spark, args.input, args.format)
        features = [c.strip() for c in args.features.split(",") if c.strip()]
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise JobError(f"feature column(s) {missing} not in the input; it has {df.columns}")
        if not os.path.exists(args.model):
            raise JobError(f"model file {args.model!r} does not exist")
        try:
            handle = sk.BroadcastModel(spark, args.model)
        except sk.SparkKerasError as exc:
            raise JobError(f"cannot load model {args.model!r}: {exc}") from exc
        except (OSError, ValueError) as exc:
            raise JobError(f"cannot load model {args.model!r}: {exc}") from exc

        scored = handle.transform(df, features, args.output_col, batch_size=args.batch_size,
                                  on_invalid=args.on_invalid)
        staging = f"{args.output.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        try:
            scored.write.parquet(staging)
            if out_fs.exists(out_path):
                out_fs.delete(out_path, True)
            _, staging_path = _fs(spark, staging)
            if not out_fs.rename(staging_path, out_path):
                raise JobError(f"cannot move the output into {args.output!r}")
        except BaseException:
            staging_fs, staging_path = _fs(spark, staging)
            staging_fs.delete(staging_path, True)
            raise
        seconds = time.perf_counter() - started
        rows = spark.read.parquet(args.output).count()
        builds = _builds_per_worker(spark)
        summary = {"rows": rows, "seconds": round(seconds, 3),
                   "rows_per_second": round(rows / seconds, 1) if seconds else None,
                   "builds_per_worker": builds}
        logger.info("scored %d rows in %.2fs (%.0f rows/s); model builds per worker: %s",
                    rows, seconds, rows / max(seconds, 1e-9), builds)
        return summary
    finally:
        spark.stop()


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def _reason(exc: BaseException) -> str:
    """One line: our own error if a worker raised one, else the last error line."""
    lines = [line.strip() for line in str(exc).splitlines()]
    found = [m for m in map(_ERROR_LINE.match, lines) if m]
    ours = [m for m in found if m.group(1).startswith("spark_keras.")]
    best = (ours or found or [None])[0 if ours else -1]
    return f"{best.group(1).rsplit('.', 1)[-1]}: {best.group(2)}" if best else \
        (lines[0] if lines and lines[0] else type(exc).__name__)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    try:
        summary = run(args)
    except JobError as exc:
        print(f"score.py: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a failed Spark job: the Python error that caused it
        print(f"score.py: error: {_reason(exc)}", file=sys.stderr)
        return 1
    print(f"SCORED rows={summary['rows']} seconds={summary['seconds']} "
          f"rows_per_second={summary['rows_per_second']} builds_per_worker={summary['builds_per_worker']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
