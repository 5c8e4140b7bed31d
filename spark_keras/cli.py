"""The ``spark-keras`` command (also ``python -m spark_keras``).

    spark-keras score --model m.keras --input in.parquet --output out --features f
    spark-keras job-file score      # the job's .py file, for spark-submit
    spark-keras conf                # the recommended Spark settings (spark-defaults.conf)

``score`` takes the options of :mod:`spark_keras.jobs.score` (``spark-keras score --help``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from spark_keras import __version__
from spark_keras.jobs import JOBS, job_file

PROG = "spark-keras"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Run the jobs spark_keras installs.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_line in JOBS.items():  # the job parses its own options
        commands.add_parser(name, help=help_line, add_help=False)
    where = commands.add_parser("job-file", help="print a job's .py file (for spark-submit)")
    where.add_argument("job", choices=sorted(JOBS))
    commands.add_parser("conf", help="print the recommended Spark settings (a "
                                     "spark-defaults.conf for --properties-file)")
    return p


def recommended_conf() -> str:
    """The recommended Spark settings shipped with the package, as a properties file."""
    from importlib import resources

    return resources.files(__package__).joinpath("spark-defaults.conf").read_text("utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run ``spark-keras`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in JOBS:
        job = importlib.import_module(f"{__package__}.jobs.{argv[0]}")
        return int(job.main(argv[1:], prog=f"{PROG} {argv[0]}"))
    args = _parser().parse_args(argv)  # --help, --version, job-file; exits on a bad command
    if args.command == "conf":
        sys.stdout.write(recommended_conf())
        return 0
    print(job_file(args.job))
    return 0
