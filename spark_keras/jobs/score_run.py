"""Running the score job: check the options and paths, open the session, score the input
into a staging folder, publish it, and report the figures the transform observed."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
import uuid
from typing import Any, Iterator

from spark_keras.errors import ArgumentError, StorageError
from spark_keras.inference.buckets import checked
from spark_keras.inference.options import FLAGS, check_buckets, check_error_col, check_max_invalid
from spark_keras.jobs.score_errors import JobError
from spark_keras.jobs.score_session import LOG_LEVEL_ENV, classic_session, connect_session, settings
from spark_keras.spark.paths import ArrowPaths, HadoopPaths, Paths

__all__ = ["run"]

logger = logging.getLogger("spark_keras.jobs.score")


@contextlib.contextmanager
def _path_errors() -> Iterator[None]:
    """A path the job cannot use stops it, as a bad option does."""
    try:
        yield
    except StorageError as exc:
        raise JobError(str(exc)) from exc


def _check_paths(paths: Paths, args: argparse.Namespace) -> None:
    """Refuse an existing output (unless ``--overwrite``) and a missing input."""
    with _path_errors():
        paths.check_output(args.output)
        if paths.exists(args.output) and not args.overwrite:
            raise JobError(f"output path {args.output!r} exists; pass --overwrite to replace it")
        if not paths.exists(args.input):
            raise JobError(f"input path {args.input!r} does not exist")
        if not paths.exists(args.model):  # before any stage reads the input
            raise JobError(f"cannot load model {args.model!r}: {args.model!r} does not exist")


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options that do not go together, and a metrics file that cannot be written,
    before any session starts."""
    try:
        check_error_col(args.error_col, args.on_invalid, FLAGS)
        args.max_invalid = check_max_invalid(args.max_invalid, args.on_invalid, FLAGS)
        args.buckets = check_buckets(args.buckets, FLAGS)
    except ArgumentError as exc:
        raise JobError(str(exc)) from None
    if args.metrics_json is not None:
        folder = os.path.dirname(os.path.abspath(args.metrics_json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise JobError(f"--metrics-json {args.metrics_json!r}: folder {folder!r} does not "
                           f"exist or is not writable")


def _write_metrics(path: str, summary: dict) -> None:
    import json

    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    except OSError as exc:
        raise JobError(f"cannot write --metrics-json {path!r}: {exc}") from exc


def _open(args: argparse.Namespace) -> tuple[Any, Paths]:
    """The session and its path operations, paths checked. On Connect the checks run on
    the client first, so a bad path fails before a server is started or reached."""
    _check_options(args)
    user = settings(args.conf, args.properties_file)
    if args.remote:
        if args.master:
            raise JobError(f"--master {args.master!r} cannot be combined with Spark Connect "
                           f"(--remote/SPARK_REMOTE {args.remote!r}); the server has its own")
        paths: Paths = ArrowPaths()
        _check_paths(paths, args)
        return connect_session(args.remote, user, args.verbose), paths
    spark = classic_session(args.master, user, args.verbose)
    try:
        paths = HadoopPaths(spark)
        _check_paths(paths, args)
    except BaseException:
        spark.stop()
        raise
    return spark, paths


def _read(spark: Any, paths: Paths, path: str, fmt: str | None) -> Any:
    fmt = fmt or ("csv" if path.lower().rstrip("/").endswith(".csv") else "parquet")
    try:
        if fmt == "csv":
            df = spark.read.csv(paths.qualify(path), header=True, inferSchema=True)
        else:
            df = spark.read.parquet(paths.qualify(path))
        df.schema  # noqa: B018  (Connect analyses lazily: fail here, not later)
        return df
    except Exception as exc:  # AnalysisException and friends
        raise JobError(f"cannot read {fmt} input {path!r}: {str(exc).splitlines()[0]}") from exc


def _publish(scored: Any, paths: Paths, output: str) -> None:
    """Write ``scored`` to a staging folder beside ``output``, then rename it into place
    (replacing an old output); the staging folder is removed if anything fails."""
    staging = f"{output.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
    with _path_errors():
        try:
            scored.write.parquet(paths.qualify(staging))
            if paths.exists(output):
                paths.delete(output)
            paths.move(staging, output)
        except BaseException:
            paths.delete(staging)
            raise


def run(args: argparse.Namespace) -> dict:
    """Score ``args.input`` into ``args.output``.

    Returns:
        The summary, also written to ``--metrics-json``: rows, invalid rows, seconds,
        rows/s, and the model builds the query's tasks made and their seconds (the
        transform's ``observe`` figures, gathered by Spark from every executor).

    Raises:
        JobError: a reason to stop, printed as one line (a bad path or option, a model
            that cannot be loaded).
    """
    import spark_keras as sk
    from spark_keras import flavour
    from spark_keras.quiet import quiet_tensorflow_startup

    os.environ.setdefault(LOG_LEVEL_ENV, "2")  # TensorFlow's INFO and WARNING lines: off
    spark, paths = _open(args)
    try:
        df = _read(spark, paths, args.input, args.format)
        features = [c.strip() for c in args.features.split(",") if c.strip()]
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise JobError(f"feature column(s) {missing} not in the input; it has {df.columns}")
        if args.id_col is not None and args.id_col not in df.columns:
            raise JobError(f"--id-col {args.id_col!r} is not a column of the input; it has "
                           f"{df.columns}")
        try:  # a local path, or a URI the executors read from storage themselves
            with quiet_tensorflow_startup():  # start-up lines the log level hides
                flavour.current()  # imports Keras and TensorFlow
            handle = sk.BroadcastModel(spark, args.model, resize=args.resize,
                                        version=args.model_version)
        except sk.SparkKerasError as exc:  # StorageError, PayloadError...
            raise JobError(f"cannot load model {args.model!r}: {exc}") from exc
        try:  # the model takes padded rows, or this says why
            checked(handle, args.buckets, FLAGS)
        except ArgumentError as exc:
            raise JobError(str(exc)) from None

        from pyspark.sql import Observation

        observation = Observation("spark_keras_score")
        scored = handle.transform(df, features, args.output_col, batch_size=args.batch_size,
                                  on_invalid=args.on_invalid, error_col=args.error_col,
                                  observe=observation, max_invalid=args.max_invalid,
                                  id_col=args.id_col, version_col=args.version_col,
                                  buckets=args.buckets)
        started = time.perf_counter()
        _publish(scored, paths, args.output)
        seconds = time.perf_counter() - started
        figures = observation.get
        rows = int(figures["rows"])
        summary = {"rows": rows, "invalid_rows": int(figures["invalid_rows"]),
                   "seconds": round(seconds, 3),
                   "rows_per_second": round(rows / seconds, 1) if seconds else None,
                   "model_builds": int(figures["model_builds"]),
                   "build_seconds": round(float(figures["build_seconds"]), 3)}
        logger.info("scored %d rows (%d invalid) in %.2fs (%.0f rows/s); %d model build(s) "
                    "in %.2fs", rows, summary["invalid_rows"], seconds,
                    rows / max(seconds, 1e-9), summary["model_builds"],
                    summary["build_seconds"])
        if args.metrics_json is not None:
            _write_metrics(args.metrics_json, summary)
        return summary
    finally:
        spark.stop()
