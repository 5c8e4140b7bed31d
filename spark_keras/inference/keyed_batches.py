"""The input batches of a KeyedModels task put together while their rows are in mixed key
order (issue 55 item 10). A model call has a fixed cost (TensorFlow's dispatch and the
call's Python: about 0.4 ms of CPU for a 64-256-256-1 MLP on one thread, where 1,024 rows
take 1.8 ms), so a batch of 10,000 rows holding 20 keys, which gives each key's model 500
rows, ran at 0.56x the same rows clustered by key (0.64x in CPU time in one process).
Consecutive batches are concatenated until each of their keys has about :data:`CALLS`
calls' rows (``batch_size`` each; at most :data:`MOST_ROWS` rows and :data:`MOST_BYTES`
bytes of the scored columns), scored as one, and the outputs cut back into the input's
batches: one output batch per input batch, in order, each row's own. Both front-ends are
iterator UDFs (``arrow_udf`` over an iterator, ``mapInArrow``), whose contract is the
output rows in the input's order, as many in all (never more than read so far), not a
batch for a batch in one call; a task still ends with its last batch (a stream's
micro-batch too). A batch of one key (rows clustered by key) goes alone, as it is."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Gathered", "gathered", "CALLS", "MOST_ROWS", "MOST_BYTES"]

CALLS = 2  # calls' rows given each key, about (CPU time x clustered, 20 keys: 1: 0.79, 2: 0.82)
MOST_ROWS = 1 << 16  # rows held together at most
MOST_BYTES = 64 << 20  # and bytes of their columns


class Gathered:
    """Consecutive input batches as one: its ``arrays`` (each column concatenated), and
    each row's place in its own batch (:meth:`local`); :meth:`split` cuts outputs back."""

    def __init__(self, batches: list[list[pa.Array]]) -> None:
        self.lengths = [len(b[0]) for b in batches]
        self.arrays = batches[0] if len(batches) == 1 else \
            [pa.concat_arrays([b[j] for b in batches]) for j in range(len(batches[0]))]
        self._local: np.ndarray | None = None
        if len(batches) > 1:
            firsts = np.cumsum([0, *self.lengths[:-1]])
            self._local = np.arange(sum(self.lengths)) - np.repeat(firsts, self.lengths)

    def local(self, rows: np.ndarray | None) -> np.ndarray | None:
        """The places in their own input batch of ``rows`` (of this one; None: all its rows
        in order): what errors and reasons number them by; None when that is all of one
        input batch."""
        if self._local is None:
            return rows
        return self._local if rows is None else self._local[rows]

    def split(self, out: list[pa.Array]) -> Iterator[list[pa.Array]]:
        """``out`` (a row per row of this one, in order) cut into the input's batches."""
        if len(self.lengths) == 1:
            yield out
            return
        first = 0
        for length in self.lengths:
            yield [o.slice(first, length) for o in out]
            first += length


def _keys(key_array: pa.Array) -> int:
    return int(pc.count_distinct(key_array, mode="all").as_py()) if len(key_array) else 0


def gathered(batches: Iterator[Sequence[pa.Array]], batch_size: int) -> Iterator[Gathered]:
    """``batches`` (``[key, *columns]`` each) put together while they hold more than one
    key and fewer rows than :data:`CALLS` x ``batch_size`` per key (at most
    :data:`MOST_ROWS` rows and :data:`MOST_BYTES` bytes)."""
    held: list[list[pa.Array]] = []
    rows = size = keys = 0
    for arrays in batches:
        arrays = list(arrays)
        held.append(arrays)
        rows += len(arrays[0])
        size += sum(a.nbytes for a in arrays)
        keys = max(keys, _keys(arrays[0]))
        if keys <= 1 or rows >= min(CALLS * keys * batch_size, MOST_ROWS) or size >= MOST_BYTES:
            yield Gathered(held)
            held, rows, size, keys = [], 0, 0, 0
    if held:
        yield Gathered(held)
