"""`python -m bench.call_cost [ROWS ...]`: a model call's fixed cost, the engine's call
against the same call through the ``tf.function``.

The 64-256-256-1 MLP of the scoring section, one :class:`~spark_keras.inference.predictor.
Predictor`; per call of ROWS rows (64, 500 and 1,024 by default): its compiled call as the
engine makes it (``flavour.TracedCall``: the traced concrete function called directly) and
the call as it was made before (``TracedCall.function``, the ``tf.function``: arguments
bound to its signature, its trace cache looked up, every call), interleaved over 15
rounds of 200 calls, best of the rounds: the calling thread's CPU (what other processes
on a shared machine move least), the process's CPU (TensorFlow's own threads too) and
wall time, in microseconds. No Spark.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROUNDS = 15
CALLS = 200


def _per_call(fn) -> tuple[float, float, float]:
    thread, process, wall = time.thread_time(), time.process_time(), time.perf_counter()
    for _ in range(CALLS):
        fn()
    return ((time.thread_time() - thread) / CALLS * 1e6,
            (time.process_time() - process) / CALLS * 1e6,
            (time.perf_counter() - wall) / CALLS * 1e6)


def run(sizes: tuple[int, ...] = (64, 500, 1024)) -> list[dict]:
    """One row per call size and way of calling: microseconds per call, best of rounds."""
    import numpy as np

    from bench.models import mlp_model
    from spark_keras.inference.predictor import Predictor

    call = Predictor(mlp_model())._call
    out = []
    for rows in sizes:
        x = np.random.default_rng(0).random((rows, 64), dtype=np.float32)
        ways = {"engine (concrete function)": lambda: call([x]),
                "through the tf.function": lambda: [t.numpy() for t in call.function(x)]}
        for way in ways.values():
            way()
        best = {name: [float("inf")] * 3 for name in ways}
        for _ in range(ROUNDS):
            for name, way in ways.items():
                best[name] = [min(a, b) for a, b in zip(best[name], _per_call(way))]
        out += [{"rows": rows, "call": name, "thread CPU us": t, "process CPU us": p,
                 "wall us": w} for name, (t, p, w) in best.items()]
    assert call.traces == 1  # every size: one trace
    return out


def main(argv: list[str] | None = None) -> int:
    from bench.report import table

    sizes = tuple(int(a) for a in (sys.argv[1:] if argv is None else argv)) or (64, 500, 1024)
    print(table(run(sizes), floatfmt="{:,.1f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
