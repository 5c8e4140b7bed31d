"""Running the score job: check the options and paths
(:mod:`spark_keras.jobs.score.checks`), open the session, score the input into a staging
folder, publish it, and report the figures the transform observed; with ``--resume``, in
commits (:mod:`spark_keras.jobs.score.commits`) of the groups its manifest fixes
(:mod:`spark_keras.jobs.score.manifest`). What is written, in which format, and the
quarantine: :mod:`spark_keras.jobs.score.outputs`."""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
import uuid
from typing import Any, Callable

from spark_keras import storage
from spark_keras._deps import require
from spark_keras.errors import ArgumentError, StorageError, WorkersPythonError
from spark_keras.executor.transport import is_connect
from spark_keras.inference.buckets import checked
from spark_keras.inference.options import FLAGS
from spark_keras.jobs.score import manifest
from spark_keras.jobs.score import outputs as outputs_
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.checks import check_apart, check_options, check_paths, path_errors
from spark_keras.jobs.score.early import before_spark, check_columns, model_digests
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import HadoopPaths, Paths, glob_escaped
from spark_keras.jobs.score.imports import explain_load_failure, import_modules, registered_objects, ship_modules
from spark_keras.jobs.score.inflight import run_groups
from spark_keras.jobs.score.lease import Leases
from spark_keras.jobs.score.outputs import Outputs
from spark_keras.jobs.score.parallel import Jobs
from spark_keras.jobs.score.progress import Heartbeat, scoring_line
from spark_keras.jobs.score.session import LOG_LEVEL_ENV, classic_session, connect_session, settings
from spark_keras.jobs.score.trust import GROUP_COL
from spark_keras.jobs.score.verdict import check_not_all_invalid
from spark_keras.spark.figures import reasons_observed

__all__ = ["run", "score", "manifest_options"]

logger = logging.getLogger("spark_keras.jobs.score")


def _write_metrics(path: str, summary: dict) -> None:
    """Write the summary whole (a reader polling it during a run sees one or the next)."""
    import json

    try:
        storage.write_local(path, json.dumps(summary, indent=2).encode("utf-8"))
    except StorageError as exc:
        raise JobError(f"cannot write --metrics-json {path!r}: {exc}") from exc


def _require_packages(remote: str | None) -> None:
    """PySpark, and with ``remote`` Spark Connect's client: a one-line refusal naming the
    extra that installs what is missing."""
    if remote:
        require("pyspark.sql.connect.session", "the score job on Spark Connect", "connect")
    else:
        require("pyspark", "the score job")


def _open(args: argparse.Namespace) -> tuple[Any, Paths]:
    """The session and its path operations, paths checked. On Connect the checks run on
    the client first, so a bad path fails before a server is started or reached."""
    # the packages the job needs, the answers the files give, then the user's modules,
    # before Spark starts (a missing package first: no path can mend it)
    _require_packages(args.remote)
    before_spark(args, _format(args.input, args.format), _features(args), manifest_options(args))
    import_modules(args.imports)
    user = settings(args.conf, args.properties_file)
    if args.remote:
        if args.master:
            raise JobError(f"--master {args.master!r} cannot be combined with Spark Connect "
                           f"(--remote/SPARK_REMOTE {args.remote!r}); the server has its own")
        paths: Paths = ArrowPaths()  # the client's own check first: no use checking paths
        check_paths(paths, args)
        return connect_session(args.remote, user, args.verbose), paths
    spark = classic_session(args.master, user, args.verbose)
    try:
        paths = HadoopPaths(spark)
        check_paths(paths, args)
    except BaseException:
        spark.stop()
        raise
    return spark, paths


def _format(path: str, fmt: str | None) -> str:
    """``--format``, else the input's by its extension: parquet unless ``.csv``."""
    return fmt or ("csv" if path.lower().rstrip("/").endswith(".csv") else "parquet")


def _reader(spark: Any, fmt: str, schema: Any = None) -> Any:
    reader = spark.read.format(fmt) if schema is None else spark.read.format(fmt).schema(schema)
    return reader.options(header=True, inferSchema=True) if fmt == "csv" else reader


def _read(spark: Any, paths: Paths, path: str, fmt: str) -> Any:
    try:
        df = _reader(spark, fmt).load(paths.qualify(path))
        df.schema  # noqa: B018  (Connect analyses lazily: fail here, not later)
        return df
    except Exception as exc:  # AnalysisException and friends
        raise JobError(f"cannot read {fmt} input {path!r}: {str(exc).splitlines()[0]}") from exc


