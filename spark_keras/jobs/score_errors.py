"""The score job's reasons to stop, and the one line it prints for a failed Spark job."""

from __future__ import annotations

import re

from spark_keras.errors import SparkKerasError

__all__ = ["JobError", "reason"]

_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_GRPC_DETAILS = re.compile(r'status = StatusCode\.(\w+)\s+details = "(.*)"')


class JobError(SparkKerasError):
    """A reason to stop the job (a bad path or option), printed as one line."""


def reason(exc: BaseException) -> str:
    """One line: our own error if a worker raised one, else the last error line (or a
    Connect client's gRPC status and details)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    found = [m for m in map(_ERROR_LINE.match, lines) if m]
    ours = [m for m in found if m.group(1).startswith("spark_keras.")]
    best = ours[0] if ours else found[-1] if found else None
    if best:
        return f"{best.group(1).rsplit('.', 1)[-1]}: {best.group(2)}"
    grpc = _GRPC_DETAILS.search(str(exc))
    if grpc:
        return f"{type(exc).__name__} {grpc[1]}: {grpc[2]}"
    return lines[0] if lines and lines[0] else type(exc).__name__
