"""`python -m bench.images_bench [--quick]`: a heavy CNN on images, against the model alone.

MobileNetV2 (224 x 224, random weights, :func:`bench.models.mobilenet_model`) on local[2],
batch :data:`BATCH_SIZE`, into the ``noop`` sink, on the same rows three ways:

* ``model alone``: one process per core (2, spawned), each with one TensorFlow intra-op
  and one inter-op thread (what spark_keras gives a Spark task of one CPU, and what
  ``local[2]``'s two Python workers run with), scoring its half of the rows as already
  decoded float32 arrays in calls of :data:`BATCH_SIZE` rows (the compiled
  ``model(x, training=False)``); rows/s is all the rows over the wall time from the
  start signal to the last process done;
* ``transform, Spark image rows``: ``BroadcastModel.transform`` on a cached column of
  ``spark.read.format("image")`` rows (224 x 224 PNGs, decoded by the JVM when cached;
  the engine turns BGR bytes into RGB float32 arrays);
* ``transform, PNG bytes``: the same model behind a PNG decoder in its graph
  (:func:`bench.models.png_mobilenet_model`) on a cached binary column of the PNG files.

Rows are :data:`DISTINCT` distinct photo-like PNGs, repeated (row ``id`` holds image
``id % DISTINCT``), in :data:`PARTITIONS` partitions. Each mode is warmed up first (the
transforms' predictions on 5% of the rows checked against the model alone on the same
images), then the modes alternate for the rounds, each transform's timed run after a
warm-up on 5% of its rows (Spark stops Python workers idle for a minute, as they are while
the model alone runs): the median rows/s of each, the median over the rounds of each
transform run against the same round's model-alone run, and the CPU seconds per row of
the Python processes and of the driver's JVM.
Target: each transform >= :data:`TARGET` x the model alone.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SIZE = 224
BATCH_SIZE = 64
DISTINCT = 64  # distinct images; rows repeat them
PARTITIONS = 4
TARGET = 0.9
# the predictions check's tolerance, of the largest prediction (measured: 1e-6 between call
# sizes; the logits of two images differ by ~0.1 of it)
CHECK_TOLERANCE = 1e-3
ALONE, ROWS, PNG = ("model alone (2 processes, decoded float32 arrays)",
                    "transform, Spark image rows", "transform, PNG bytes")
MODES = (ALONE, ROWS, PNG)


@dataclass
class Sizes:
    rows: int
    rounds: int


def sizes(quick: bool) -> Sizes:
    return Sizes(64, 1) if quick else Sizes(1_000, 3)


# --- the model alone: one process per core --------------------------------------------------

def decoded_pngs(pngs: list[bytes], first: int, rows: int) -> np.ndarray:
    """Rows ``first`` to ``first + rows`` (image ``id % len(pngs)``) decoded into float32
    arrays: the model alone's input (:class:`Alone`'s default ``prepare``)."""
    import tensorflow as tf

    decoded = [tf.io.decode_png(p, channels=3).numpy().astype(np.float32) for p in pngs]
    return np.stack([decoded[i % len(pngs)] for i in range(first, first + rows)])


def _alone_worker(conn: Any, model_path: str, data: Any, first: int, rows: int,
                  batch_size: int, prepare: Callable[[Any, int, int], Any]) -> None:
    """A process scoring rows ``first`` to ``first + rows`` of ``prepare(data, first, rows)``
    once per ``"go"`` received; sends the seconds each run took (``"ready"`` first, after
    the warm-up call)."""
    os.environ.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1", OMP_NUM_THREADS="1")
    import keras

    from bench.inputs_bench import compiled

    model = keras.saving.load_model(model_path)
    x = prepare(data, first, rows)
    call = compiled(model)
    call(x[:batch_size])
    conn.send("ready")
    while conn.recv() == "go":
        started = time.perf_counter()
        for i in range(0, rows, batch_size):
            call(x[i:i + batch_size])
        conn.send(time.perf_counter() - started)


class Alone:
    """Two processes holding the model and their half of the rows, run together: the rows
    are ``prepare(data, first, rows)`` (a module-level function: the processes are spawned;
    by default the PNG files ``data`` decoded, :func:`decoded_pngs`)."""

    def __init__(self, model_path: str, pngs: Any, rows: int, batch_size: int,
                 prepare: Callable[[Any, int, int], Any] = decoded_pngs) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        half = rows // 2
        for first, count in ((0, half), (half, rows - half)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_alone_worker, args=(child, model_path, pngs, first, count, batch_size, prepare),
                               daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)
        for conn in self.conns:
            assert conn.recv() == "ready"

    def run(self) -> float:
        """Wall seconds from the start signal to both processes done."""
        started = time.perf_counter()
        for conn in self.conns:
            conn.send("go")
        for conn in self.conns:
            conn.recv()
        return time.perf_counter() - started

    def close(self) -> None:
        for conn in self.conns:
            conn.send("stop")
        for proc in self.procs:
            proc.join(30)


# --- the Spark frames ----------------------------------------------------------------------

def _frames(spark, pngs: list[bytes], rows: int, folder: str) -> tuple[Any, Any]:
    """Cached frames of ``id`` and ``image`` (Spark image rows of the PNG files) and of
    ``id`` and ``png`` (their bytes), row ``id`` holding image ``id % len(pngs)``."""
    from pyspark.sql import functions as F

    for k, png in enumerate(pngs):
        with open(os.path.join(folder, f"{k:04d}.png"), "wb") as f:
            f.write(png)
    images = (spark.read.format("image").load(folder)
              .select(F.regexp_extract("image.origin", r"(\d+)\.png$", 1).cast("long").alias("k"), "image"))
    files = spark.createDataFrame([(k, p) for k, p in enumerate(pngs)], "k long, png binary")
    base = spark.range(rows, numPartitions=PARTITIONS).withColumn("k", F.col("id") % len(pngs))
    out = []
    for table in (images, files):
        df = base.join(F.broadcast(table), "k").drop("k").repartition(PARTITIONS).cache()
        df.count()
        out.append(df)
    return out[0], out[1]


def _check(bm, df, column: str, expected: np.ndarray, name: str) -> None:
    """The transform's predictions on every 20th row are the model alone's on the same
    image, within :data:`CHECK_TOLERANCE` of the largest (other call sizes round
    differently). Relative: the random-weight logits are about 1e-11, so an absolute
    tolerance of 1e-3 passed predictions of all zeros or of another image."""
    from bench.harness import sample

    got = bm.transform(sample(df), column, batch_size=BATCH_SIZE).select("id", "prediction").toArrow()
    ids = got.column("id").to_numpy()
    values = np.stack(got.column("prediction").to_numpy(zero_copy_only=False))
    want = expected[ids % len(expected)]
    assert len(ids) == len(sample_ids(df)), (name, len(ids))
    worst, scale = float(np.abs(values - want).max()), float(np.abs(want).max())
    if not worst <= CHECK_TOLERANCE * scale:
        raise AssertionError(f"{name}: predictions differ from the model alone's (max |diff| "
                             f"{worst}, the largest prediction {scale})")


def sample_ids(df) -> list[int]:
    from bench.harness import sample

    return [r.id for r in sample(df).select("id").collect()]


def _noop(df) -> float:
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _jvm_pids() -> list[int]:
    """This driver's JVM (its child ``java`` process)."""
    me, found = str(os.getpid()), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                java = b"java" in f.read().split(b"\0")[0]
        except OSError:
            continue
        if java and stat.rsplit(")", 1)[1].split()[1] == me:
            found.append(int(pid))
    return found


