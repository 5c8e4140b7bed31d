"""Score a parquet or CSV dataset with a Keras model on Spark (classic or Spark Connect).

    spark-keras score --model model.keras --input data.parquet --output scored.parquet \\
        --features features [--batch-size 1024] [--master local[*]] [--overwrite] \\
        [--on-invalid error|null [--error-col error]] [--metrics-json metrics.json]

    spark-submit --master yarn [--properties-file spark-defaults.conf] \\
        "$(spark-keras job-file score)" --model ... --input ... --output ... --features ...

    spark-keras score --remote sc://host:15002 --model ... --input ... --output ...
    SPARK_REMOTE="local[2]" python -m spark_keras score --model ... --input ... --output ...

``spark-keras score`` and ``python -m spark_keras score`` run this module's :func:`main`;
spark-submit needs a ``.py`` file, which is this module's file (``spark-keras job-file
score`` prints its path). The repository's ``jobs/score.py`` is a wrapper of it.

``--model`` is a ``.keras`` file or a spark_keras payload, a local path or a URI
(``s3://``, ``hdfs://``...: executors read it from storage, see BroadcastModel); ``--features`` is one array or
Vector column, or a comma-separated list of scalar columns (or one column per model
input). The output keeps every input column and adds ``--output-col`` (and ``--error-col``:
why each invalid row got a null prediction). It is written to a
temporary folder and renamed into place only when complete. Errors print one line and
exit with status 2; nothing partial is left behind.

Python workers fork from ``spark_keras.spark.daemon`` (TensorFlow and Keras imported once
per executor) unless ``spark.python.daemon.module`` is set: ``pyspark.daemon`` turns it off.

Spark Connect (``--remote URL``, default ``$SPARK_REMOTE``; not with ``--master``): there
is no JVM on the client, so path checks and the final rename use ``pyarrow.fs`` here.
Plain paths are local to the client and given to Spark as absolute ``file://`` URIs (the
server must see the same files: a ``local[...]`` remote, or a shared mount); URIs must be
ones pyarrow can open on the client, and the output's filesystem must be able to rename a
directory (local, HDFS: not S3 or GCS), else the job stops with a one-line error first.
Connect ignores ``spark.executorEnv.*``. A ``local[...]`` remote starts a server in this
process whose Python workers inherit its environment, so the job sets
``SPARK_KERAS_BUILD_LOG`` (and ``TF_USE_LEGACY_KERAS``) before starting it and reports
builds per worker as usual. With an ``sc://`` server, builds per worker are what the log
folder in ``$SPARK_KERAS_BUILD_LOG`` shows (only meaningful if the server's workers write
to that same folder), else ``{}``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any, Iterator, Protocol

from spark_keras._deps import require
from spark_keras.errors import MissingDependencyError

logger = logging.getLogger("spark_keras.jobs.score")

APP_NAME = "spark-keras-score"
LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"


PROG = "score.py"  # this file's name: what spark-submit runs and what errors start with


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """The job's options (``--help`` lists them)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help=".keras file or spark_keras payload: a path or a URI (s3://, hdfs://...)")
    p.add_argument("--input", required=True, help="parquet or CSV file/folder")
    p.add_argument("--output", required=True, help="parquet folder to write")
    p.add_argument("--features", required=True, help="comma-separated input column(s)")
    p.add_argument("--output-col", default="prediction")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--master", default=None, help="default: spark-submit's, else local[*]")
    p.add_argument("--remote", default=os.environ.get("SPARK_REMOTE") or None,
                   help="Spark Connect URL (sc://host:port, or local[N] for a local server); "
                        "default: $SPARK_REMOTE")
    p.add_argument("--format", choices=["parquet", "csv"], default=None,
                   help="input format (default: from the file extension, parquet otherwise)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output")
    p.add_argument("--on-invalid", choices=["error", "null"], default="error",
                   help="a null/NaN/misshapen row fails the job (error) or gets a null prediction")
    p.add_argument("--error-col", default=None,
                   help="with --on-invalid null: a string column saying why each invalid row "
                        "got a null prediction (null for scored rows)")
    p.add_argument("--metrics-json", default=None, metavar="PATH",
                   help="write the summary (rows, invalid_rows, model_builds, build_seconds, "
                        "seconds, rows_per_second, builds_per_worker) as JSON to this local file")
    return p.parse_args(argv)


class JobError(Exception):
    """A reason to stop the job, printed as one line."""


DAEMON_MODULE = "spark_keras.spark.daemon"


