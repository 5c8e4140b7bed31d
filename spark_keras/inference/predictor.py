"""Calling a model fast: ``model(x, training=False)`` compiled once per model.

``model.predict`` pays a per-call setup cost (data adapters, callbacks, a fresh step
function); calling a ``tf.function`` traced once with a batch dimension of ``None`` does
not, and does not retrace for the last, shorter batch.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence, cast

import numpy as np

from spark_keras import flavour
from spark_keras.errors import ModelError
from spark_keras.inference.ahead import Ahead, on_demand
from spark_keras.inference.buckets import Group, Padding, exact_groups, padded_groups, trimmed
from spark_keras.inference.call_sizes import CallSizes, ShapeKey, out_of_memory, shape_key
from spark_keras.inference.isolation import Isolated, Ranges, RowFailure, first_failure, isolate
from spark_keras.inference.masking import padding_of
from spark_keras.inference.options import DEFAULT_BATCH_SIZE
from spark_keras.inference.shaped_calls import ShapedCalls, needs_known_steps
from spark_keras.inference.signature import signature_of
from spark_keras.inference.specs import Signature, empty_outputs
from spark_keras.inference.tasks import attached_preprocessor, preprocessed

_ATTR = "_spark_keras_predictor"
_lock = threading.Lock()


class Predictor:
    """A model's compiled inference function, with its input/output signature. A task
    model's attached preprocessor runs inside the compiled call (see :mod:`.tasks`)."""

    def __init__(self, model: Any, signature: Signature | None = None) -> None:
        self.model = model
        self.signature = signature or signature_of(model)
        self._call = self._compile()
        self._padding: Padding | None = None
        # the most rows per call, per shape, where a larger call ran out of memory
        self.call_sizes = CallSizes()

    def _flat_outputs(self, outputs: Any) -> list[Any]:
        names = self.signature.output_names
        if isinstance(outputs, dict) and names is not None:
            return [outputs[k] for k in names]
        return flavour.current().flatten(outputs)

    def _compile(self) -> Callable[[Sequence[np.ndarray]], list[np.ndarray]]:
        model, sig = self.model, self.signature
        preprocessor = attached_preprocessor(model)

        def call(*xs: Any) -> list[Any]:
            x = sig.pack_inputs(list(xs))
            if preprocessor is not None:  # a task model: its preprocessing in the same call
                x = preprocessed(preprocessor, x)
            return self._flat_outputs(model(x, training=False))

        rt = flavour.current()
        if any(s.variable for s in sig.inputs) and needs_known_steps(model):
            return ShapedCalls(lambda specs: rt.compile_call(call, specs), sig.inputs)
        return rt.compile_call(call, sig.inputs)

    @property
    def padding(self) -> Padding:
        """Each input's pad value for ``buckets`` (None: an input that is not padded), found
        once (:mod:`.masking`); an :class:`~spark_keras.errors.ArgumentError` says why the
        model cannot take padded rows."""
        if self._padding is None:
            self._padding = padding_of(self.model, self.signature, self._call)
        return self._padding

    @property
    def traces(self) -> int | None:
        """How many concrete functions TensorFlow traced for the compiled call (None: the
        model is called eagerly)."""
        return getattr(self._call, "traces", None)

    def __call__(self, arrays: Sequence[np.ndarray], batch_size: int = DEFAULT_BATCH_SIZE,
                 failures: dict[int, BaseException] | None = None,
                 buckets: int | tuple[int, ...] | None = None) -> list[np.ndarray]:
        """Outputs (flattened, in signature order) for inputs of any length, in batches.
        Inputs with unknown dimensions come as object arrays of one array per row: rows
        are grouped by shape, or with ``buckets`` (checked: :func:`.buckets.checked`)
        padded into buckets of a few lengths (see :mod:`.buckets`).

        A call that raises is retried in parts (:mod:`.isolation`): with ``failures`` (a
        dict) the rows that raise alone are recorded there (row -> exception) and get
        zeros in the outputs; without it, :class:`~.isolation.RowFailure` names the first
        such row (the call's own exception if no single row raises). Text outputs come
        back as ``str``; a row whose text is not UTF-8 is one the model failed on."""
        specs = self.signature.inputs
        if buckets is not None:
            groups = padded_groups(arrays, specs, self.padding, buckets)
        elif any(spec.variable for spec in specs):
            groups = exact_groups(arrays, specs)
        else:
            return self._texts(self._batched(arrays, batch_size, failures), failures)
        return self._texts(self._grouped(groups, arrays, batch_size, failures), failures)

    def _texts(self, outs: list[np.ndarray], failures: dict[int, BaseException] | None
               ) -> list[np.ndarray]:
        """``outs`` with each text output's bytes as ``str``: a row that is not UTF-8 text is
        a row the model failed on (recorded in ``failures``, or raised as a
        :class:`RowFailure`), like one it raised on."""
        specs = self.signature.outputs
        if not any(spec.dtype == "string" for spec in specs):
            return outs
        from spark_keras.inference.outputs import text_rows  # Arrow loads where batches are scored

        done = failures or {}
        bad: dict[int, BaseException] = {}
        for j, spec in enumerate(specs):
            if spec.dtype != "string":
                continue
            outs[j], wrong = text_rows(outs[j], spec.variable, done)
            for row, exc in wrong.items():
                error = ModelError(f"output {spec.name!r} is not UTF-8 text ({exc}); a string "
                                   f"output must hold text")
                error.__cause__ = exc
                bad.setdefault(row, error)
        if bad and failures is None:
            row = min(bad)
            raise RowFailure(row, bad[row]) from bad[row]
        if bad:
            cast("dict[int, BaseException]", failures).update(bad)
        return outs

    def _grouped(self, groups: Iterable[Group], arrays: Sequence[np.ndarray], batch_size: int,
                 failures: dict[int, BaseException] | None) -> list[np.ndarray]:
        """The outputs of the rows of ``arrays`` scored group by group, each group's rows
        in calls of ``batch_size``. An output with unknown dimensions comes back as an
        object array of one array per row (cut to the row's length where padded). A row
        that fails padded is tried again at its own length (:meth:`_unpadded`) before it
        is blamed. Without ``failures``, the :class:`RowFailure` raised names the first
        failing row of all groups."""
        n = len(arrays[0]) if arrays else 0
        outs = [np.empty(n, dtype=object) if s.variable else None for s in self.signature.outputs]
        first: RowFailure | None = None  # without ``failures``: the first row failed so far
        for group in groups:
            index = group.rows
            if first is not None and int(index.min()) > first.row:
                continue  # (its rows come after the one raised)
            padded = group.lengths is not None
            found: dict[int, BaseException] | None = {} if failures is not None or padded \
                else None
            try:
                got_all = self._batched(group.inputs, batch_size, found)
            except RowFailure as failure:  # its row, numbered in the whole batch
                first = _earlier(first, int(index[failure.row]), failure.cause)
                continue
            for j, got in enumerate(got_all):
                out, spec = outs[j], self.signature.outputs[j]
                if out is None:
                    out = outs[j] = np.empty((n, *got.shape[1:]), dtype=got.dtype)
                if not spec.variable:
                    out[index] = got
                    continue
                for k, row in enumerate(index):  # one array per row, of its own shape
                    # (a failed row's placeholder is left as it is: the rows are left out)
                    out[row] = got[k] if not padded or (found and k in found) \
                        else trimmed(got[k], spec, group.length(j, k), group.steps)
            if padded and found:
                try:
                    self._unpadded(arrays, index[sorted(found)], batch_size, outs, failures)
                except RowFailure as failure:
                    first = _earlier(first, failure.row, failure.cause)
            elif failures is not None and found:
                failures.update({int(index[k]): exc for k, exc in found.items()})
        if first is not None:
            raise first from first.cause
        if not n:
            return empty_outputs(self.signature)
        return cast("list[np.ndarray]", outs)  # each filled by the first group

    def _unpadded(self, arrays: Sequence[np.ndarray], rows: np.ndarray, batch_size: int,
                  outs: list[np.ndarray | None], failures: dict[int, BaseException] | None
                  ) -> None:
        """``rows`` (of ``arrays``), which failed padded in a bucket, scored again by exact
        shape, nothing padded (a row may fail only at the bucket's length: past a
        positional table), into ``outs``: those that fail so too recorded in ``failures``
        with their own exception, or the first raised as a :class:`RowFailure` (numbered
        in ``arrays``)."""
        part = [a[rows] for a in arrays]
        found: dict[int, BaseException] | None = None if failures is None else {}
        try:
            got_all = self._grouped(exact_groups(part, self.signature.inputs), part, batch_size,
                                    found)
        except RowFailure as failure:
            raise RowFailure(int(rows[failure.row]), failure.cause) from failure.cause
        for out, got in zip(outs, got_all):
            if out is not None:
                out[rows] = got
        if failures is not None and found:
            failures.update({int(rows[k]): exc for k, exc in found.items()})

    def _batched(self, arrays: Sequence[np.ndarray], batch_size: int,
                 failures: dict[int, BaseException] | None = None) -> list[np.ndarray]:
        """The outputs of the rows of ``arrays`` (of one shape per input) in calls of
        ``batch_size`` rows, or of the fewer rows calls of their shape were held to after a
        larger one ran out of memory (:mod:`.call_sizes`). A call that runs out of memory
        (in the model, or making its rows) at a size not known to fit is set aside: if the
        next call of as many rows runs out too (or there is none), both calls' rows go
        again in calls of half as many; else the rows set aside are searched
        (:meth:`_searched`), whatever that call did. A call that raises otherwise is
        searched for the rows that raise. Each call's outputs have a row per row."""
        n = len(arrays[0]) if arrays else 0
        if not n:  # one call of no rows: the outputs' shapes
            return _one_per_row(self._call([np.asarray(a) for a in arrays]), 0)
        key, sizes = shape_key(arrays), self.call_sizes
        size = sizes.start(key, batch_size)
        parts: list[tuple[int, int, Isolated[list[np.ndarray]] | list[np.ndarray]]] = []
        aside: tuple[int, int, BaseException] | None = None  # ran out, at a size not known to fit
        tried: tuple[int, BaseException] | None = None  # the first call that ran out
        # inputs made when sliced (image rows): the next call's made while this one computes
        ahead = Ahead(arrays) if on_demand(arrays) else None
        i = 0
        while i < n:
            stop = min(i + size, n)
            failed: BaseException | None = None
            try:
                chunk: Sequence[np.ndarray]
                if ahead is not None:
                    chunk = ahead.take(i, stop)
                    ahead.prepare(stop, min(stop + size, n))
                else:
                    chunk = arrays if stop - i == n else [a[i:stop] for a in arrays]
                got = self._call(chunk)
            except Exception as exc:  # a row the model cannot take, perhaps: find it
                failed = exc
            if failed is not None and out_of_memory(failed) and stop - i > 1 \
                    and not sizes.worked(key, stop - i):
                tried = tried or (stop - i, failed)
                if aside is None and stop < n:  # too many rows, or these rows? once more
                    aside, i = (i, stop, failed), stop
                else:  # twice at this size (or no next call): the rows in smaller calls
                    first, last = aside[:2] if aside is not None else (i, stop)
                    i, size, aside = first, (last - first + 1) // 2, None
                continue
            if aside is not None:  # ran out beside a call that did not: its rows' doing
                parts.append((*aside[:2], self._searched(arrays, *aside, failures, key)))
                aside, size = None, sizes.start(key, size)
            if failed is not None:
                parts.append((i, stop, self._searched(arrays, i, stop, failed, failures, key)))
                size = sizes.start(key, size)
            else:
                parts.append((i, stop, _one_per_row(got, stop - i)))
                if tried is not None and stop - i == size:  # a size that fits
                    size, tried = sizes.fitted(self.model, key, size, *tried), None
            i = stop
        # (parts come in row order) a call's outputs are the template of the rows that
        # failed (their zeros): of a chunk whose every row failed, another chunk's (a
        # per-step output's shape is only known from a call)
        template = next((p for _, _, p in parts if not isinstance(p, Isolated)),
                        next((p.parts[0][2] for _, _, p in parts
                              if isinstance(p, Isolated) and p.parts), None))
        done = [p if not isinstance(p, Isolated) else
                _with_placeholders(p, a, b, template or empty_outputs(self.signature))
                for a, b, p in parts]
        return done[0] if len(done) == 1 else [np.concatenate(c) for c in zip(*done)]

    def _searched(self, arrays: Sequence[np.ndarray], start: int, stop: int,
                  exc: BaseException, failures: dict[int, BaseException] | None,
                  key: ShapeKey) -> Isolated[list[np.ndarray]]:
        """:meth:`_isolated`; and when the call ran out of memory but the search scored
        every row in smaller calls, memory shrank: the largest of them is the size kept."""
        found = self._isolated(arrays, start, stop, exc, failures)
        if out_of_memory(exc) and not found.failures and found.parts:
            self.call_sizes.fitted(self.model, key, max(b - a for a, b, _ in found.parts),
                                   stop - start, exc)
        return found

    def _isolated(self, arrays: Sequence[np.ndarray], start: int, stop: int, exc: BaseException,
                  failures: dict[int, BaseException] | None) -> Isolated[list[np.ndarray]]:
        """The search's parts of rows ``start`` to ``stop``, the call having raised ``exc``
        on them: the rows that raise alone recorded in ``failures``, or the first of them
        raised as a :class:`RowFailure`. Without ``failures``, a call that ran out of
        memory is searched whole too (its rows' results kept): only a row that runs out
        alone is raised."""
        def call(ranges: Ranges) -> list[np.ndarray]:
            return _one_per_row(self._call([_rows(x, ranges) for x in arrays]),
                                sum(b - a for a, b in ranges))

        if failures is None and not out_of_memory(exc):
            first = first_failure(call, start, stop, exc)
            if first is None:
                raise exc
            raise RowFailure(*first) from first[1]
        found = isolate(call, start, stop, exc, split=_split)
        if failures is None and found.failures:
            row = min(found.failures)
            raise RowFailure(row, found.failures[row]) from found.failures[row]
        if failures is not None:
            failures.update(found.failures)
        return found


