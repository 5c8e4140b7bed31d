"""Rows that make a call raise, found by splitting the call's rows.

A model call (or a user's preprocess function) that raises on one row of a batch (a
corrupt PNG its graph decodes, a failed ``tf.debugging.assert_*``, an index past a
positional embedding) fails the whole batch. :func:`isolate` retries the rows in parts:
a part that succeeds is kept, a part that fails is split again, down to single rows,
which are the failures. :func:`first_failure` does the same to name the first failing
row when the failure is to be raised.

A failed part is split in :data:`FANOUT` pieces; when all but the last succeed, the last
is split without being called (it must hold the failure), so finding one bad row among
1,024 takes about 11 calls of halving sizes: each call costs a fixed ~1.4 ms here, which
dominates. A clean call is never retried (nothing of this runs unless a call raised).
"""

from __future__ import annotations

import re
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

FANOUT = 2
# the longest reason text kept for a row (the exception's first line)
REASON_CHARS = 200

_TF_MARKUP = re.compile(r"\s*\[\[\{\{.*$|\s*\[Op:[^\]]*\]|\{\{function_node [^}]*\}\}\s*|\x1b\[[0-9;]*m")
# header lines TensorFlow and Keras put before the message itself
_HEADERS = ("Graph execution error:", "Detected at node", "Exception encountered when calling")


class RowFailure(Exception):
    """A call raised on ``row`` (numbered in the rows the caller handed over) with
    ``cause``: what the caller turns into an error naming its column and row."""

    def __init__(self, row: int, cause: BaseException) -> None:
        super().__init__(row, cause)
        self.row, self.cause = row, cause


class Isolated(Generic[T]):
    """What :func:`isolate` found: ``parts``, the results of the calls that succeeded as
    ``(start, stop, result)`` in row order, covering every row but the ``failures``
    (row -> the exception it raised alone)."""

    def __init__(self) -> None:
        self.parts: list[tuple[int, int, T]] = []
        self.failures: dict[int, BaseException] = {}


def isolate(call: Callable[[int, int], T], start: int, stop: int,
            first: BaseException | None = None) -> Isolated[T]:
    """``call(a, b)`` (the rows ``a`` to ``b``) for rows ``start`` to ``stop``, rows
    that make it raise left out. ``first``: the exception ``call(start, stop)`` already
    raised (it is not called again for that range)."""
    found: Isolated[T] = Isolated()
    _search(call, start, stop, first, found)
    return found


def _search(call: Callable[[int, int], T], start: int, stop: int,
            failed: BaseException | None, found: Isolated[T]) -> bool:
    """Rows ``start`` to ``stop`` into ``found`` (``failed``: what calling them all
    raised, or None to call them); True when some rows failed. When every piece of a
    failed range but the last succeeded, the last must hold the failure: it is split
    without being called (its rows are called in its pieces)."""
    if failed is None:
        try:
            found.parts.append((start, stop, call(start, stop)))
            return False
        except Exception as exc:  # any exception a row can cause
            failed = exc
    if stop - start == 1:
        found.failures[start] = failed
        return True
    pieces = _pieces(start, stop)
    any_failed = False
    for i, (a, b) in enumerate(pieces):
        presumed = i == len(pieces) - 1 and not any_failed and b - a > 1
        any_failed |= _search(call, a, b, failed if presumed else None, found)
    return True


def first_failure(call: Callable[[int, int], object], start: int, stop: int,
                  failed: BaseException) -> tuple[int, BaseException] | None:
    """The first row of ``start`` to ``stop`` on which ``call`` raises alone (with its
    exception), ``failed`` being what the whole range raised; None when no single part
    fails (the failure needs several rows together)."""
    if stop - start == 1:
        return start, failed
    for a, b in _pieces(start, stop):
        try:
            call(a, b)
        except Exception as exc:
            return first_failure(call, a, b, exc)
    return None


def _pieces(start: int, stop: int) -> list[tuple[int, int]]:
    n = stop - start
    k = min(FANOUT, n)
    bounds = [start + (n * i) // k for i in range(k + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def reason(stage: str, exc: BaseException) -> str:
    """``"<stage>: <ExceptionType>: <first line of its message>"``, TensorFlow's graph
    trace and node markup left out, trimmed to :data:`REASON_CHARS`."""
    out = f"{stage}: {reason_text(exc)}"
    return out if len(out) <= REASON_CHARS else out[:REASON_CHARS - 3] + "..."


def columns_text(names: list) -> str:
    """``column 'a'`` or ``columns 'a', 'b'``, for error messages."""
    quoted = ", ".join(repr(str(n)) for n in names)
    return f"column {quoted}" if len(names) == 1 else f"columns {quoted}"


def reason_text(exc: BaseException) -> str:
    """``"<ExceptionType>: <first line of its message>"`` (see :func:`reason`), untrimmed."""
    text = getattr(exc, "message", None)
    line = _first_line(text if isinstance(text, str) else str(exc))
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _first_line(text: str) -> str:
    """The message's own first line: TensorFlow's ``Graph execution error:`` and
    ``Detected at node ... defined at`` headers, Keras's ``Exception encountered when
    calling`` and the indented trace under them skipped, ``[[{{node ...}}]]``,
    ``[Op:...]`` and terminal colour markup removed."""
    for raw in text.splitlines():
        if not raw.strip() or raw[:1] in (" ", "\t"):
            continue
        line = _TF_MARKUP.sub("", raw).strip()
        if not line or line.startswith(_HEADERS):
            continue
        return line
    return ""
