"""`python -m bench.peers_text [--quick] [--repeats N]` (run by `make bench-peers` after
:mod:`bench.peers_bench`): a text model on a Parquet file of short strings, scored by
spark-keras, Ray Data and Daft side by side, against the model alone.

:data:`ROWS` short random sentences (3 to 12 words, :func:`bench.inputs_bench.sentences`)
in one Parquet file of ``id`` and ``text`` (row groups of :data:`ROW_GROUP` rows), the text
model of the library's benchmarks (:func:`bench.models.text_model`: ``Input((),
dtype="string")`` -> ``TextVectorization`` -> ``Embedding`` -> pooling -> ``Dense``) saved
once as a ``.keras`` file that every mode loads, calls of :data:`BATCH_SIZE` rows, one
TensorFlow thread per process and two processes (or instances) holding the model:

* the model alone: :class:`bench.images_bench.Alone`, two spawned processes each scoring
  its half of the strings, held as a numpy array of ``str`` (the ceiling: no reading);
* spark-keras on local[2]: ``spark.read.parquet`` + ``BroadcastModel.transform`` on the
  ``text`` column into the ``noop`` sink, each run reading the file afresh;
* Ray Data (``read_parquet`` + ``map_batches``, an actor pool of 2 actors of
  ``num_cpus=0.5``) and Daft (``read_parquet`` + a ``@daft.cls`` batch method, 2 instances):
  :mod:`bench.peer_ray`, :mod:`bench.peer_daft`, each in a process of its own.

The rounds, the checks (every row scored once, its prediction the model alone's), the
medians and ratios: as :mod:`bench.peers_bench`. Each spark-keras run follows a warm-up on
:data:`WARM_ROWS` rows in two files, one task each (Spark stops Python workers idle for a minute).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np

from bench.peers_bench import Stage, check, main, rows, start_peers, take_turns

ROWS = 200_000
ROW_GROUP = 25_000
WARM_ROWS = 4_096
BATCH_SIZE = 1_024
ALONE = "the model alone on numpy arrays of str (2 processes)"
SPARK = "spark-keras: spark.read.parquet + transform"
RAY = "Ray Data: read_parquet + map_batches, actor pool of 2"
DAFT = "Daft: read_parquet + @daft.cls batch method, 2 instances"
PEERS = (RAY, DAFT)


def strings_at(strings: list[str], first: int, count: int) -> np.ndarray:
    """Strings ``first`` to ``first + count`` as a numpy array of ``str``: the model alone's
    input (:class:`bench.images_bench.Alone`'s ``prepare``)."""
    return np.asarray(strings[first:first + count], dtype=object)


def write_parquet(path: str, strings: list[str]) -> None:
    """``id`` and ``text`` columns, row groups of :data:`ROW_GROUP` rows (Spark splits the
    file between its two cores by row group; Ray and Daft read it as they choose)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": np.arange(len(strings), dtype=np.int64), "text": strings}), path,
                   row_group_size=ROW_GROUP)


def spark_mode(spark, model_path: str, source: str, warm_source: str) -> tuple[dict, dict, Callable]:
    """The spark-keras mode: its timed run, its warm-up run, and a run collecting (row ids,
    predictions) for the check."""
    import keras

    import spark_keras as sk
    from bench.images_bench import _noop

    bm = sk.BroadcastModel(spark, keras.saving.load_model(model_path))

    def scored(path: str) -> Any:
        return bm.transform(spark.read.parquet(path), "text", batch_size=BATCH_SIZE)

    def collect() -> tuple[list[str], np.ndarray]:
        got = scored(source).select("id", "prediction").toArrow()
        return ([str(n) for n in got.column("id").to_pylist()],
                np.stack(got.column("prediction").to_numpy(zero_copy_only=False)))

    return {SPARK: lambda: _noop(scored(source))}, {SPARK: lambda: _noop(scored(warm_source))}, collect


def run(quick: bool = False, repeats: int | None = None, n: int | None = None) -> tuple[list[dict], str]:
    """One row per mode (see the module's docstring), and a line of versions and load;
    ``n`` rows (:data:`ROWS` by default)."""
    from bench.images_bench import Alone
    from bench.inputs_bench import batched, compiled, sentences
    from bench.models import text_model
    from bench.sessions import local_session

    n = n or (20_000 if quick else ROWS)
    rounds = 1 if quick else (repeats or 3)
    strings = sentences(n)
    model = text_model()
    expected = dict(zip(map(str, range(n)), batched(compiled(model), strings_at(strings, 0, n), BATCH_SIZE)))
    with Stage.made("peers-text-") as stage:
        source, warm_source = os.path.join(stage.work, "text.parquet"), os.path.join(stage.work, "warm")
        write_parquet(source, strings)
        os.makedirs(warm_source)  # two files: two tasks, so that both Python workers warm up
        half = WARM_ROWS // 2
        for k in range(2):
            write_parquet(os.path.join(warm_source, f"{k}.parquet"), strings[k * half:(k + 1) * half])
        model_path = os.path.join(stage.work, "model.keras")
        model.save(model_path)
        start_peers(stage, {RAY: "bench.peer_ray", DAFT: "bench.peer_daft"}, source, model_path, expected, BATCH_SIZE)
        stage.spark = local_session("peers-text", driver_memory="4g")
        timed, warm, collect = spark_mode(stage.spark, model_path, source, warm_source)
        check(SPARK, *collect(), expected)
        stage.alone = Alone(model_path, strings, n, BATCH_SIZE, prepare=strings_at)
        times, cpu = take_turns({ALONE: stage.alone.run, **timed, **{m: p.run for m, p in stage.peers.items()}},
                                warm, rounds)
    return rows(times, cpu, n, stage.versions, stage.load, alone=ALONE, peers=PEERS, unit="rows", cpu_unit=("µs", 1e6))


if __name__ == "__main__":
    sys.exit(main(section=run, prog="python -m bench.peers_text", doc=__doc__,
                  title=lambda found: f"{found[0]['rows']:,} short strings in a Parquet file, TextVectorization "
                                      f"+ Embedding + Dense, calls of {BATCH_SIZE}, {os.cpu_count()} cores"))