def _group_reader(spark: Any, paths: Paths, args: argparse.Namespace, fmt: str,
                  schema: Any) -> Any:
    """The DataFrame of some of the input's files, as one read of the whole input gives
    their rows: its schema (CSV inference, partition columns), its base folder."""
    def read(files: list[str]) -> Any:
        reader = _reader(spark, fmt, schema)
        if files != [args.input]:  # a folder's files: its partition folders are columns
            reader = reader.option("basePath", paths.qualify(args.input))
        return reader.load([glob_escaped(paths.qualify(f)) for f in files])
    return read


def _features(args: argparse.Namespace) -> list[str]:
    return [c.strip() for c in args.features.split(",") if c.strip()]


def manifest_options(args: argparse.Namespace) -> dict:
    """What a ``--resume`` run's manifest holds of the options (the keys of
    :data:`spark_keras.jobs.score.manifest.OPTIONS`): those that change what a row
    becomes or where it goes."""
    versioned = args.version_col is not None or args.invalid_output is not None
    return {"features": _features(args), "output_col": args.output_col,
            "format": _format(args.input, args.format),
            "on_invalid": args.on_invalid, "error_col": args.error_col,
            "id_col": args.id_col, "resize": args.resize, "buckets": args.buckets,
            "version_col": args.version_col,
            # the label only matters where it is written; BroadcastModel's default is "1"
            "model_version": None if not versioned
            else (args.model_version if args.model_version is not None else "1"),
            "output_format": args.output_format, "partition_by": args.partition_by,
            "invalid_output": args.invalid_output, "drop_invalid": args.drop_invalid,
            "unsafe_deserialization": args.unsafe_deserialization}


def _plan(paths: Paths, args: argparse.Namespace, df: Any, output: str | None) -> manifest.Plan:
    """The groups of a ``--resume`` run into ``output`` (None: a table this run makes), or
    why its output cannot be resumed (before the model is loaded: the model file's digest
    is its bytes')."""
    with path_errors():
        return manifest.plan(paths, args.input, output,
                             model_sha256=manifest.file_sha256(args.model),
                             model_digests=model_digests(args.model),
                             options=manifest_options(args),
                             commit_bytes=args.commit_bytes, overwrite=args.overwrite,
                             spark_files=len(df.inputFiles()), slots=Jobs(df.sparkSession).slots(),
                             invalid_output=args.invalid_output)


def _table_location(spark: Any, paths: Paths, args: argparse.Namespace) -> str | None:
    """``--output-table``: refuse an existing table unless ``--overwrite`` (or, with
    ``--resume``, one whose location holds this job's commit log, or no rows: a run
    killed before its first commit); the location of the table to resume, None when this
    run makes the table (dropping an existing one)."""
    name = args.output_table
    if not outputs_.table_exists(spark, name):
        return None
    if args.overwrite:
        return None
    location = outputs_.table_location(spark, name)
    with path_errors():
        resumable = manifest.has_commit_log(paths, location)
        empty = not resumable and (not paths.exists(location)
                                   or not manifest.list_input(paths, location))
    if args.resume and resumable:
        return location
    if args.resume and empty:
        return None
    if args.resume:
        raise JobError(f"--output-table {name!r} exists and its location {location!r} holds "
                       f"no commit log of a resumable run; pass --overwrite to replace it")
    raise JobError(f"--output-table {name!r} exists; pass --overwrite to replace it"
                   + (" (or --resume to continue it)" if resumable else ""))


def _publish(scored: Any, paths: Paths, outputs: Outputs, overwrite: bool,
             held: Callable[[], None], written: Callable[[], None] = lambda: None) -> None:
    """Write ``scored`` (:meth:`Outputs.write`) to staging folders beside the output and
    the invalid rows' output, then, if ``written()`` (it may raise: the rows' verdict)
    and this job still ``held`` its folders (it raises otherwise), rename them into place
    (replacing old ones); a table is saved by Spark's writer between the two, checked as
    it begins. Staging folders are removed if anything fails."""
    staging = {target: f"{target.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
               for target in (outputs.path, outputs.invalid_path) if target is not None}
    with path_errors():
        try:
            main, invalid = (None if t is None else paths.qualify(staging[t])
                             for t in (outputs.path, outputs.invalid_path))
            if outputs.path is None:  # a table: Spark's writer publishes it as it writes
                held()
            outputs.write(scored, main, invalid, overwrite=overwrite)
            written()
            if outputs.path is not None:
                held()
            for target in staging:  # one another job published since this one began
                if not overwrite and paths.exists(target):
                    raise JobError(f"output path {target!r} was written by another job "
                                   f"while this one scored; pass --overwrite to replace it")
            for target, folder in staging.items():
                if paths.exists(target):
                    paths.delete(target)
                paths.move(folder, target)
        except BaseException:
            for folder in staging.values():
                paths.delete(folder)
            raise


