"""The ``spark-keras`` command (also ``python -m spark_keras``).

    spark-keras score --model m.keras --input in.parquet --output out --features f
    spark-keras job-file score      # the job's .py file, for spark-submit

``score`` takes the options of :mod:`spark_keras.jobs.score` (``spark-keras score --help``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .jobs import JOBS, job_file

PROG = "spark-keras"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Run the jobs spark_keras installs.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_line in JOBS.items():  # the job parses its own options
        commands.add_parser(name, help=help_line, add_help=False)
    where = commands.add_parser("job-file", help="print a job's .py file (for spark-submit)")
    where.add_argument("job", choices=sorted(JOBS))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``spark-keras`` with ``argv`` (default ``sys.argv[1:]``); the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in JOBS:
        job = importlib.import_module(f"{__package__}.jobs.{argv[0]}")
        return int(job.main(argv[1:], prog=f"{PROG} {argv[0]}"))
    args = _parser().parse_args(argv)  # --help, --version, job-file; exits on a bad command
    print(job_file(args.job))
    return 0
