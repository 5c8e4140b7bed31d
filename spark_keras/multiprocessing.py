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
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from spark_keras import flavour
from spark_keras.errors import ArgumentTypeError, ModelCallError, SparkKerasError
from spark_keras.handle import ModelHandle
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import Scored, empty_outputs, model_inputs, score
from spark_keras.inference.isolation import RowFailure, reason_text
from spark_keras.inference.options import DEFAULT_BATCH_SIZE, check_batch_size, check_on_invalid
from spark_keras.inference.outputs import to_numpy
from spark_keras.inference.signature import signature_of
from spark_keras.payload import host_file
from spark_keras.payload.shipment import Shipment

logger = logging.getLogger("spark_keras")

__all__ = ["pool_predict"]


def pool_predict(model: Any, data: Any, *,
                 columns: Sequence[str] | Mapping[str, Sequence[str]] | None = None,
                 processes: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                 on_invalid: str = "error", custom_objects: Mapping[str, Any] | None = None,
                 safe_mode: bool = True, context: str | Any = "spawn",
                 share_weights: bool = True, preprocess: Any = None) -> Any:
    """Predict ``data`` with ``model`` in a pool of worker processes.

    The inputs are read and checked here, by the engine every front-end uses (the same
    input kinds, errors and ``on_invalid`` rule as Spark and Dask). The pool's
    initializer receives the model's payload once per process; tasks (chunks of at most
    ``batch_size`` valid rows) rebuild it through the per-process model cache, so a
    process builds it once, and call the compiled predictor. Results equal ``model(x)``.

    Args:
        model: a built Keras model (Sequential, Functional or subclassed).
        data: numpy arrays (one for a single-input model, a list in input order or a dict
            keyed by input name; rows along axis 0), or a pandas DataFrame or Arrow Table
            (scalar, array, ML Vector or struct columns, as for Spark).
        columns: DataFrame/Table only: the columns to use (default: all), or a dict mapping
            each model input name to its columns.
        processes: pool size; default: CPU count, but no more processes than chunks.
        batch_size: rows per task (and per compiled call).
        on_invalid: ``"error"`` (default) raises :class:`ModelInputError` on a null,
            NaN/inf or wrongly shaped row, naming the column and row; ``"null"`` scores
            the other rows and gives such rows NaN outputs (non-float outputs become floats).
        custom_objects: custom classes/functions the model needs beyond those found in
            it; both are shipped (cloudpickle), so ``__main__`` classes work.
        safe_mode: Keras ``safe_mode`` when rebuilding in the workers.
        share_weights: (Keras 3 with TensorFlow) the parent writes the payload to a
            temporary file once and every process builds on weights mapped from it,
            one copy in memory for the whole pool; ``False``: a copy per process.
        context: a start method name or a ``multiprocessing`` context. ``"spawn"``
            (default) is safe with TensorFlow; as with any spawn pool, a script must
            create it under ``if __name__ == "__main__":``.
        preprocess: a function run in the pool's processes on each chunk (a pandas
            DataFrame of ``data``'s columns) before the model; see
            :class:`~spark_keras.BroadcastModel`. ``data`` must then be a DataFrame or
            an Arrow table.

    Returns:
        One numpy array for a single-output model, else a dict keyed by output name.

    Raises:
        ModelInputError: ``data`` does not match the model's inputs.
        PayloadError: the model cannot be serialized, or rebuilt in a worker (raised
            here, from the failing task).
    """
    check_on_invalid(on_invalid)
    batch_size = check_batch_size(batch_size)
    signature = signature_of(model)
    handle = PoolModel(model, preprocess=preprocess)
    names: list[str] = []
    if handle.preprocess is None:
        inputs, invalid = model_inputs(cols.from_data(data, columns, signature), signature,
                                       on_invalid, where="input")
    else:  # the raw columns go to the pool, whose processes run preprocess first
        if not (hasattr(data, "column_names") or hasattr(data, "iloc")):
            raise ArgumentTypeError("pool_predict(preprocess=...) takes a pandas DataFrame or "
                                    f"an Arrow table, not {type(data).__name__}")
        raw = cols.from_frame(data, columns, None)
        assert not isinstance(raw, Mapping)  # without a signature: one list of columns
        names, inputs, invalid = [c.name for c in raw], [c.array for c in raw], None
    n = len(inputs[0])
    if n == 0:
        return to_numpy(Scored(signature, empty_outputs(signature), invalid))
    processes = processes or os.cpu_count() or 1
    rows = max(1, min(batch_size, -(-n // processes)))
    chunks = [[a[i:i + rows] for a in inputs] for i in range(0, n, rows)]
    shipment = Shipment.of(model, custom_objects=custom_objects, safe_mode=safe_mode)
    ctx = multiprocessing.get_context(context) if isinstance(context, str) else context
    logger.info("pool_predict %s: %d rows in %d tasks, %d processes", handle.key, n,
                len(chunks), min(processes, len(chunks)))
    with contextlib.ExitStack() as stack:
        if share_weights and flavour.current().shares_weights:
            # the parent writes the payload file once; every child maps it
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="spark_keras_pool_"))
            host_file.land(folder, handle.key, len(shipment.payload), lambda: shipment.payload)
            received = _Received(shipment.without_payload(), len(shipment.payload), folder)
        else:
            received = _Received(shipment, len(shipment.payload), None)
        pool = stack.enter_context(ctx.Pool(min(processes, len(chunks)), initializer=_receive,
                                            initargs=(handle.key, received)))
        tasks = [(handle.worker_copy(), chunk, batch_size, on_invalid, i * rows, names)
                 for i, chunk in enumerate(chunks)]
        parts = pool.map(_predict_chunk, tasks, chunksize=1)
    positions = np.arange(n) if invalid is None else np.flatnonzero(~invalid)  # of inputs
    for part in parts:
        if part[0] is None:  # (None, input row, why): the model raised on that row alone
            inputs_text = ", ".join(repr(s.name) for s in signature.inputs)
            raise ModelCallError(f"the model raised on row {int(positions[part[1]])} of this "
                                 f"input (model input(s) {inputs_text}): {part[2]}")
    # each part: its outputs and its rows left out (invalid, or the model raised on them)
    masks = [bad if bad is not None else np.zeros(len(c[0]), bool)
             for (_, bad), c in zip(parts, chunks)]
    left_out = np.concatenate(masks)
    if handle.preprocess is not None:  # the engine left those rows out of the outputs
        outs = [out for out, _ in parts]
        invalid = left_out if left_out.any() else None
    else:  # outputs for every row of a chunk: drop the rows the model raised on
        outs = [[o[~bad] for o in out] if bad.any() else out for (out, _), bad in zip(parts, masks)]
        if left_out.any():
            invalid = np.zeros(n, dtype=bool) if invalid is None else invalid.copy()
            invalid[positions[left_out]] = True
    outputs = [np.concatenate(p) for p in zip(*outs)]
    return to_numpy(Scored(signature, outputs, invalid))


class PoolModel(ModelHandle):
    """The pool's model: the original in the parent; in a pool process, the model built
    once from what the initializer received (see :func:`pool_predict`)."""

    def __init__(self, model: Any = None, key: str | None = None, nbytes: int = 0,
                 preprocess: Any = None) -> None:
        super().__init__(key or self.new_key(model, "pool-"), nbytes, model=model,
                         preprocess=preprocess)

    def worker_copy(self) -> "PoolModel":
        """What a task carries: the key (and the preprocess function, by value)."""
        return PoolModel(key=self._key, preprocess=self._preprocess)

    def build_model(self) -> tuple:
        received = _received.get(self._key)
        if received is None:
            raise SparkKerasError(f"pool model {self._key} was not received by process "
                                  f"{os.getpid()}: use it through pool_predict")
        return received.build(self._key)


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


def _predict_chunk(task: tuple[PoolModel, list[Any], int, str, int, list[str]]) -> Any:
    """The outputs for one chunk of model inputs; with a preprocess function, the chunk
    holds raw columns and the result is ``(outputs of the valid rows, invalid mask)``."""
    handle, arrays, batch_size, on_invalid, first_row, names = task
    if handle.preprocess is None:  # model inputs: rows the model raises on, isolated
        found: dict[int, BaseException] | None = {} if on_invalid == "null" else None
        try:
            outputs = handle.predictor(arrays, batch_size, found)
        except RowFailure as failure:  # the parent names the row (a text: TF errors
            return None, first_row + failure.row, reason_text(failure.cause)  # don't pickle)
        failed = np.zeros(len(arrays[0]), dtype=bool)
        failed[list(found or ())] = True
        return outputs, failed
    scored = score(handle, cols.from_arrow(names, arrays), batch_size=batch_size,
                   on_invalid=on_invalid, where="input", first_row=first_row)
    return scored.outputs, scored.invalid
