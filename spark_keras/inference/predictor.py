"""Calling a model fast: ``model(x, training=False)`` compiled once per model.

``model.predict`` pays a per-call setup cost (data adapters, callbacks, a fresh step
function); calling a ``tf.function`` traced once with a batch dimension of ``None`` does
not, and does not retrace for the last, shorter batch.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np

from .. import flavour
from .signature import Signature, signature_of

DEFAULT_BATCH_SIZE = 1024
_ATTR = "_spark_keras_predictor"
_lock = threading.Lock()


class Predictor:
    """A model's compiled inference function, with its input/output signature."""

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

        def call(*xs: Any) -> list[Any]:
            return self._flat_outputs(model(sig.pack_inputs(list(xs)), training=False))

        return flavour.current().compile_call(call, sig.inputs)

    def __call__(self, arrays: Sequence[np.ndarray],
                 batch_size: int = DEFAULT_BATCH_SIZE) -> list[np.ndarray]:
        """Outputs (flattened, in signature order) for inputs of any length, in batches."""
        n = len(arrays[0]) if arrays else 0
        if n <= batch_size:
            return self._call(arrays)
        parts = [self._call([a[i:i + batch_size] for a in arrays]) for i in range(0, n, batch_size)]
        return [np.concatenate(chunks) for chunks in zip(*parts)]


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
