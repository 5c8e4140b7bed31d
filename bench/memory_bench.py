"""Memory of N Python workers holding one large model at the same time: a private copy of
the weights per worker (``share_weights=False``) against one payload file per executor
that every worker maps (``share_weights=True``), side by side.

Each (number of workers, mode) runs in a fresh ``local[N]`` session, so its Python
workers are new and nothing an earlier model left behind is counted. A warm-up job
imports Keras and runs one op in each of the N workers. Then one barrier-mode
``mapInArrow`` task per worker, all running at once:

1. runs a Keras op and waits at a barrier, so every worker has TensorFlow mapped, then
   reads its PSS (the baseline);
2. builds the model through ``BroadcastModel.predictor`` and scores its rows with the
   code ``BroadcastModel.transform`` runs;
3. waits at a second barrier until every worker holds the model and has used it, reads
   its PSS again and reports it with its ``cache_info()`` (build seconds, where the
   weights live).

PSS (proportional set size, from ``/proc/self/smaps``) charges each page to the
processes mapping it in equal parts: a page of a shared file mapped by 4 workers counts
a quarter in each. The workers' PSS growths therefore add up to the memory the N workers
really added, a shared file counted once. Code (the interpreter and shared libraries,
TensorFlow's among them) is left out of the growth and shown apart: its pages are
shared with every process on the host that runs the same libraries, so its share moves
when unrelated processes start or stop. The predictions are checked against
``model.predict`` on the driver.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Iterator

from bench.frames import Workload, check_predictions, expected_predictions, make_frame
from bench.harness import pss_kb, touch_keras
from bench.sessions import scoring_session

COPY, SHARED = "copy per worker", "shared file"
MODES = {COPY: False, SHARED: True}  # label -> share_weights
ROWS_PER_WORKER = 40  # sample() keeps every 20th row: two checked rows per worker
# the measuring task's output: prediction rows (no worker), then one row of worker statistics
SCHEMA = "id long, prediction array<float>, worker string"
COLUMNS = ["id", "prediction", "worker"]


def mlp(inputs: int, width: int, depth: int):
    """``depth`` Dense layers of ``width`` units on ``inputs`` features, 16 outputs."""
    import keras

    hidden = [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    return keras.Sequential([keras.Input((inputs,)), *hidden, keras.layers.Dense(16)],
                            name=f"mlp_{inputs}_{depth}x{width}")


def workload(quick: bool) -> Workload:
    """The model: 336 MiB of float32 weights (1024x4096 + 5 x 4096x4096), tiny when quick;
    ``rows`` is per worker."""
    if quick:
        return Workload("MLP", lambda: mlp(32, 256, 2), (32,), ROWS_PER_WORKER, 16, ("array",))
    return Workload("MLP", lambda: mlp(1024, 4096, 6), (1024,), ROWS_PER_WORKER, 16, ("array",))


def _warm_up(spark, workers: int) -> None:
    """Start the N Python workers, each with Keras imported and one op run."""
    import pyarrow as pa

    def warm(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext

        touch_keras()
        BarrierTaskContext.get().barrier()  # all N at once: N distinct workers
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([os.getpid()])], names=["pid"])

    spark.range(workers, numPartitions=workers).mapInArrow(warm, "pid long", barrier=True).collect()


def _score_and_measure(bm, batch_size: int) -> Callable:
    """The measuring task (see the module docstring): the prediction rows, then one row
    with the worker's statistics as JSON."""
    import pyarrow as pa

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import BarrierTaskContext

        import spark_keras as sk
        from spark_keras.inference import columns, engine, outputs

        context = BarrierTaskContext.get()
        touch_keras()
        context.barrier()  # every worker has TensorFlow mapped
        before = pss_kb()
        _ = bm.predictor  # builds the model
        for batch in batches:
            features = columns.from_arrow(["features"], [batch.column("features")])
            prediction = outputs.to_arrow(engine.score(bm, features, batch_size=batch_size))
            no_worker = pa.nulls(batch.num_rows, pa.string())
            yield pa.RecordBatch.from_arrays([batch.column("id"), prediction, no_worker], names=COLUMNS)
        context.barrier()  # every worker holds the model and has used it
        after = pss_kb()
        info = sk.cache_info()
        stats = {"pid": os.getpid(), "before": before, "after": after,
                 "build_seconds": info["build_seconds"], **info["memory_by_key"][bm.key]}
        row = [pa.nulls(1, pa.int64()), pa.nulls(1, pa.list_(pa.float32())), pa.array([json.dumps(stats)])]
        yield pa.RecordBatch.from_arrays(row, names=COLUMNS)

    return task


def measure(model, work: Workload, workers: int, share_weights: bool) -> list[dict]:
    """Each worker's statistics for N = ``workers`` concurrent workers scoring ``model``,
    in a fresh local[N] session; the predictions are checked."""
    import pyarrow.compute as pc

    import spark_keras as sk

    work = dataclasses.replace(work, rows=workers * work.rows)
    spark = scoring_session(f"local[{workers}]")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = make_frame(spark, work, "array", partitions=workers)
        expected = expected_predictions(model, df, work, "array", ["features"])
        _warm_up(spark, workers)
        bm = sk.BroadcastModel(spark, model, share_weights=share_weights)
        got = df.mapInArrow(_score_and_measure(bm, work.batch_size), SCHEMA, barrier=True).toArrow()
        bm.destroy()
    finally:
        spark.stop()
    rows = got.filter(pc.is_null(got.column("worker")))
    checked = rows.filter(pc.is_in(rows.column("id"), value_set=pc.cast(expected.ids, "int64")))
    check_predictions(f"{'shared' if share_weights else 'private'} weights on {workers} workers",
                      checked.select(["id", "prediction"]), expected)
    stats = [json.loads(s) for s in got.column("worker").drop_null().to_pylist()]
    pids = {s["pid"] for s in stats}
    if len(pids) != workers:
        raise RuntimeError(f"expected {workers} Python workers holding the model at once, got pids {pids}")
    return stats


def summary(workers: int, mode: str, weights_mb: float, stats: list[dict]) -> dict:
    """One table row: the workers' PSS growths against the weights, and build seconds."""
    def growth_mb(*kinds: str) -> list[float]:
        return [sum(s["after"][k] - s["before"][k] for k in kinds) / 1024 for s in stats]

    total = growth_mb("anon", "file")
    builds = [s["build_seconds"] for s in stats]
    mapped = [s["shared_bytes"] / max(1, s["shared_bytes"] + s["private_bytes"]) for s in stats]
    return {
        "workers": workers, "mode": mode, "weights MB": weights_mb,
        "PSS growth MB per worker": " / ".join(f"{g:.0f}" for g in total),
        "sum PSS growth MB": sum(total), "x weights": sum(total) / weights_mb,
        "anon MB": sum(growth_mb("anon")), "file MB": sum(growth_mb("file")),
        "code MB (not counted)": sum(growth_mb("code")),
        "weights mapped %": 100 * min(mapped),
        "build s mean": sum(builds) / len(builds), "build s max": max(builds),
    }


def run(quick: bool = False) -> list[dict]:
    """Rows for N = 1, 2, 4 workers (1, 2 when quick), both modes side by side."""
    import keras

    work = workload(quick)
    model = work.build()
    weights_mb = sum(w.numpy().nbytes for w in model.weights) / 2**20
    rows = []
    for workers in (1, 2) if quick else (1, 2, 4):
        for mode, share_weights in MODES.items():
            stats = measure(model, work, workers, share_weights)
            rows.append(summary(workers, mode, weights_mb, stats))
    keras.backend.clear_session()
    return rows
