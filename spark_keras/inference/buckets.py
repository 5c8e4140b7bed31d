"""A batch's rows grouped for the model when an input has unknown dimensions: by exact
shape (:func:`exact_groups`: nothing padded, one call per shape), or with ``buckets``
padded into a few lengths (:func:`padded_groups`: one call per bucket), for a model that
masks its padded steps (:mod:`.masking` tells which inputs it masks and their pad values).

Only the sequence axis (the first of a row, axis 1 of the batch) is padded, at the end of
each row. A row's length, which picks its bucket, is the longest of its padded inputs'
(token ids and their padding mask share one axis; two sequences, an encoder's and a
decoder's, may differ, and each is padded to the bucket's length). ``buckets=N``: the
batch's lengths go into at most N buckets, whose lengths pad the fewest steps
(:func:`bucket_lengths`: an exact dynamic programme over the batch's distinct lengths,
over 256 quantiles of them when there are more). ``buckets=(16, 32, 64)``: each row goes
to the smallest of those lengths that holds it, and the rows longer than the last into one
more bucket, padded to the longest of them. An input's other unknown dimensions are never
padded: rows that differ there are in different groups. An output with a value per step (a
variable first axis as long as the padded input) comes back cut to the row's own length on
the input its steps follow (:attr:`Padding.follows`, :meth:`Group.length`,
:func:`trimmed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from spark_keras.errors import ArgumentError
from spark_keras.inference.options import PYTHON, Buckets, Spelling, check_buckets
from spark_keras.inference.specs import TensorSpec

CANDIDATES = 256  # the most distinct lengths the dynamic programme weighs (else quantiles)


class Padding(tuple[Any, ...]):
    """Each input's pad value for ``buckets`` (None: an input that is not padded), as a
    tuple, and :attr:`follows`: for each output, the input whose steps its first axis
    follows (None: an output without a value per step), found by :mod:`.masking`."""

    follows: tuple[int | None, ...]

    def __new__(cls, pads: Sequence[Any], follows: Sequence[int | None]) -> Padding:
        self = super().__new__(cls, pads)
        self.follows = tuple(follows)
        return self

    def __getnewargs__(self) -> tuple[Any, ...]:  # (two arguments: pickled, it is rebuilt whole)
        return tuple(self), self.follows


@dataclass(frozen=True)
class Group:
    """Rows of one model call: which rows of the batch, their inputs (each ``(rows,
    *shape)`` of the input's dtype) and, when padded, each row's own length (the longest
    of its padded inputs'), the length they are padded to, each row's own length on each
    input (``own``, ``(inputs, rows)``, 0 on an input not padded) and the input each
    output's steps follow (:attr:`Padding.follows`)."""

    rows: np.ndarray
    inputs: list[np.ndarray]
    lengths: np.ndarray | None = None
    steps: int = 0
    own: np.ndarray | None = None
    follows: tuple[int | None, ...] = ()

    def length(self, output: int, k: int) -> int:
        """The length row ``k``'s output ``output`` is cut to (:func:`trimmed`): the row's
        own on the input that output's steps follow; the padded length (nothing cut) for
        an output that follows none."""
        follows = self.follows[output] if output < len(self.follows) else None
        return self.steps if follows is None or self.own is None else int(self.own[follows, k])


def checked(handle: Any, buckets: Any, spelling: Spelling = PYTHON) -> Buckets:
    """``buckets`` as :func:`.options.check_buckets` gives it, once ``handle``'s model (its
    ``predictor``) is known to take padded rows (:attr:`~.predictor.Predictor.padding`): an
    :class:`ArgumentError` naming the option and why otherwise. Front-ends call it on the
    driver, where the model is."""
    buckets = check_buckets(buckets, spelling)
    if buckets is not None:
        try:
            handle.predictor.padding  # noqa: B018  (found once per model and process, or raised)
        except ArgumentError as exc:
            raise ArgumentError(f"{spelling.setting(spelling.buckets, buckets)}: {exc}") from None
    return buckets


def exact_groups(arrays: Sequence[np.ndarray], specs: Sequence[TensorSpec]) -> Iterator[Group]:
    """Rows of one shape (on every input) together: each row's prediction is the model's
    on that row alone, nothing padded. A variable input is an object array of one array
    per row."""
    n = len(arrays[0]) if arrays else 0
    groups: dict[tuple, list[int]] = {}
    for i in range(n):
        key = tuple(a[i].shape for a, s in zip(arrays, specs) if s.variable)
        groups.setdefault(key, []).append(i)
    for rows in groups.values():
        index = np.asarray(rows)
        yield Group(index, [_stacked(a[index], s) if s.variable else a[index]
                            for a, s in zip(arrays, specs)])


def padded_groups(arrays: Sequence[np.ndarray], specs: Sequence[TensorSpec],
                  pads: Padding, buckets: int | tuple[int, ...]) -> Iterator[Group]:
    """Rows padded into buckets (see the module's text); ``pads``: each input's pad value,
    None for an input that is not padded (its first axis is known), and which input each
    output's steps follow."""
    n = len(arrays[0]) if arrays else 0
    own = np.zeros((len(pads), n), dtype=np.int64)
    for j, pad in enumerate(pads):
        if pad is not None:
            own[j] = np.fromiter((len(r) for r in arrays[j]), np.int64, n)
    lengths = own.max(axis=0, initial=0)
    target = bucket_lengths(lengths, buckets)
    # inputs whose rows may still differ in shape once padded: grouped by that shape too
    exact = [j for j, s in enumerate(specs)
             if s.variable and (pads[j] is None or None in s.shape[1:])]
    if exact:
        groups: dict[tuple, list[int]] = {}
        for r in range(n):
            key = (int(target[r]), *(arrays[j][r].shape[pads[j] is not None:] for j in exact))
            groups.setdefault(key, []).append(r)
        indices = [np.asarray(rows) for rows in groups.values()]
    else:
        order = np.argsort(target, kind="stable")
        indices = np.split(order, np.flatnonzero(np.diff(target[order])) + 1) if n else []
    for index in indices:
        length = int(target[index[0]])
        inputs = [_padded(a[index], s, length, pad) if pad is not None
                  else _stacked(a[index], s) if s.variable else a[index]
                  for a, s, pad in zip(arrays, specs, pads)]
        yield Group(index, inputs, lengths[index], length, own[:, index], pads.follows)


def bucket_lengths(lengths: np.ndarray, buckets: int | tuple[int, ...]) -> np.ndarray:
    """Each row's bucket length, given the rows' own ``lengths`` (see the module's text)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return lengths
    if isinstance(buckets, tuple):
        bounds = np.asarray(buckets, dtype=np.int64)
        at = np.searchsorted(bounds, lengths)  # the smallest bound >= the length
        over = at == len(bounds)
        out = bounds[np.minimum(at, len(bounds) - 1)]
        if over.any():
            out[over] = lengths[over].max()
        return out
    chosen = fewest_steps(lengths, buckets)
    return chosen[np.searchsorted(chosen, lengths)]


def fewest_steps(lengths: np.ndarray, n: int) -> np.ndarray:
    """At most ``n`` bucket lengths (sorted, the longest row's among them) that hold every
    row of ``lengths`` in the fewest steps, i.e. with the least padding: exact over the
    distinct lengths when there are at most :data:`CANDIDATES`, else over that many
    quantiles of them."""
    distinct, counts = np.unique(lengths, return_counts=True)
    if len(distinct) <= n:
        return distinct
    candidates = distinct
    if len(distinct) > CANDIDATES:
        candidates = distinct[np.unique(np.linspace(0, len(distinct) - 1, CANDIDATES).round()
                                        .astype(np.int64))]
        counts = np.bincount(np.searchsorted(candidates, distinct), weights=counts,
                             minlength=len(candidates))
    k = len(candidates)
    if k <= n:
        return candidates
    # best[j]: fewest steps for the rows of the first j candidates, in m buckets; a bucket
    # holding candidates i+1..j is as long as candidate j: steps[j, i] = c_j (W_j - W_i)
    c = np.concatenate(([0.0], candidates.astype(np.float64)))
    w = np.concatenate(([0.0], np.cumsum(counts, dtype=np.float64)))
    steps = np.where(np.tri(k + 1, k + 1, -1, dtype=bool), c[:, None] * (w[:, None] - w[None, :]),
                     np.inf)
    best = np.full(k + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((n, k + 1), dtype=np.int64)
    for m in range(n):
        total = best[None, :] + steps
        choice[m] = total.argmin(axis=1)
        best = total[np.arange(k + 1), choice[m]]
    ends, j = [], k
    for m in range(n - 1, -1, -1):
        ends.append(j)
        j = int(choice[m, j])
        if j == 0:
            break
    return candidates[np.asarray(ends[::-1]) - 1]


def trimmed(got: np.ndarray, spec: TensorSpec, length: int, padded: int) -> np.ndarray:
    """One row's output ``got`` of a call on rows padded to ``padded`` steps, cut to the
    row's own ``length`` where it has a value per step (a variable first axis as long as
    the padded input)."""
    return got[:length] if spec.shape and spec.shape[0] is None and len(got) == padded else got


def padding_share(lengths: np.ndarray, buckets: int | tuple[int, ...]) -> float:
    """The share of padded steps among all the steps fed when rows of ``lengths`` are
    bucketed so (0: nothing padded)."""
    target = bucket_lengths(lengths, buckets)
    fed = int(target.sum())
    return (fed - int(np.asarray(lengths).sum())) / fed if fed else 0.0


def _padded(rows: np.ndarray, spec: TensorSpec, length: int, pad: Any) -> np.ndarray:
    """Per-row arrays padded at the end of their first axis to ``length`` with ``pad``,
    as one ``(rows, length, *rest)`` array of the input's dtype."""
    out = np.full((len(rows), length, *rows[0].shape[1:]), pad, dtype=spec.dtype)
    for k, row in enumerate(rows):
        out[k, :len(row)] = row
    return out


def _stacked(rows: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """Per-row arrays of one shape as one ``(rows, *shape)`` array of the input's dtype."""
    stacked = np.stack(list(rows))
    return stacked if spec.dtype == "string" else stacked.astype(spec.dtype, copy=False)
