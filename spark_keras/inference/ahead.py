"""Inputs made while the model computes: a call's rows of an input made on demand (such as
:class:`.images.ImageRows`, converted from the Arrow buffer when sliced) prepared in a
background thread while the model computes the previous call's rows.

TensorFlow releases the GIL while it computes, and numpy while it converts, so on a
host with a spare core (or with the model on a GPU) the conversion costs no time; on a
host whose cores the model keeps busy it costs what it would have cost anyway. Nothing
else changes: the rows of each call are the same, made by the same code, in the order the
model is called on them.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, its one thread)


def on_demand(arrays: Sequence[Any]) -> bool:
    """Whether any of ``arrays`` makes its rows when sliced (``rows_on_demand``)."""
    return any(getattr(a, "rows_on_demand", False) for a in arrays)


def _executor() -> ThreadPoolExecutor:
    """This process's one preparing thread (a forked child makes its own: the parent's
    thread is not in it)."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="spark_keras_ahead"))
        return _pool[1]


def rows(arrays: Sequence[Any], start: int, stop: int) -> list[np.ndarray]:
    """Rows ``start`` to ``stop`` of each of ``arrays``, as numpy arrays."""
    return [np.asarray(a[start:stop]) for a in arrays]


class Ahead:
    """The rows of the next call of ``arrays`` made in the background: :meth:`prepare`
    says which rows come next, :meth:`take` returns a call's rows (those prepared if they
    are the ones asked for, else made now)."""

    def __init__(self, arrays: Sequence[Any]) -> None:
        self.arrays = arrays
        self._next: tuple[int, int, Future[list[np.ndarray]]] | None = None

    def prepare(self, start: int, stop: int) -> None:
        if start < stop:
            self._next = (start, stop, _executor().submit(rows, self.arrays, start, stop))

    def take(self, start: int, stop: int) -> list[np.ndarray]:
        found, self._next = self._next, None
        if found is not None and found[:2] == (start, stop):
            return found[2].result()
        if found is not None:  # another call came first (a smaller one, after one ran out
            found[2].cancel()  # of memory): those rows are not needed now
        return rows(self.arrays, start, stop)
