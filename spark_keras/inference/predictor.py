"""Calling a model fast: ``model(x, training=False)`` compiled once per model.

``model.predict`` pays a per-call setup cost (data adapters, callbacks, a fresh step
function); calling a ``tf.function`` traced once with a batch dimension of ``None`` does
not, and does not retrace for the last, shorter batch.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence, cast

import numpy as np

from .. import flavour
from ..errors import ModelError
from .buckets import Group, Padding, exact_groups, padded_groups, trimmed
from .isolation import Isolated, Ranges, RowFailure, first_failure, isolate
from .masking import padding_of
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
        self._padding: Padding | None = None

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
        return self._texts(self._grouped(groups, len(arrays[0]) if arrays else 0, batch_size,
                                         failures), failures)

    def _texts(self, outs: list[np.ndarray], failures: dict[int, BaseException] | None
               ) -> list[np.ndarray]:
        """``outs`` with each text output's bytes as ``str``: a row that is not UTF-8 text is
        a row the model failed on (recorded in ``failures``, or raised as a
        :class:`RowFailure`), like one it raised on."""
        specs = self.signature.outputs
        if not any(spec.dtype == "string" for spec in specs):
            return outs
        from .outputs import text_rows  # Arrow loads where batches are scored

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

    def _grouped(self, groups: Iterable[Group], n: int, batch_size: int,
                 failures: dict[int, BaseException] | None) -> list[np.ndarray]:
        """The outputs of ``n`` rows scored group by group, each group's rows in calls of
        ``batch_size``. An output with unknown dimensions comes back as an object array of
        one array per row (cut to the row's length where padded)."""
        outs = [np.empty(n, dtype=object) if s.variable else None for s in self.signature.outputs]
        for group in groups:
            index = group.rows
            found: dict[int, BaseException] | None = None if failures is None else {}
            try:
                got_all = self._batched(group.inputs, batch_size, found)
            except RowFailure as failure:  # its row, numbered in the whole batch
                raise RowFailure(int(index[failure.row]), failure.cause) from failure.cause
            if failures is not None and found:
                failures.update({int(index[k]): exc for k, exc in found.items()})
            for j, got in enumerate(got_all):
                out, spec = outs[j], self.signature.outputs[j]
                if out is None:
                    out = outs[j] = np.empty((n, *got.shape[1:]), dtype=got.dtype)
                if not spec.variable:
                    out[index] = got
                    continue
                for k, row in enumerate(index):  # one array per row, of its own shape
                    # (a failed row's placeholder is left as it is: the rows are left out)
                    out[row] = got[k] if group.lengths is None or (found and k in found) \
                        else trimmed(got[k], spec, group.length(j, k), group.steps)
        if not n:
            return empty_outputs(self.signature)
        return cast("list[np.ndarray]", outs)  # each filled by the first group

    def _batched(self, arrays: Sequence[np.ndarray], batch_size: int,
                 failures: dict[int, BaseException] | None = None) -> list[np.ndarray]:
        n = len(arrays[0]) if arrays else 0
        parts: list[Isolated[list[np.ndarray]] | list[np.ndarray]] = []
        for i in range(0, max(n, 1), batch_size):
            chunk = arrays if n <= batch_size else [a[i:i + batch_size] for a in arrays]
            try:
                parts.append(self._call(chunk))
            except Exception as exc:  # a row the model cannot take, perhaps: find it
                parts.append(self._isolated(arrays, i, min(i + batch_size, n), exc, failures))
        # a call's outputs are the template of the rows that failed (their zeros): of a
        # chunk whose every row failed, another chunk's (a per-step output's shape is only
        # known from a call)
        template = next((p for p in parts if not isinstance(p, Isolated)),
                        next((p.parts[0][2] for p in parts
                              if isinstance(p, Isolated) and p.parts), None))
        done = [p if not isinstance(p, Isolated) else
                _with_placeholders(p, i * batch_size, min((i + 1) * batch_size, n),
                                   template or empty_outputs(self.signature))
                for i, p in enumerate(parts)]
        return done[0] if len(done) == 1 else [np.concatenate(c) for c in zip(*done)]

    def _isolated(self, arrays: Sequence[np.ndarray], start: int, stop: int, exc: Exception,
                  failures: dict[int, BaseException] | None) -> Isolated[list[np.ndarray]]:
        """The search's parts of rows ``start`` to ``stop``, the call having raised ``exc``
        on them: the rows that raise alone recorded in ``failures``, or the first of them
        raised as a :class:`RowFailure`."""
        def call(ranges: Ranges) -> list[np.ndarray]:
            return self._call([_rows(x, ranges) for x in arrays])

        if failures is None:
            first = first_failure(call, start, stop, exc)
            if first is None:
                raise exc
            raise RowFailure(*first) from first[1]
        found = isolate(call, start, stop, exc, split=_split)
        failures.update(found.failures)
        return found


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