def _earlier(first: RowFailure | None, row: int, cause: BaseException) -> RowFailure:
    """``first``, or the failure of ``row`` if it comes before it (or there is none)."""
    return first if first is not None and first.row <= row else RowFailure(row, cause)


def _rows(x: np.ndarray, ranges: Ranges) -> np.ndarray:
    """The rows of ``ranges`` of ``x``, one after the other (a view for one range)."""
    if len(ranges) == 1:
        return x[ranges[0][0]:ranges[0][1]]
    return np.concatenate([x[a:b] for a, b in ranges])


def _one_per_row(outputs: list[np.ndarray], rows: int) -> list[np.ndarray]:
    """A call's ``outputs`` for ``rows`` rows, refused unless each has a row per row (one
    row's result is never broadcast to others)."""
    wrong = [len(out) if np.ndim(out) else "no" for out in outputs if np.ndim(out) == 0
             or len(out) != rows]
    if wrong:
        raise ModelError(f"the model returned {wrong[0]} rows of an output for a call of "
                         f"{rows} rows: each output must have one row per input row")
    return outputs


def _split(outputs: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]]:
    """One call's outputs cut into those of consecutive rows of ``sizes``."""
    bounds = np.cumsum([0, *sizes])
    return [[out[a:b] for out in outputs] for a, b in zip(bounds, bounds[1:])]


def _with_placeholders(found: Isolated[list[np.ndarray]], start: int, stop: int,
                       template: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs of rows ``start`` to ``stop`` from the parts that succeeded, zeros on
    the rows that failed (the engine leaves those out), of ``template``'s shapes past its
    first axis and dtypes (another call's outputs, or :func:`empty_outputs`)."""
    outs = [np.zeros((stop - start, *t.shape[1:]), dtype=t.dtype) for t in template]
    for a, b, got in found.parts:
        for out, part in zip(outs, got):
            out[a - start:b - start] = part
    return outs


def predictor_for(model: Any) -> Predictor:
    """The model's :class:`Predictor`, created once and kept on the model."""
    predictor = model.__dict__.get(_ATTR)
    if predictor is None:
        with _lock:
            predictor = model.__dict__.get(_ATTR)
            if predictor is None:
                predictor = Predictor(model)
                object.__setattr__(model, _ATTR, predictor)
    return predictor

