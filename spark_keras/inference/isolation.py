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
which dominates. If that call raises too, each piece is searched on its own (plain
halving), never set aside again. A clean call is never retried (nothing of this runs
unless a call raised).

The search is bounded: it feeds the call at most :data:`SEARCH_BATCHES` times the rows it
searches (halving a batch whose every row raises alone needs about log2(rows) + 1 times,
and so does a failure that depends on the batch's size or composition, where every call
of several rows raises). At the bound it stops: the rows it has settled keep their
results or failures, every other row is a failure of :class:`SearchStopped` (not tried
alone, which may be fine: never blamed with another row's exception).
"""

from __future__ import annotations

import re
from typing import Callable, Generic, Sequence, TypeVar, cast

from spark_keras.errors import SparkKerasError

T = TypeVar("T")
Range = tuple[int, int]  # rows a to b
Ranges = Sequence[Range]
# the longest reason text kept for a row (the exception's first line)
REASON_CHARS = 200
# the search's bound: it feeds the call at most this many times the rows it searches
SEARCH_BATCHES = 8

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
    the pieces set aside while searching are called together (see the module's text).
    Past the bound (:data:`SEARCH_BATCHES`) nothing more is called: the rows not settled
    then are failures of :class:`SearchStopped`."""
    search: _Search[T] = _Search(call, split, stop - start, first)
    pending: list[Range] | None = [] if split is not None else None
    search.run([(start, stop)], first, pending)
    if pending:
        pieces = sorted(pending)
        failed = search.tried(_merged(pieces))
        if failed is not None:
            # together they raise: each piece searched on its own (plain halving; set
            # aside again, pieces that keep failing together would be fed over and over)
            for piece in pieces:
                search.run([piece], failed if len(pieces) == 1 else None, None)
    found = search.found
    stopped = search.stopped_error()
    for a, b in search.stopped:
        found.failures.update(dict.fromkeys(range(a, b), stopped))
    found.parts.sort(key=lambda part: part[0])
    return found


class SearchStopped(SparkKerasError):
    """Why a row is left out that the search did not try alone: it stopped at its bound
    (see :func:`isolate`). The row may be fine."""


class _Search(Generic[T]):
    """One :func:`isolate`: what it found so far, and the rows it fed against its bound."""

    def __init__(self, call: Callable[[Ranges], T],
                 split: Callable[[T, list[int]], list[T]] | None, rows: int,
                 first: BaseException | None) -> None:
        self.call, self.split, self.rows, self.first = call, split, rows, first
        self.found: Isolated[T] = Isolated()
        self.fed = 0  # rows fed to ``call`` so far
        self.stopped: list[Range] = []  # rows left unsettled at the bound

    def tried(self, ranges: Ranges) -> BaseException | None:
        """What calling the rows of ``ranges`` once raised, or None (their results then
        in ``found``). Past the bound they are not called but put in ``stopped``."""
        size = _count(ranges)
        if self.stopped or self.fed + size > SEARCH_BATCHES * self.rows:
            self.stopped.extend(ranges)
            return None
        self.fed += size
        try:
            result = self.call(ranges)
        except Exception as exc:  # any exception a row can cause
            if self.first is None:
                self.first = exc
            return exc
        results = [result] if len(ranges) == 1 else \
            cast("Callable[[T, list[int]], list[T]]", self.split)(result, [b - a for a, b in ranges])
        self.found.parts.extend((a, b, r) for (a, b), r in zip(ranges, results))
        return None

    def run(self, ranges: Ranges, failed: BaseException | None,
            pending: list[Range] | None) -> bool:
        """The rows of ``ranges`` into ``found`` (``failed``: what calling them all raised,
        or None to call them); True when some rows failed or were left unsettled."""
        if failed is None:
            failed = self.tried(ranges)
            if failed is None:
                return bool(self.stopped)
        if _count(ranges) == 1:
            self.found.failures[ranges[0][0]] = failed
            return True
        head, tail = _halves(ranges)
        if not self.run(head, None, pending):
            # the failure is in the tail: split it without calling it (a single row is
            # called, for its own exception)
            self.run(tail, failed if _count(tail) > 1 else None, pending)
        elif pending is not None:
            pending.extend(tail)  # called with the other pieces set aside, in one call
        else:
            self.run(tail, None, pending)
        return True

    def stopped_error(self) -> SearchStopped:
        """The failure of every row left unsettled."""
        first = f"; the batch raised {reason_text(self.first)}" if self.first is not None else ""
        return SearchStopped(f"not tried alone: the search for the rows that raise stopped at "
                             f"its bound ({SEARCH_BATCHES} times the {self.rows} rows){first}")


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


def reason_class(stage: str, exc: BaseException) -> str:
    """The class of :func:`reason` (``"model: InvalidArgumentError"``): its text before the
    message."""
    return f"{stage}: {type(exc).__name__}"


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
