"""The score job's reasons to stop, and the one line (and exit status) it prints for a
failure."""

from __future__ import annotations

import re

from spark_keras.errors import SparkKerasError

__all__ = ["JobError", "reason", "outcome"]

_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_GRPC_DETAILS = re.compile(r'status = StatusCode\.(\w+)\s+details = "(.*)"')
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")

USAGE, INTERNAL = 2, 1  # exit statuses: an input, usage or set-up error; anything else


class JobError(SparkKerasError):
    """A reason to stop the job (a bad path or option), printed as one line."""


def _error_lines(exc: BaseException) -> list[re.Match]:
    """The ``SomeError: message`` lines of ``exc``'s text (a worker's traceback included)."""
    # a Py4J error puts the Java exception on a line of its own after ": "
    lines = (line.strip().removeprefix(": ") for line in str(exc).splitlines())
    return [m for m in map(_ERROR_LINE.match, lines) if m]


def _ours(found: list[re.Match]) -> re.Match | None:
    """The first of ``found`` that is a ``spark_keras.errors...`` error, if any."""
    return next((m for m in found if m.group(1).startswith("spark_keras.")), None)


def reason(exc: BaseException) -> str:
    """One line: our own error if a worker raised one, else the last error line (or a
    Connect client's gRPC status and details)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    found = _error_lines(exc)
    best = _ours(found) or (found[-1] if found else None)
    if best:
        return f"{best.group(1).rsplit('.', 1)[-1]}: {best.group(2)}"
    grpc = _GRPC_DETAILS.search(str(exc))
    if grpc:
        return f"{type(exc).__name__} {grpc[1]}: {grpc[2]}"
    return lines[0] if lines and lines[0] else type(exc).__name__


def outcome(exc: BaseException) -> tuple[str, int]:
    """The line to print for ``exc`` and the exit status: :data:`USAGE` for what the
    user can mend (a spark_keras error, on the driver or raised on purpose in a worker:
    bad input, options, paths, model; executors whose Python cannot import the package or
    a module of the user's, a custom layer's: ``--import``),
    :data:`INTERNAL` for anything else."""
    if isinstance(exc, SparkKerasError):
        return str(exc), USAGE
    if _ours(_error_lines(exc)) is not None:
        return reason(exc), USAGE
    missing = _NO_MODULE.search(str(exc))
    if missing and missing[1].split(".")[0] in ("spark_keras", "numpy", "pyarrow", "pandas",
                                                "keras", "tensorflow"):
        return (f"the executors' Python cannot import {missing[1]!r}: give them one that has "
                f"spark-keras installed (--conf spark.pyspark.python=/path/to/bin/python, "
                f"or PYSPARK_PYTHON)"), USAGE
    if missing:  # the user's own module (a custom layer's), imported on the driver only
        return (f"the executors' Python cannot import {missing[1]!r}: ship a local module to "
                f"them with --import PATH/TO/{missing[1].split('.')[0]}.py (or its package "
                f"folder), or install it there"), USAGE
    return reason(exc), INTERNAL