def _session(master: str | None, build_log: str | None):
    require("pyspark", "the score job")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(APP_NAME)
    SparkContext._ensure_initialized()  # the JVM, so SparkConf() sees spark-submit's settings
    conf = SparkConf()
    if master or not conf.get("spark.master", None):  # spark-submit --master wins
        builder = builder.master(master or "local[*]")
    if conf.get("spark.python.daemon.module", None) is None:
        # workers fork from a daemon that imported TensorFlow and Keras once
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
    if conf.get("spark.executorEnv.TF_USE_LEGACY_KERAS", None) is None:
        # executors must run the driver's Keras flavour (Keras 3 or legacy tf-keras)
        legacy = os.environ.get("TF_USE_LEGACY_KERAS", "0")
        builder = builder.config("spark.executorEnv.TF_USE_LEGACY_KERAS", legacy)
    if conf.get("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", None) is None:
        # executors log TensorFlow's native lines as the driver does
        builder = builder.config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL",
                                 os.environ.get(LOG_LEVEL_ENV, "2"))
    if build_log is not None and conf.get("spark.executorEnv.SPARK_KERAS_BUILD_LOG", None) is None:
        builder = builder.config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", build_log)
    return builder.getOrCreate()


def _is_local(remote: str) -> bool:
    """``local``, ``local[N]``...: pyspark starts the Connect server in this process."""
    return remote.startswith("local")


def _connect_session(remote: str, build_log: str | None):
    """A Spark Connect session. Connect ignores ``spark.executorEnv.*``: a local server's
    Python workers get the environment this process has when the server starts."""
    require("pyspark.sql.connect.session", "the score job on Spark Connect", "connect")
    from pyspark.sql import SparkSession

    if _is_local(remote):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")  # the driver's Keras flavour
        if build_log is not None:  # until the job ends (run)
            os.environ["SPARK_KERAS_BUILD_LOG"] = build_log
    builder = SparkSession.builder.remote(remote).appName(APP_NAME)
    if _is_local(remote):  # a server started here takes our settings; a remote one has its own
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
    return builder.getOrCreate()


