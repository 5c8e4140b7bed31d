"""Model calls that run out of memory: made again in smaller calls, the size that worked
kept for the process's life.

A call that raises ``tf.errors.ResourceExhaustedError`` (the usual GPU failure) or
``MemoryError`` (the host, in the model or while making the call's image rows) was too
large, not fed a bad row. The predictor (:meth:`.predictor.Predictor._batched`) sets its
rows aside and makes one more call of as many rows (the next ones): if it runs out too,
or there is none, the rows are called again in calls of half as many, and so on; the
first call that works fixes the size, kept per shape of the rows' inputs
(:class:`CallSizes`, one per predictor: one per model and process). Later batches start
at that size, so the failed calls are paid once per process and shape, not once per
batch. Each size kept is logged once (WARNING, logger ``spark_keras``), reported by
``cache_info()["call_rows_by_key"]`` and, with ``SPARK_KERAS_BUILD_LOG``, written to the
build log's folder (:func:`spark_keras.cache.note_call_rows`).

A call that runs out of memory beside one that does not (that works, or raises otherwise:
each is searched), or once a size is kept, depends on its rows: it is searched like any
failure (:mod:`.isolation`), so only a row that runs out of memory alone is blamed (one
such row does not shrink the size kept: the second call tells it apart). If that search
scores every row in its smaller calls, memory shrank: the largest of them is kept
instead.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Sequence

import numpy as np

from spark_keras.cache import note_call_rows
from spark_keras.inference.isolation import reason_text

logger = logging.getLogger("spark_keras")

ShapeKey = tuple[tuple[int, ...], ...]  # each input's shape past the batch axis

# exception class names that mean out of memory: TensorFlow's, PyTorch's
_OUT_OF_MEMORY = ("ResourceExhaustedError", "OutOfMemoryError")


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says a call ran out of memory (never a row's fault alone)."""
    if isinstance(exc, MemoryError):
        return True
    if any(cls.__name__ in _OUT_OF_MEMORY for cls in type(exc).__mro__):
        return True
    return str(exc).startswith("RESOURCE_EXHAUSTED")  # JAX/XLA's runtime error


def shape_key(arrays: Sequence[np.ndarray]) -> ShapeKey:
    """The shape of one row of each input: what a call's memory grows with, per row."""
    return tuple(tuple(int(d) for d in a.shape[1:]) for a in arrays)


def shape_text(key: ShapeKey) -> str:
    """``(224, 224, 3)``, or ``(4,), (3, 2)`` for several inputs."""
    return ", ".join(str(shape) for shape in key)


class CallSizes:
    """The most rows per call a model takes, per shape of its inputs' rows, learnt from
    calls that ran out of memory (see the module's text). Nothing is kept for a shape
    whose calls never did."""

    def __init__(self) -> None:
        self._rows: dict[ShapeKey, int] = {}
        self._lock = threading.Lock()

    def start(self, key: ShapeKey, batch_size: int) -> int:
        """The rows of a batch's first call: ``batch_size``, or fewer if that ran out of
        memory before."""
        return min(batch_size, self._rows.get(key, batch_size))

    def worked(self, key: ShapeKey, rows: int) -> bool:
        """Whether calls of ``rows`` rows (or more) of ``key`` have worked since a larger
        call ran out of memory: one of them running out too depends on its rows."""
        fits = self._rows.get(key)
        return fits is not None and rows <= fits

    def fitted(self, model: Any, key: ShapeKey, rows: int, tried: int,
               exc: BaseException) -> int:
        """Keep ``rows`` as the size of ``key``'s calls, a call of ``tried`` rows having run
        out of memory with ``exc``: logged once, and written to the build log. Returns
        the size kept (a smaller one kept meanwhile by another thread stays)."""
        with self._lock:
            if self._rows.get(key, rows + 1) <= rows:
                return self._rows[key]
            self._rows[key] = rows
        shape, why = shape_text(key), reason_text(exc)
        cache_key = note_call_rows(model, {"shape": shape, "rows": rows, "tried": tried,
                                           "reason": why})
        logger.warning("model %s ran out of memory on a call of %d rows (%s): rows of shape "
                       "%s go in calls of at most %d rows from now on in this process (pid %d)",
                       cache_key or repr(getattr(model, "name", type(model).__name__)), tried,
                       why, shape, rows, os.getpid())
        return rows

    def info(self) -> dict[str, int]:
        """The sizes kept: shape (as :func:`shape_text`) -> rows per call."""
        with self._lock:
            return {shape_text(key): rows for key, rows in self._rows.items()}