def run(args: argparse.Namespace) -> dict:
    """Score ``args.input`` into ``args.output`` in a session of the job's own (see
    :func:`score`), stopped at the end."""
    os.environ.setdefault(LOG_LEVEL_ENV, "2")  # TensorFlow's INFO and WARNING lines: off
    spark, paths = _open(args)
    try:
        return score(spark, paths, args)
    finally:
        spark.stop()


def score(spark: Any, paths: Paths, args: argparse.Namespace) -> dict:
    """Score ``args.input`` into ``args.output`` with ``spark`` (classic or Connect) and
    its path operations (:class:`HadoopPaths`, :class:`ArrowPaths`), ``args`` as
    :func:`spark_keras.jobs.score.parse_args` gives them (the job's Python entry point:
    options and paths are checked here too); with ``args.resume``, in commits
    (:func:`spark_keras.jobs.score.inflight.run_groups`).

    Returns:
        The summary, also written to ``--metrics-json``: rows, invalid rows, seconds,
        rows/s, and the model builds the query's tasks made and their seconds (the
        transform's ``observe`` figures, gathered by Spark from every executor); with
        ``--resume`` also rows and groups skipped (committed before), groups committed.

    Raises:
        JobError: a reason to stop, printed as one line (a bad path or option, a model
            that cannot be loaded, an output that cannot be resumed).
    """
    import spark_keras as sk
    from spark_keras import flavour
    from spark_keras.quiet import quiet_tensorflow_startup

    check_options(args)
    check_paths(paths, args)
    fmt = _format(args.input, args.format)
    df = _read(spark, paths, args.input, fmt)
    features = _features(args)
    check_columns(features, args.id_col, df.columns)
    outputs = Outputs.of(args, df.columns)
    if args.resume and GROUP_COL.lower() in (c.lower() for c in df.columns):
        raise JobError(f"--resume: the input has a column {GROUP_COL!r}, the name the job "
                       f"gives each group's index in a wave of groups (its files' folder): "
                       f"rename it in the input, or run without --resume")
    location = None if args.output_table is None else _table_location(spark, paths, args)
    table = None if args.output_table is None else outputs_.table_folder(spark, args.output_table)
    with path_errors():
        check_apart(paths, [("--input", args.input), ("--invalid-output", args.invalid_output),
                             (f"the folder of --output-table {args.output_table!r}", table)])
    plan = _plan(paths, args, df, args.output or location) \
        if args.resume else None
    try:  # a local path, or a URI the executors read from storage themselves
        with quiet_tensorflow_startup():  # start-up lines the log level hides
            flavour.current()  # imports Keras and TensorFlow
        imported = import_modules(args.imports)  # registered before the model loads
        ship_modules(spark, imported, is_connect(spark))
        if args.unsafe_deserialization:
            logger.warning("--unsafe-deserialization: the model's Lambda layers run their "
                           "Python code on the driver and every executor; use it only for "
                           "model files you trust")
        handle = sk.BroadcastModel(spark, args.model, resize=args.resize,
                                    version=args.model_version,
                                    custom_objects=registered_objects(imported) or None,
                                    safe_mode=not args.unsafe_deserialization)
    except WorkersPythonError as exc:  # not the model's fault: said as it is
        raise JobError(str(exc)) from exc
    except sk.SparkKerasError as exc:  # StorageError, PayloadError...
        raise JobError(f"cannot load model {args.model!r}: "
                       f"{explain_load_failure(str(exc)) or exc}") from exc
    try:  # the model takes padded rows, or this says why
        checked(handle, args.buckets, FLAGS)
    except ArgumentError as exc:
        raise JobError(str(exc)) from None

    try:
        return _score_with(handle, spark, paths, args, df, fmt, features, plan, outputs, table)
    finally:  # its payload and version server (the process may go on: the Python entry point)
        try:
            handle.destroy()
        except Exception as exc:  # must not hide the job's own error
            logger.debug("cannot destroy the job's BroadcastModel: %s", exc)


