"""Score a parquet or CSV dataset with a Keras model on Spark (classic or Spark Connect).

    spark-keras score --model model.keras --input data.parquet --output scored.parquet \\
        --features features [--batch-size 1024] [--buckets N|B1,B2,...] [--master local[*]] \\
        [--output-table NAME instead of --output] [--output-format parquet|orc|json|csv]
        [--partition-by COL[,COL]] [--overwrite]
        [--on-invalid error|null [--error-col error] [--max-invalid N|F]
         [--invalid-output PATH [--drop-invalid]]] [--id-col id]
        [--version-col model_version [--model-version LABEL]]
        [--resume [--commit-bytes BYTES]] [--progress|--no-progress [--progress-seconds S]]
        [--metrics-json metrics.json] [--conf key=value ...] [--properties-file F] [--verbose]
        [--import MODULE|FILE.py|PACKAGE_FOLDER ...] [--unsafe-deserialization]

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
temporary folder and renamed into place only when complete: nothing partial is left behind.
``--output-format`` (parquet, orc, json, csv; CSV holds scalar columns only) and
``--partition-by`` are given to Spark's writer; ``--output-table NAME`` saves a catalog
table instead (``saveAsTable``; with ``--resume`` the table is made empty first and the
commits land in its location, see :mod:`spark_keras.jobs.score.outputs`).

A model with custom layers or functions (registered with
``@keras.saving.register_keras_serializable``) needs the modules defining them:
``--import MODULE`` (repeatable) imports each on the driver before the model is loaded; a
local ``.py`` file or package folder is also shipped to the executors as ``--py-files``
does (:mod:`spark_keras.jobs.score.imports`), a module name must be importable there. A
``Lambda`` layer holds Python code that Keras's safe mode refuses to rebuild: the job
refuses such a model unless ``--unsafe-deserialization`` (warned about, recorded by
``--resume``). The job's answers that need no Spark (options, paths, a file that is no
model, columns the input lacks, a ``--resume`` refused) come before Spark starts
(:mod:`spark_keras.jobs.score.early`).

``--invalid-output PATH`` (with ``--on-invalid null``) writes every invalid row to a
dataset of its own, in the output's format: the input's columns as read, the reason
(``--error-col``'s name, else ``reason``) and the model version's label
(``--version-col``'s name, else ``model_version``); the output keeps them as rows with a
null prediction, or leaves them out with ``--drop-invalid``. The scored rows are held
(``persist``) between the two writes: the model scores each row once.

``--resume`` writes the output in commits instead, groups of input files of at most
``--commit-bytes`` each, recorded in ``<output>/_spark_keras/``: the same command run
again after the job died (a kill, a lost driver, a failed group) scores only the groups
not committed, and refuses (exit 2, one line naming what changed) another model, other
options or changed input files; ``--overwrite`` starts over. Readers of the output see
the committed groups, each row once. See :mod:`spark_keras.jobs.score.commits`.

Python workers fork from ``spark_keras.executor.daemon`` (TensorFlow and Keras imported once
per executor) unless ``spark.python.daemon.module`` is set: ``pyspark.daemon`` turns it off.

Spark Connect (``--remote URL``, default ``$SPARK_REMOTE``; not with ``--master``): there
is no JVM on the client, so path checks and the final rename use ``pyarrow.fs`` here.
Plain paths are local to the client and given to Spark as absolute ``file://`` URIs (the
server must see the same files: a ``local[...]`` remote, or a shared mount); URIs must be
ones pyarrow can open on the client, and the output's filesystem must be able to rename a
directory (local, HDFS: not S3 or GCS), else the job stops with a one-line error first.
Connect ignores ``spark.executorEnv.*``: a ``local[...]`` remote starts a server in this
process whose Python workers inherit its environment, so the job sets
``TF_USE_LEGACY_KERAS`` before starting it.

The ``SCORED`` line (and ``--metrics-json``) gives rows, invalid rows, ``seconds`` (the
scoring query: reading, scoring and writing), rows/s over it, and the model builds the
query's tasks made and their seconds: the transform's ``observe`` figures, which Spark
gathers from every executor (classic or Connect, one host or many); the line's
``wall_seconds`` is the whole job's, Spark's start-up included. ``--metrics-json`` also
has ``invalid_by_reason``: the invalid rows by class of reason (``{"input: NaN": 3,
"model: InvalidArgumentError": 1}``), the transform's ``observe`` figure of that name.
With ``--invalid-output`` the line also gives ``rows_written`` (the output's rows: less
the invalid ones with ``--drop-invalid``) and ``rows_quarantined``. Every row invalid is
an error (exit 2, naming the reasons; nothing published, or with ``--resume`` no
``_SUCCESS``) unless ``--max-invalid`` lets them pass (then a warning).

``--progress`` logs a line on stderr when the job starts, one every ``--progress-seconds``
(10) while Spark scores (the rows scored, of the input's for parquet, rows/s and the
running stages' tasks: ``scoring: 1.2M of 4.0M rows, 17.1k rows/s, 12 of 40 tasks,
00:01:10 elapsed, ETA 00:03:24``; rows are counted on classic Spark, as executors'
heartbeats report them; with ``--resume`` the groups, rows and invalid rows committed too),
one after each commit and one when it is done; it is on by default when stderr is a
terminal (``--no-progress`` turns it off). With ``--resume`` and ``--metrics-json`` the
file is rewritten after each commit (``groups_total``, ``eta_seconds``, ``done``: false
until the last).

The job is quiet: the JVM it starts writes its start-up lines, log lines and progress
bars to a log file (removed after a success, named in the error line of a failure), and
Spark's log level is FATAL, unless ``--verbose`` (all of it on stderr; under spark-submit
the JVM is spark-submit's own, which prints its start-up lines first). A failure is one
line on stderr, exit status 2 for what the user
can mend (an option, path, master, model or row the model cannot take, executors whose
Python lacks spark_keras), 1 for anything else. ``--conf key=value`` (repeatable) and
``--properties-file`` set Spark settings (they win over spark-submit's); the executors run
this job's Python unless ``spark.pyspark.python`` or ``PYSPARK_PYTHON`` says otherwise.

This module is the command line; running is :mod:`spark_keras.jobs.score.run`, the
session :mod:`spark_keras.jobs.score.session`, the paths :mod:`spark_keras.spark.paths`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from spark_keras.inference.options import RESIZE
from spark_keras.jobs.score.errors import outcome
from spark_keras.jobs.score.outputs import OUTPUT_FORMATS
from spark_keras.jobs.score.run import run
from spark_keras.jobs.score.session import forget_jvm_log, jvm_log

PROG = "score.py"  # this file's name: what spark-submit runs and what errors start with


def _buckets(text: str) -> int | tuple[int, ...]:
    """``--buckets``: ``N`` (a count of lengths) or ``B1,B2,...`` (the lengths)."""
    if "," not in text:
        return int(text)
    return tuple(int(part) for part in text.split(",") if part.strip())


def _size(text: str) -> int:
    """``--commit-bytes``: a count of bytes, or with a K/M/G/T suffix (powers of 1024)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    number, unit = (text[:-1], units[text[-1].upper()]) if text[-1:].upper() in units \
        else (text, 1)
    value = int(float(number) * unit)
    if value < 1:
        raise ValueError(text)
    return value