class Paths(Protocol):
    """The few file operations the job needs, on the paths the user gave."""

    def qualify(self, path: str) -> str:
        """``path`` as Spark must be given it."""

    def check_output(self, path: str) -> None:
        """Raise :class:`JobError` if ``path`` cannot be staged and renamed into place."""

    def exists(self, path: str) -> bool: ...

    def delete(self, path: str) -> None:
        """Remove a file or a folder and everything under it; nothing if missing."""

    def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to the (absent) ``dst``, or raise :class:`JobError`."""


class HadoopPaths:
    """Classic Spark: Hadoop's FileSystem through the driver's JVM."""

    def __init__(self, spark: Any) -> None:
        self._spark = spark

    def _fs(self, path: str) -> tuple[Any, Any]:
        jvm = self._spark.sparkContext._jvm
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        conf = self._spark.sparkContext._jsc.hadoopConfiguration()
        return hadoop_path.getFileSystem(conf), hadoop_path

    def qualify(self, path: str) -> str:
        return path

    def check_output(self, path: str) -> None:
        pass

    def exists(self, path: str) -> bool:
        fs, hpath = self._fs(path)
        return bool(fs.exists(hpath))

    def delete(self, path: str) -> None:
        fs, hpath = self._fs(path)
        fs.delete(hpath, True)

    def move(self, src: str, dst: str) -> None:
        fs, dst_path = self._fs(dst)
        _, src_path = self._fs(src)
        if not fs.rename(src_path, dst_path):
            raise JobError(f"cannot move the output into {dst!r}")


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")
_NO_DIRECTORY_MOVE = {"s3", "gcs"}  # object stores: pyarrow moves single objects only


class ArrowPaths:
    """Spark Connect: ``pyarrow.fs`` on the client. Plain paths are local ones, made
    absolute (``file://``) so that the server and this client mean the same files."""

    def _fs(self, path: str) -> tuple[Any, str]:
        import pyarrow.fs as pafs

        if not _URI.match(path):
            return pafs.LocalFileSystem(), os.path.abspath(path)
        try:
            return pafs.FileSystem.from_uri(path)
        except (ValueError, OSError) as exc:  # unknown scheme, no libhdfs, bad URI...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise JobError(f"path {path!r} cannot be opened on this Spark Connect client "
                           f"(pyarrow.fs: {reason})") from exc

    def qualify(self, path: str) -> str:
        return path if _URI.match(path) else "file://" + os.path.abspath(path)

    def check_output(self, path: str) -> None:
        fs, _ = self._fs(path)
        if fs.type_name in _NO_DIRECTORY_MOVE:
            raise JobError(f"output path {path!r}: {fs.type_name} cannot rename a folder, so "
                           "the output cannot be published atomically from a Spark Connect "
                           "client; write to a local or HDFS path")

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        fs, fs_path = self._fs(path)
        return fs.get_file_info(fs_path).type != pafs.FileType.NotFound

    def delete(self, path: str) -> None:
        import pyarrow.fs as pafs

        fs, fs_path = self._fs(path)
        kind = fs.get_file_info(fs_path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(fs_path)
        elif kind != pafs.FileType.NotFound:
            fs.delete_file(fs_path)

    def move(self, src: str, dst: str) -> None:
        fs, dst_path = self._fs(dst)
        _, src_path = self._fs(src)
        try:
            fs.move(src_path, dst_path)
        except (OSError, NotImplementedError) as exc:
            raise JobError(f"cannot move the output into {dst!r}: {exc}") from exc


def _check_paths(paths: Paths, args: argparse.Namespace) -> None:
    """Refuse an existing output (unless ``--overwrite``) and a missing input."""
    paths.check_output(args.output)
    if paths.exists(args.output) and not args.overwrite:
        raise JobError(f"output path {args.output!r} exists; pass --overwrite to replace it")
    if not paths.exists(args.input):
        raise JobError(f"input path {args.input!r} does not exist")


def _check_options(args: argparse.Namespace) -> None:
    """Refuse options that do not go together, and a metrics file that cannot be written,
    before any session starts."""
    if args.error_col is not None and args.on_invalid != "null":
        raise JobError(f"--error-col {args.error_col!r} needs --on-invalid null: with "
                       f"--on-invalid {args.on_invalid} an invalid row fails the job")
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


@contextlib.contextmanager
def _job_build_log() -> Iterator[str | None]:
    """A build log folder for this job's workers, removed when the job ends; None when
    ``$SPARK_KERAS_BUILD_LOG`` names one already (kept)."""
    if os.environ.get("SPARK_KERAS_BUILD_LOG"):
        yield None
        return
    folder = tempfile.mkdtemp(prefix="spark_keras_builds_")
    try:
        yield folder
    finally:
        if os.environ.get("SPARK_KERAS_BUILD_LOG") == folder:  # set for a local Connect server
            del os.environ["SPARK_KERAS_BUILD_LOG"]
        shutil.rmtree(folder, ignore_errors=True)


def _open(args: argparse.Namespace, build_log: str | None) -> tuple[Any, Paths]:
    """The session (its workers logging builds in ``build_log`` if given) and its path
    operations, paths checked. On Connect the checks run on the client first, so a bad
    path fails before a server is started or reached."""
    _check_options(args)
    if args.remote:
        if args.master:
            raise JobError(f"--master {args.master!r} cannot be combined with Spark Connect "
                           f"(--remote/SPARK_REMOTE {args.remote!r}); the server has its own")
        paths = ArrowPaths()
        _check_paths(paths, args)
        return _connect_session(args.remote, build_log), paths
    spark = _session(args.master, build_log)
    try:
        paths = HadoopPaths(spark)
        _check_paths(paths, args)
    except BaseException:
        spark.stop()
        raise
    return spark, paths


def _read(spark, paths: Paths, path: str, fmt: str | None):
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


def _build_log_folder(spark, remote: str | None) -> str | None:
    """Where the workers log their model builds: this process's environment on Connect
    (what a local server's workers inherited), else the classic executorEnv setting."""
    if remote:
        return os.environ.get("SPARK_KERAS_BUILD_LOG")
    return _classic_build_log(spark)


def _classic_build_log(spark) -> str | None:
    return spark.sparkContext.getConf().get("spark.executorEnv.SPARK_KERAS_BUILD_LOG", None) \
        or os.environ.get("SPARK_KERAS_BUILD_LOG")


def _builds_per_worker(folder: str | None) -> dict:
    from spark_keras.cache import read_build_log

    counts: dict = {}
    for record in read_build_log(folder) if folder else []:
        worker = f"{record['host']}:{record['pid']}"
        counts[worker] = counts.get(worker, 0) + 1
    return counts


def run(args: argparse.Namespace) -> dict:
    """Score ``args.input`` into ``args.output``; a summary (rows, invalid rows, seconds,
    rows/s, model builds for this job and their seconds, builds per worker in the build
    log), also written to ``--metrics-json``. Raises :class:`JobError` for a reason to stop
    printed as one line. The build log folder the job makes for its workers is removed
    when it ends."""
    os.environ.setdefault(LOG_LEVEL_ENV, "2")  # TensorFlow's INFO and WARNING lines: off
    with _job_build_log() as build_log:
        return _run(args, build_log)


def _run(args: argparse.Namespace, build_log: str | None) -> dict:
    import spark_keras as sk
    from spark_keras import flavour
    from spark_keras.quiet import quiet_tensorflow_startup

    spark, paths = _open(args, build_log)
    try:
        df = _read(spark, paths, args.input, args.format)
        features = [c.strip() for c in args.features.split(",") if c.strip()]
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise JobError(f"feature column(s) {missing} not in the input; it has {df.columns}")
        try:  # a local path, or a URI the executors read from storage themselves
            with quiet_tensorflow_startup():  # start-up lines the log level hides
                flavour.current()  # imports Keras and TensorFlow
            handle = sk.BroadcastModel(spark, args.model)
        except sk.SparkKerasError as exc:  # StorageError, PayloadError...
            raise JobError(f"cannot load model {args.model!r}: {exc}") from exc

        from pyspark.sql import Observation

        observation = Observation("spark_keras_score")
        scored = handle.transform(df, features, args.output_col, batch_size=args.batch_size,
                                  on_invalid=args.on_invalid, error_col=args.error_col,
                                  observe=observation)
        staging = f"{args.output.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        try:
            scored.write.parquet(paths.qualify(staging))
            if paths.exists(args.output):
                paths.delete(args.output)
            paths.move(staging, args.output)
        except BaseException:
            paths.delete(staging)
            raise
        seconds = time.perf_counter() - started
        figures = observation.get
        rows = int(figures["rows"])
        builds = _builds_per_worker(_build_log_folder(spark, args.remote))
        summary = {"rows": rows, "invalid_rows": int(figures["invalid_rows"]),
                   "seconds": round(seconds, 3),
                   "rows_per_second": round(rows / seconds, 1) if seconds else None,
                   "model_builds": int(figures["model_builds"]),
                   "build_seconds": round(float(figures["build_seconds"]), 3),
                   "builds_per_worker": builds}
        logger.info("scored %d rows (%d invalid) in %.2fs (%.0f rows/s); %d model build(s) "
                    "in %.2fs; model builds per worker: %s", rows, summary["invalid_rows"],
                    seconds, rows / max(seconds, 1e-9), summary["model_builds"],
                    summary["build_seconds"], builds)
        if args.metrics_json is not None:
            _write_metrics(args.metrics_json, summary)
        return summary
    finally:
        spark.stop()


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_GRPC_DETAILS = re.compile(r'status = StatusCode\.(\w+)\s+details = "(.*)"')


def _reason(exc: BaseException) -> str:
    """One line: our own error if a worker raised one, else the last error line (or a
    Connect client's gRPC status and details)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    found = [m for m in map(_ERROR_LINE.match, lines) if m]
    ours = [m for m in found if m.group(1).startswith("spark_keras.")]
    best = (ours or found or [None])[0 if ours else -1]
    if best:
        return f"{best.group(1).rsplit('.', 1)[-1]}: {best.group(2)}"
    grpc = _GRPC_DETAILS.search(str(exc))
    if grpc:
        return f"{type(exc).__name__} {grpc[1]}: {grpc[2]}"
    return lines[0] if lines and lines[0] else type(exc).__name__


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the job with command-line ``argv`` (default ``sys.argv[1:]``); the exit status:
    0 done (one ``SCORED ...`` line on stdout), 2 a reason to stop (a bad path or option,
    a missing dependency), 1 a failed Spark job; errors are one ``<prog>: error:`` line."""
    # spark_keras's progress lines; other libraries' (py4j...) only from WARNING up
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("spark_keras").setLevel(logging.INFO)
    args = parse_args(argv, prog)
    try:
        summary = run(args)
    except (JobError, MissingDependencyError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a failed Spark job: the Python error that caused it
        print(f"{prog}: error: {_reason(exc)}", file=sys.stderr)
        return 1
    print(f"SCORED rows={summary['rows']} invalid_rows={summary['invalid_rows']} "
          f"seconds={summary['seconds']} rows_per_second={summary['rows_per_second']} "
          f"model_builds={summary['model_builds']} build_seconds={summary['build_seconds']} "
          f"builds_per_worker={summary['builds_per_worker']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
