"""Rows that make a call raise, found by splitting the call's rows.

A model call (or a user's preprocess function) that raises on one row of a batch (a
corrupt PNG its graph decodes, a failed ``tf.debugging.assert_*``, an index past a
positional embedding) fails the whole batch. :func:`isolate` retries the rows in parts:
a part that succeeds is kept, a part that fails is split again, down to single rows,
which are the failures. :func:`first_failure` does the same to name the first failing
row when the failure is to be raised.

A failed part is split in halves; when the first half succeeds, the second must hold the
failure: it is split without being called. When the first half fails, its second half is
set aside and called with every other piece set aside, in one call, once the failing rows
are found (``split`` cuts that call's result back into pieces): finding one bad row among
1,024 takes about 11 calls of halving sizes, and each call costs a fixed ~0.5-1.4 ms here,
which dominates. A clean call is never retried (nothing of this runs unless a call raised).
"""

from __future__ import annotations

import re
from typing import Callable, Generic, Sequence, TypeVar, cast

T = TypeVar("T")
Range = tuple[int, int]  # rows a to b
Ranges = Sequence[Range]
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


def isolate(call: Callable[[Ranges], T], start: int, stop: int,
            first: BaseException | None = None,
            split: Callable[[T, list[int]], list[T]] | None = None) -> Isolated[T]:
    """``call(ranges)`` (the rows of ``ranges``, ``(a, b)`` pairs, one after the other)
    for rows ``start`` to ``stop``, rows that make it raise left out. ``first``: the
    exception ``call([(start, stop)])`` already raised (it is not called again).

    Without ``split``, ``call`` gets one range at a time. With it (``split(result,
    sizes)``: a call's result cut into the results of consecutive rows of those sizes),
    the pieces set aside while searching are called together (see the module's text)."""
    found: Isolated[T] = Isolated()
    pending: list[Range] | None = [] if split is not None else None
    _search(call, [(start, stop)], first, found, pending, split)
    while pending:
        ranges = _merged(pending)
        pending.clear()
        _search(call, ranges, None, found, pending, split)
    found.parts.sort(key=lambda part: part[0])
    return found


def _search(call: Callable[[Ranges], T], ranges: Ranges, failed: BaseException | None,
            found: Isolated[T], pending: list[Range] | None,
            split: Callable[[T, list[int]], list[T]] | None) -> bool:
    """The rows of ``ranges`` into ``found`` (``failed``: what calling them all raised,
    or None to call them); True when some rows failed."""
    if failed is None:
        try:
            result = call(ranges)
        except Exception as exc:  # any exception a row can cause
            failed = exc
        else:
            results = [result] if len(ranges) == 1 else \
                cast("Callable[[T, list[int]], list[T]]", split)(result, [b - a for a, b in ranges])
            found.parts.extend((a, b, r) for (a, b), r in zip(ranges, results))
            return False
    if _count(ranges) == 1:
        found.failures[ranges[0][0]] = failed
        return True
    head, tail = _halves(ranges)
    if not _search(call, head, None, found, pending, split):
        # the failure is in the tail: split it without calling it (a single row is
        # called, for its own exception)
        _search(call, tail, failed if _count(tail) > 1 else None, found, pending, split)
    elif pending is not None:
        pending.extend(tail)  # called with the other pieces set aside, in one call
    else:
        _search(call, tail, None, found, pending, split)
    return True


def _count(ranges: Ranges) -> int:
    return sum(b - a for a, b in ranges)


def _halves(ranges: Ranges) -> tuple[Ranges, Ranges]:
    """``ranges`` cut in two of (about) half their rows each."""
    half = _count(ranges) // 2
    head: list[Range] = []
    for i, (a, b) in enumerate(ranges):
        if b - a >= half:
            if half:
                head.append((a, a + half))
            tail = ([(a + half, b)] if b > a + half else []) + list(ranges[i + 1:])
            return head, tail
        head.append((a, b))
        half -= b - a
    return head, []


def _merged(ranges: list[Range]) -> list[Range]:
    """``ranges`` in row order, touching ones joined."""
    out: list[Range] = []
    for a, b in sorted(ranges):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def first_failure(call: Callable[[Ranges], object], start: int, stop: int,
                  failed: BaseException) -> tuple[int, BaseException] | None:
    """The first row of ``start`` to ``stop`` on which ``call`` raises alone (with its
    exception), ``failed`` being what the whole range raised; None when no single part
    fails (the failure needs several rows together)."""
    if stop - start == 1:
        return start, failed
    middle = start + (stop - start) // 2
    for a, b in ((start, middle), (middle, stop)):
        try:
            call([(a, b)])
        except Exception as exc:
            return first_failure(call, a, b, exc)
    return None


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
