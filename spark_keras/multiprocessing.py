"""Keras models in ``multiprocessing`` workers: ``Process(args=...)`` and a scoring ``Pool``.

* ``Process(target=f, args=(model, ...))`` under ``spawn`` (or ``forkserver``) works once
  the model is made picklable: ``spark_keras.make_picklable(model)``. The child receives
  the payload and the model's custom classes (by value when they live in ``__main__``).
* :func:`pool_predict` scores arrays in a process pool whose initializer receives the
  payload once per process; every task then uses that process's cached model.

Models travel as a :class:`~spark_keras.payload.shipment.Shipment`, as they do to Spark
executors and Dask workers.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .cache import model_cache
from .errors import ModelInputError
from .inference.predictor import DEFAULT_BATCH_SIZE, predictor_for
from .inference.signature import Signature, model_outputs, signature_of
from .payload import host_file, mapped
from .payload.shipment import Shipment

logger = logging.getLogger("spark_keras")

__all__ = ["pool_predict"]


def pool_predict(model: Any, arrays: Any, *, processes: int | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE,
                 custom_objects: Mapping[str, Any] | None = None, safe_mode: bool = True,
                 context: str | Any = "spawn", share_weights: bool = True) -> Any:
    """Predict ``arrays`` with ``model`` in a pool of worker processes.

    The pool's initializer receives the model's payload once per process; tasks (chunks
    of at most ``batch_size`` rows) rebuild it through the per-process model cache, so a
    process builds it once, and call the compiled predictor
    (:func:`spark_keras.inference.predictor_for`). Results equal ``model(x)``.

    Args:
        model: a built Keras model (Sequential, Functional or subclassed).
        arrays: the model's inputs: one array (single-input models), a list of arrays
            in input order, or a dict keyed by input name.
        processes: pool size; default: CPU count, but no more processes than chunks.
        batch_size: rows per task (and per compiled call).
        custom_objects: custom classes/functions the model needs beyond those found in
            it; both are shipped (cloudpickle), so ``__main__`` classes work.
        safe_mode: Keras ``safe_mode`` when rebuilding in the workers.
        share_weights: (Keras 3 with TensorFlow) the parent writes the payload to a
            temporary file once and every process builds on weights mapped from it,
            one copy in memory for the whole pool; ``False``: a copy per process.
        context: a start method name or a ``multiprocessing`` context. ``"spawn"``
            (default) is safe with TensorFlow; as with any spawn pool, a script must
            create it under ``if __name__ == "__main__":``.

    Returns:
        One numpy array for a single-output model, else a dict keyed by output name.

    Raises:
        ModelInputError: ``arrays`` do not match the model's inputs.
        PayloadError: the model cannot be serialized, or rebuilt in a worker (raised
            here, from the failing task).
    """
    signature = signature_of(model)
    inputs = _input_list(arrays, signature)
    n = len(inputs[0])
    if n == 0:
        return model_outputs([np.zeros((0, *s.shape), s.dtype) for s in signature.outputs],
                             signature)
    processes = processes or os.cpu_count() or 1
    rows = max(1, min(int(batch_size), -(-n // processes)))
    chunks = [[a[i:i + rows] for a in inputs] for i in range(0, n, rows)]
    key = f"{type(model).__name__}-{uuid.uuid4().hex[:12]}"
    shipment = Shipment.of(model, custom_objects=custom_objects, safe_mode=safe_mode)
    ctx = multiprocessing.get_context(context) if isinstance(context, str) else context
    logger.info("pool_predict %s: %d rows in %d tasks, %d processes", key, n, len(chunks),
                min(processes, len(chunks)))
    with contextlib.ExitStack() as stack:
        if share_weights and mapped.supported():
            # the parent writes the payload file once; every child maps it
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="spark_keras_pool_"))
            host_file.land(folder, key, len(shipment.payload), lambda: shipment.payload)
            received = _Received(shipment.without_payload(), len(shipment.payload), folder)
        else:
            received = _Received(shipment, len(shipment.payload), None)
        pool = stack.enter_context(ctx.Pool(min(processes, len(chunks)), initializer=_receive,
                                            initargs=(key, received)))
        parts = pool.map(_predict_chunk, [(key, chunk, int(batch_size)) for chunk in chunks],
                         chunksize=1)
    return model_outputs([np.concatenate(p) for p in zip(*parts)], signature)


def _input_list(arrays: Any, signature: Signature) -> list[np.ndarray]:
    specs = signature.inputs
    if isinstance(arrays, Mapping):
        missing = [s.name for s in specs if s.name not in arrays]
        if missing:
            raise ModelInputError(f"inputs {missing} missing; the model has inputs "
                                  f"{[s.name for s in specs]}")
        arrays = [arrays[s.name] for s in specs]
    elif not isinstance(arrays, (list, tuple)):
        arrays = [arrays]
    if len(arrays) != len(specs):
        raise ModelInputError(f"got {len(arrays)} input arrays; the model has inputs "
                              f"{[s.name for s in specs]}")
    out = [np.asarray(a, dtype=s.dtype) for a, s in zip(arrays, specs)]
    for a, s in zip(out, specs):
        if a.shape[1:] != s.shape or len(a) != len(out[0]):
            raise ModelInputError(f"input {s.name!r} has shape {a.shape}; expected "
                                  f"{len(out[0])} rows of {s.describe()}")
    return out


# --- in the pool's processes ----------------------------------------------------------

@dataclass(frozen=True)
class _Received:
    """What a pool process gets once: the shipment (without its payload when the
    payload waits in ``folder``, the pool's shared file)."""

    shipment: Shipment
    nbytes: int
    folder: str | None

    def build(self, key: str) -> tuple:
        if self.folder is None:
            return self.shipment.build()
        return self.shipment.build_shared(self.folder, key, self.nbytes)


_received: dict[str, _Received] = {}


def _receive(key: str, received: _Received) -> None:
    # Only store it: a failing initializer would make the pool respawn workers forever,
    # a failing task raises in the caller.
    _received[key] = received


def _predict_chunk(task: tuple[str, list[np.ndarray], int]) -> list[np.ndarray]:
    key, arrays, batch_size = task
    model = model_cache.get_or_build(key, lambda: _received[key].build(key)).value
    return predictor_for(model)(arrays, batch_size)