def _score_with(handle: Any, spark: Any, paths: Paths, args: argparse.Namespace, df: Any,
                fmt: str, features: list[str], plan: manifest.Plan | None,
                outputs: Outputs, table: str | None) -> dict:
    """:func:`score`'s scoring, once the model is loaded (``table``: the folder of the
    ``--output-table``, as it is or will be)."""
    from pyspark.sql import Observation

    names = iter(range(1 << 62))
    error_col, version_col = outputs.transform_cols()

    def transform(frame: Any, observed: bool = True, max_invalid: float | None = args.max_invalid,
                  observe_by: tuple[str, list] | None = None) -> tuple[Any, Any]:
        """The scored ``frame`` and its observation (each figure per value of
        ``observe_by``'s column, if given: a wave's groups)."""
        from spark_keras.spark.transform import transform as transform_df

        observation = Observation(f"spark_keras_score_{next(names)}") if observed else None
        handle.check_usable()
        return transform_df(handle, frame, features, args.output_col, batch_size=args.batch_size,
                            on_invalid=args.on_invalid, error_col=error_col,
                            observe=observation, max_invalid=max_invalid,
                            id_col=args.id_col, version_col=version_col,
                            buckets=args.buckets, observe_by=observe_by), observation

    def committed(summary: dict) -> None:
        if args.metrics_json is not None:
            _write_metrics(args.metrics_json, summary)

    whole = transform(df, observed=plan is None)  # with --resume: its schema only
    outputs.check_schema(whole[0])  # what the format cannot hold, before any write
    heartbeat = Heartbeat(spark, args.progress_seconds if args.progress else None)
    # one job at a time per folder (output, quarantine, a table's), resumable or not, from
    # before anything is removed: a run that replaced one would remove a --resume run's
    # commits, or nest its folder in another's
    with Leases(paths, [outputs.path, outputs.invalid_path, table]) as leases:
        if plan is not None:
            published = _table_made(spark, args, outputs, plan, whole[0])
            leases.add(plan.output)  # a table whose folder could not be told before
            with path_errors():
                summary = run_groups(
                    plan, leases, _group_reader(spark, paths, args, fmt, df.schema), transform,
                    outputs.write, paths.qualify, committed, heartbeat, Jobs(spark),
                    args.max_invalid, published)
        else:
            logger.info("scoring %r into %r", args.input, args.output or args.output_table)
            summary = _score_at_once(whole, paths, outputs, args.overwrite, heartbeat,
                                     leases.check, heartbeat.rows_of(df, fmt), args.max_invalid)
    logger.info("scored %d rows (%d invalid) in %.2fs (%.0f rows/s); %d model build(s) in "
                "%.2fs", summary["rows"], summary["invalid_rows"], summary["seconds"],
                summary["rows"] / max(summary["seconds"], 1e-9), summary["model_builds"],
                summary["build_seconds"])
    summary.update(outputs.rows_written(summary["rows"], summary["invalid_rows"]))
    committed(summary)
    return summary


def _table_made(spark: Any, args: argparse.Namespace, outputs: Outputs, plan: manifest.Plan,
                scored: Any) -> Any:
    """``--output-table`` with ``--resume``: the table made empty (an old one dropped:
    ``--overwrite``) unless this run resumes it, its location the plan's output; what
    refreshes it after each commit. Without a table, what does nothing."""
    name = args.output_table
    if name is None:
        return lambda: None
    if not plan.resume:
        if outputs_.table_exists(spark, name):  # --overwrite, or one holding no rows
            outputs_.drop_table(spark, name)
        plan.output = outputs_.create_table(spark, name, outputs, outputs.main(scored).schema)
    return functools.partial(outputs_.refresh_table, spark, name, bool(args.partition_by))


def _score_at_once(scored: tuple[Any, Any], paths: Paths, outputs: Outputs, overwrite: bool,
                   heartbeat: Heartbeat, held: Callable[[], None],
                   input_rows: int | None = None, max_invalid: float | None = None) -> dict:
    """Write the scored input as one output (:func:`_publish`, ``held`` checking this job
    still holds it), unless every row was invalid and ``max_invalid`` is None
    (:func:`~spark_keras.jobs.score.verdict.check_not_all_invalid`); the job's figures.
    ``input_rows``: the input's, for the progress lines' ETA."""
    frame, observation = scored
    started = time.perf_counter()

    def written() -> None:
        figures = observation.get
        check_not_all_invalid(int(figures["rows"]), int(figures["invalid_rows"]),
                              reasons_observed(figures["invalid_by_reason"]), max_invalid,
                              "the output is not published" if outputs.path is not None
                              else "the table holds them")

    with heartbeat.beating(scoring_line(started, input_rows)):
        _publish(frame, paths, outputs, overwrite, held, written)
    seconds = time.perf_counter() - started
    figures = observation.get
    rows = int(figures["rows"])
    return {"rows": rows, "invalid_rows": int(figures["invalid_rows"]),
            "invalid_by_reason": reasons_observed(figures["invalid_by_reason"]),
            "seconds": round(seconds, 3),
            "rows_per_second": round(rows / seconds, 1) if seconds else None,
            "model_builds": int(figures["model_builds"]),
            "build_seconds": round(float(figures["build_seconds"]), 3)}
