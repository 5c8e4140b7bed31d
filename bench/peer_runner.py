"""The loop a peer system's process runs for :mod:`bench.peers_bench` (Ray Data in this
venv, Daft in its own: this module imports nothing but the standard library and numpy).

The process is started as ``python -m bench.peer_<system> SOURCE MODEL OUT`` (SOURCE: a
folder of PNG files, or a ``.parquet`` file of ``id`` and ``text`` columns, :func:`is_text`:
:mod:`bench.peers_text`); it sets one TensorFlow thread per process, builds what it needs,
then reads commands on stdin, one a line: ``warm`` (a run whose predictions go to ``OUT``, an ``.npz`` of ``names`` and
``predictions``, for the bench to check), ``go`` (a timed run) or ``stop``. It answers each
with a JSON line: ``{"seconds": ..., "rows": ...}``, and first ``{"version": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

import numpy as np

THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
os.environ.update(THREADS)

BATCH_SIZE = 64
ACTORS = 2  # model instances: one per core

# a run: file names (base names) and their predictions, in any order
Run = Callable[[], "tuple[list[str], np.ndarray]"]


def is_text(source: str) -> bool:
    """A text run (a Parquet file of ``id`` and ``text``), not a folder of PNG files."""
    return source.endswith(".parquet")


def compiled(model_path: str) -> Callable[[np.ndarray], np.ndarray]:
    """The saved model as one compiled ``model(x, training=False)`` returning numpy, for
    images (cast to float32) or strings (a ``tf.string`` input: ``str`` values); TensorFlow's
    pools at one thread (:data:`THREADS`, set before TensorFlow loads)."""
    import keras
    import tensorflow as tf

    model = keras.saving.load_model(model_path)
    shape = model.inputs[0].shape
    call = tf.function(lambda x: model(x, training=False), autograph=False,
                       input_signature=[tf.TensorSpec((None, *shape[1:]), model.inputs[0].dtype)])
    dtype = object if model.inputs[0].dtype == "string" else np.float32
    return lambda x: call(np.asarray(x, dtype)).numpy()


def serve(version: str, run: Run, out: str) -> None:
    """Answer the bench's commands on stdin (see the module's docstring)."""
    reply = sys.stdout
    sys.stdout = sys.stderr  # the systems' own prints must not mix with the answers
    reply.write(json.dumps({"version": version}) + "\n")
    reply.flush()
    for line in sys.stdin:
        command = line.strip()
        if command == "stop":
            break
        started = time.perf_counter()
        names, predictions = run()
        seconds = time.perf_counter() - started
        if command == "warm":
            np.savez(out, names=np.asarray(names), predictions=np.asarray(predictions, np.float32))
        reply.write(json.dumps({"seconds": seconds, "rows": len(names)}) + "\n")
        reply.flush()