def measured(run: Any, python: Any) -> tuple[float, float, float]:
    """Wall seconds of ``run()``, and the CPU seconds the Python processes (``python()``:
    their pids, read before the run) and this driver's JVM used during it."""
    pids, jvm = python(), _jvm_pids()
    before = {pid: cpu_seconds(pid) for pid in [*pids, *jvm]}
    wall = run()
    used = {pid: cpu_seconds(pid) - before[pid] for pid in before}
    return wall, sum(used[p] for p in pids), sum(used[p] for p in jvm)


def run(quick: bool = False, repeats: int | None = None) -> list[dict]:
    """One row per mode: median rows/s, and the transforms' median per-round ratio to the
    model alone; the load average before and after."""
    import keras
    import tensorflow as tf

    import spark_keras as sk
    from bench.harness import sample
    from bench.inputs_bench import pngs as make_pngs
    from bench.models import mobilenet_model, png_mobilenet_model
    from bench.sessions import local_session

    size = sizes(quick)
    rounds = repeats or size.rounds
    pngs = make_pngs(DISTINCT, size=SIZE, distinct=DISTINCT)
    model = mobilenet_model(SIZE)
    png_model = png_mobilenet_model(model)
    decoded = np.stack([tf.io.decode_png(p, channels=3).numpy() for p in pngs]).astype(np.float32)
    expected = model.predict(decoded, batch_size=BATCH_SIZE, verbose=0)
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="images-bench-") as work:
        model_path = os.path.join(work, "model.keras")
        model.save(model_path)
        folder = os.path.join(work, "pngs")
        os.makedirs(folder)
        spark = local_session("images-bench", driver_memory="4g")
        alone = None
        try:
            image_rows, png_bytes = _frames(spark, pngs, size.rows, folder)
            bm, bm_png = sk.BroadcastModel(spark, model), sk.BroadcastModel(spark, png_model)
            _check(bm, image_rows, "image", expected, ROWS)
            _check(bm_png, png_bytes, "png", expected, PNG)
            alone = Alone(model_path, pngs, size.rows, BATCH_SIZE)
            runs = {ALONE: alone.run,
                    ROWS: lambda: _noop(bm.transform(image_rows, "image", batch_size=BATCH_SIZE)),
                    PNG: lambda: _noop(bm_png.transform(png_bytes, "png", batch_size=BATCH_SIZE))}
            # Spark's workers idle for a minute are stopped (the model alone's run may take
            # that long): each transform's timed run follows a warm-up on 5% of its rows,
            # so no worker start or model build falls in it
            warm = {ROWS: lambda: _noop(bm.transform(sample(image_rows), "image", batch_size=BATCH_SIZE)),
                    PNG: lambda: _noop(bm_png.transform(sample(png_bytes), "png", batch_size=BATCH_SIZE))}
            pids = {ALONE: lambda: [p.pid for p in alone.procs], ROWS: workers, PNG: workers}
            for mode in MODES:  # warm-up: every worker builds its model
                runs[mode]()
            times: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
            for _ in range(rounds):
                for mode in MODES:
                    if mode in warm:
                        warm[mode]()
                    times[mode].append(measured(runs[mode], pids[mode]))
            load.append(os.getloadavg()[0])
        finally:
            if alone is not None:
                alone.close()
            spark.stop()
            keras.backend.clear_session()
    base = [wall for wall, _, _ in times[ALONE]]
    n = size.rows
    return [{"mode": mode, "rows": n, "batch": BATCH_SIZE,
             "rows/s": n / statistics.median(wall for wall, _, _ in times[mode]),
             "x model alone, median of rounds": statistics.median(
                 b / wall for b, (wall, _, _) in zip(base, times[mode])),
             "CPU ms/row, Python": 1000 * statistics.median(py for _, py, _ in times[mode]) / n,
             "CPU ms/row, JVM": 1000 * statistics.median(jvm for _, _, jvm in times[mode]) / n,
             "load avg (1 min) before, after": f"{load[0]:.1f}, {load[-1]:.1f}"}
            for mode in MODES]


def workers() -> list[int]:
    """The Spark Python workers of this driver (reused: the same over the runs)."""
    from bench.harness import worker_pids

    return worker_pids(workers_only=True)


def main(argv: list[str] | None = None) -> int:
    from bench.report import section_main

    return section_main("python -m bench.images_bench", "MobileNetV2 on image rows and PNG bytes "
                        "against the model alone", lambda quick, repeats: run(quick, repeats),
                        "{:,.3f}", argv)


if __name__ == "__main__":
    sys.exit(main())