def _columns(text: str) -> list[str]:
    """``--partition-by``: comma-separated column names."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ValueError(text)
    return names


def _seconds(text: str) -> float:
    """``--progress-seconds``: a number of seconds above 0."""
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """The job's options (``--help`` lists them)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True,
                   help=".keras file or spark_keras payload: a path or a URI (s3://, hdfs://...)")
    p.add_argument("--input", required=True, help="parquet or CSV file/folder")
    p.add_argument("--output", default=None,
                   help="folder to write (in --output-format); or give --output-table")
    p.add_argument("--output-table", default=None, metavar="NAME",
                   help="a catalog table to save the output as (Spark's saveAsTable), "
                        "instead of --output")
    p.add_argument("--output-format", choices=list(OUTPUT_FORMATS), default="parquet",
                   help="the output's format (default: parquet; csv takes scalar columns "
                        "only)")
    p.add_argument("--partition-by", type=_columns, default=None, metavar="COL[,COL]",
                   help="input column(s) to partition the output by (COL=value folders)")
    p.add_argument("--features", required=True, help="comma-separated input column(s)")
    p.add_argument("--output-col", default="prediction",
                   help="the prediction's column (a struct for a multi-output model); "
                        "default: prediction")
    p.add_argument("--batch-size", type=int, default=1024,
                   help="rows per model call (default: 1024; calls of large rows are also "
                        "bounded in bytes)")
    p.add_argument("--buckets", type=_buckets, default=None, metavar="N|B1,B2,...",
                   help="for a model that masks its variable-length inputs: pad each batch's "
                        "rows into at most N lengths, or to the lengths B1,B2,... (a single "
                        "one as B1,), one model call per bucket (default: rows grouped by "
                        "exact length)")
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
    p.add_argument("--resize", choices=list(RESIZE), default=None,
                   help="resize image rows of another size to the model's input, as "
                        "keras.utils.load_img(interpolation=...) does (default: such rows "
                        "are invalid)")
    p.add_argument("--id-col", default=None, metavar="COLUMN",
                   help="a column naming each row (a record id) in errors and --error-col "
                        "reasons: 'row id=17' instead of 'row 10 of this batch'")
    p.add_argument("--version-col", default=None, metavar="COLUMN",
                   help="a string column with the label of the model version that scored "
                        "each row (--model-version)")
    p.add_argument("--model-version", default=None, metavar="LABEL",
                   help="the model's version label, what --version-col says (default: 1)")
    p.add_argument("--invalid-output", default=None, metavar="PATH",
                   help="with --on-invalid null: write every invalid row (the input's "
                        "columns, its reason and the model version) to this folder, in "
                        "--output-format")
    p.add_argument("--drop-invalid", action="store_true",
                   help="with --invalid-output: leave the invalid rows out of the output "
                        "(default: kept there with a null prediction)")
    p.add_argument("--max-invalid", type=float, default=None, metavar="N|F",
                   help="with --on-invalid null: the most invalid rows the job may give, a "
                        "count (>= 1) or a fraction (< 1) of its rows, over every task of each "
                        "Spark job it runs (with --resume: over the job's commits, and those "
                        "of the runs it resumes); beyond it the job fails")
    p.add_argument("--resume", action="store_true",
                   help="write the output in commits (groups of input files) recorded in "
                        "OUTPUT/_spark_keras, and continue an output such a run left: score "
                        "only the groups not committed (another model, other options or "
                        "changed input files are refused: --overwrite starts over)")
    p.add_argument("--commit-bytes", type=_size, default=None, metavar="BYTES",
                   help="with --resume: the most input bytes in one commit, e.g. 512M "
                        "(default: the input over 10x the groups in flight, the task slots "
                        "+ 2: a kill loses about a tenth; or what the output was begun with; "
                        "a larger file is a commit of its own)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="log how far the job is on stderr: a line every --progress-seconds "
                        "(rows scored, rows/s, tasks done of the running stages, ETA) and "
                        "after each commit "
                        "(groups, rows and invalid rows committed, rows/s, ETA) (default: on "
                        "when stderr is a terminal)")
    p.add_argument("--progress-seconds", type=_seconds, default=10.0, metavar="S",
                   help="with --progress: seconds between two lines (default: 10)")
    p.add_argument("--metrics-json", default=None, metavar="PATH",
                   help="write the summary (rows, invalid_rows, invalid_by_reason, seconds, "
                        "rows_per_second, model_builds, build_seconds; with --resume also "
                        "rows_skipped, groups, groups_skipped, after each commit) as JSON to "
                        "this local file")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   metavar="MODULE",
                   help="a module defining the model's custom layers or functions (registered "
                        "with @keras.saving.register_keras_serializable), imported on the "
                        "driver and the executors before the model is built: a module name, "
                        "or a local .py file or package folder, then shipped to the executors "
                        "as spark-submit's py-files are (repeatable)")
    p.add_argument("--unsafe-deserialization", action="store_true",
                   help="rebuild a model whose Lambda layers hold Python code (Keras's "
                        "safe_mode=False): that code runs on the driver and every executor; "
                        "only for model files you trust")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting (repeatable); wins over --properties-file and "
                        "spark-submit's")
    p.add_argument("--properties-file", default=None, metavar="PATH",
                   help="Spark settings, one 'key value' per line (as spark-submit's)")
    p.add_argument("--verbose", action="store_true",
                   help="Spark's start-up and log lines, progress bars and the Python "
                        "traceback of a failure, on stderr (default: in a log file named "
                        "only if the job fails)")
    args = p.parse_args(argv)
    if args.commit_bytes is not None and not args.resume:
        p.error("--commit-bytes needs --resume")
    if (args.output is None) == (args.output_table is None):
        p.error("give one of --output PATH and --output-table NAME")
    return args


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the job with command-line ``argv`` (default ``sys.argv[1:]``); the exit status:
    0 done (one ``SCORED ...`` line on stdout), 2 an input, usage or set-up error (a bad
    path, option, master, model or row; executors without spark_keras), 1 an internal
    failure; a failure is one ``<prog>: error:`` line (``--verbose``: and its traceback)."""
    started = time.perf_counter()
    args = parse_args(argv, prog)
    # spark_keras's progress lines; other libraries' (py4j...) only from WARNING up
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("spark_keras").setLevel(logging.INFO if args.verbose else logging.WARNING)
    if args.progress is None:  # lines for a person watching, not for a log file
        args.progress = sys.stderr.isatty()
    if args.progress:  # the job's own lines (start, progress, end), not the package's
        logging.getLogger("spark_keras.jobs.score").setLevel(logging.INFO)
    try:
        summary = run(args)
    except Exception as exc:
        if args.verbose:
            logging.getLogger("spark_keras.jobs.score").exception("the job failed")
        line, status = outcome(exc)
        log = jvm_log()
        print(f"{prog}: error: {line}" + (f" (Spark's own output: {log})" if log else ""),
              file=sys.stderr)
        return status
    forget_jvm_log()
    print(scored_line(summary, time.perf_counter() - started))
    return 0


def scored_line(summary: dict, wall_seconds: float) -> str:
    """The ``SCORED`` line of a job's ``summary``: with a quarantine also the rows written
    and quarantined; with ``--resume`` the rows and groups skipped and groups committed."""
    more = "".join(f" {key}={summary[key]}" for key in ("rows_written", "rows_quarantined",
                                                        "rows_skipped", "groups",
                                                        "groups_skipped") if key in summary)
    return (f"SCORED rows={summary['rows']} invalid_rows={summary['invalid_rows']} "
            f"seconds={summary['seconds']} rows_per_second={summary['rows_per_second']} "
            f"model_builds={summary['model_builds']} build_seconds={summary['build_seconds']} "
            f"wall_seconds={wall_seconds:.3f}{more}")


if __name__ == "__main__":
    # Run as a file (spark-submit, `spark-keras job-file score`): Python put this folder,
    # the job's own modules (session, run, errors...), first on sys.path, where they would
    # hide a user's --import of the same name. The job imports its modules by full name.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    sys.exit(main())
