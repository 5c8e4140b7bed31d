"""One compiled call per shape of the inputs' rows, for the models that compute wrongly
when traced with their rows' dimensions unknown (:func:`needs_known_steps`: a Keras 3
``TimeDistributed``); :class:`~.predictor.Predictor` uses it in place of its single call."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import replace
from typing import Any, Callable, Sequence

import numpy as np

from spark_keras import flavour
from spark_keras.flavour import CompiledCall
from spark_keras.inference.specs import TensorSpec

SHAPED_CALLS = 32  # the most calls :class:`ShapedCalls` keeps compiled (the least used go)


class ShapedCalls:
    """A compiled call per shape of the inputs' rows (the batch dimension left unknown):
    for a model that computes wrongly when traced with its rows' other dimensions unknown
    (:func:`needs_known_steps`). At most :data:`SHAPED_CALLS` are kept, the least recently
    used dropped (traced again if needed: the same shape, the same computation)."""

    def __init__(self, compile_for: Callable[[Sequence[TensorSpec]], CompiledCall],
                 specs: Sequence[TensorSpec]) -> None:
        self._compile_for, self._specs = compile_for, tuple(specs)
        self._calls: OrderedDict[tuple, CompiledCall] = OrderedDict()
        self._lock = threading.Lock()
        self._dropped = 0  # traces of the calls dropped

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        key = tuple(tuple(a.shape[1:]) for a in arrays)
        with self._lock:
            call = self._calls.get(key)
            if call is None:
                call = self._calls[key] = self._compile_for(
                    [replace(s, shape=shape) for s, shape in zip(self._specs, key)])
                if len(self._calls) > SHAPED_CALLS:
                    self._dropped += getattr(self._calls.popitem(last=False)[1], "traces", 0)
            self._calls.move_to_end(key)
        return call(arrays)

    @property
    def traces(self) -> int | None:
        """How many concrete functions were traced, over all shapes (None: called eagerly)."""
        counts = [getattr(c, "traces", None) for c in self._calls.values()]
        if all(c is None for c in counts):
            return None if not self._dropped else self._dropped
        return self._dropped + sum(c or 0 for c in counts)


def needs_known_steps(model: Any) -> bool:
    """Whether ``model`` holds a Keras 3 ``TimeDistributed`` layer: traced with its steps
    unknown, it loops over the batch's rows in their place (``ops.arange`` of the batch
    size, Keras 3.15), giving wrong outputs or raising unless the batch is as long as the
    rows (``model(x)`` on a batch, its shape known, is right)."""
    rt = flavour.current()
    if rt.legacy:
        return False
    time_distributed = rt.module.layers.TimeDistributed
    flatten = getattr(model, "_flatten_layers", None)
    layers = flatten(include_self=False, recursive=True) if flatten else []
    return any(isinstance(layer, time_distributed) for layer in layers)
