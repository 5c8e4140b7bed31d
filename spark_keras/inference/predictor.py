"""Calling a model fast: ``model(x, training=False)`` compiled once per model.

``model.predict`` pays a per-call setup cost (data adapters, callbacks, a fresh step
function); calling a ``tf.function`` traced once with a batch dimension of ``None`` does
not, and does not retrace for the last, shorter batch.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence, cast

import numpy as np

from .. import flavour
from .isolation import Isolated, Ranges, RowFailure, first_failure, isolate
from .options import DEFAULT_BATCH_SIZE
from .signature import signature_of
from .specs import Signature, empty_outputs
from .tasks import attached_preprocessor, preprocessed

_ATTR = "_spark_keras_predictor"
_lock = threading.Lock()


class Predictor:
    """A model's compiled inference function, with its input/output signature. A task
    model's attached preprocessor runs inside the compiled call (see :mod:`.tasks`)."""

    def __init__(self, model: Any, signature: Signature | None = None) -> None:
        self.model = model
        self.signature = signature or signature_of(model)
        self._call = self._compile()

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

        return flavour.current().compile_call(call, sig.inputs)

    def __call__(self, arrays: Sequence[np.ndarray], batch_size: int = DEFAULT_BATCH_SIZE,
                 failures: dict[int, BaseException] | None = None) -> list[np.ndarray]:
        """Outputs (flattened, in signature order) for inputs of any length, in batches.
        Inputs with unknown dimensions come as object arrays of one array per row: rows
        are grouped by shape (see :meth:`_grouped`).

        A call that raises is retried in parts (:mod:`.isolation`): with ``failures`` (a
        dict) the rows that raise alone are recorded there (row -> exception) and get
        zeros in the outputs; without it, :class:`~.isolation.RowFailure` names the first
        such row (the call's own exception if no single row raises)."""
        if any(spec.variable for spec in self.signature.inputs):
            return self._grouped(arrays, batch_size, failures)
        return self._batched(arrays, batch_size, failures)

    def _grouped(self, arrays: Sequence[np.ndarray], batch_size: int,
                 failures: dict[int, BaseException] | None) -> list[np.ndarray]:
        """Rows of one shape (on every input) in one call, so each row's prediction is the
        model's on that row alone: nothing is padded. An output with unknown dimensions
        comes back as an object array of one array per row."""
        specs = self.signature.inputs
        n = len(arrays[0]) if arrays else 0
        groups: dict[tuple, list[int]] = {}
        for i in range(n):
            key = tuple(a[i].shape for a, s in zip(arrays, specs) if s.variable)
            groups.setdefault(key, []).append(i)
        outs = [np.empty(n, dtype=object) if s.variable else None for s in self.signature.outputs]
        for rows in groups.values():
            index = np.asarray(rows)
            inputs = [_stacked(a[index], s) if s.variable else a[index]
                      for a, s in zip(arrays, specs)]
            found: dict[int, BaseException] | None = None if failures is None else {}
            try:
                got_all = self._batched(inputs, batch_size, found)
            except RowFailure as failure:  # its row, numbered in the whole batch
                raise RowFailure(int(index[failure.row]), failure.cause) from failure.cause
            if failures is not None and found:
                failures.update({int(index[k]): exc for k, exc in found.items()})
            for j, got in enumerate(got_all):
                out = outs[j]
                if out is None:
                    out = outs[j] = np.empty((n, *got.shape[1:]), dtype=got.dtype)
                if self.signature.outputs[j].variable:  # one array per row, of its own shape
                    for k, row in enumerate(index):
                        out[row] = got[k]
                else:
                    out[index] = got
        if not n:
            return empty_outputs(self.signature)
        return cast("list[np.ndarray]", outs)  # each filled by the first group

    def _batched(self, arrays: Sequence[np.ndarray], batch_size: int,
                 failures: dict[int, BaseException] | None = None) -> list[np.ndarray]:
        n = len(arrays[0]) if arrays else 0
        parts = []
        for i in range(0, max(n, 1), batch_size):
            chunk = arrays if n <= batch_size else [a[i:i + batch_size] for a in arrays]
            try:
                parts.append(self._call(chunk))
            except Exception as exc:  # a row the model cannot take, perhaps: find it
                parts.append(self._isolated(arrays, i, min(i + batch_size, n), exc, failures))
        return parts[0] if len(parts) == 1 else [np.concatenate(c) for c in zip(*parts)]

    def _isolated(self, arrays: Sequence[np.ndarray], start: int, stop: int,
                  exc: Exception, failures: dict[int, BaseException] | None) -> list[np.ndarray]:
        """Rows ``start`` to ``stop``'s outputs, the call having raised ``exc`` on them:
        the rows that raise alone recorded in ``failures`` (zeros in the outputs), or the
        first of them raised as a :class:`RowFailure`."""
        def call(ranges: Ranges) -> list[np.ndarray]:
            return self._call([_rows(x, ranges) for x in arrays])

        if failures is None:
            first = first_failure(call, start, stop, exc)
            if first is None:
                raise exc
            raise RowFailure(*first) from first[1]
        found = isolate(call, start, stop, exc, split=_split)
        failures.update(found.failures)
        return _with_placeholders(found, start, stop, self.signature)


def _rows(x: np.ndarray, ranges: Ranges) -> np.ndarray:
    """The rows of ``ranges`` of ``x``, one after the other (a view for one range)."""
    if len(ranges) == 1:
        return x[ranges[0][0]:ranges[0][1]]
    return np.concatenate([x[a:b] for a, b in ranges])


def _split(outputs: list[np.ndarray], sizes: list[int]) -> list[list[np.ndarray]]:
    """One call's outputs cut into those of consecutive rows of ``sizes``."""
    bounds = np.cumsum([0, *sizes])
    return [[out[a:b] for out in outputs] for a, b in zip(bounds, bounds[1:])]


def _with_placeholders(found: Isolated[list[np.ndarray]], start: int, stop: int,
                       signature: Any) -> list[np.ndarray]:
    """The outputs of rows ``start`` to ``stop`` from the parts that succeeded, zeros on
    the rows that failed (the engine leaves those out)."""
    template = found.parts[0][2] if found.parts else empty_outputs(signature)
    outs = [np.zeros((stop - start, *t.shape[1:]), dtype=t.dtype) for t in template]
    for a, b, got in found.parts:
        for out, part in zip(outs, got):
            out[a - start:b - start] = part
    return outs


def _stacked(rows: np.ndarray, spec: Any) -> np.ndarray:
    """Per-row arrays of one shape as one ``(rows, *shape)`` array of the input's dtype."""
    stacked = np.stack(list(rows))
    return stacked if spec.dtype == "string" else stacked.astype(spec.dtype, copy=False)


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
