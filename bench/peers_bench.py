"""`make bench-peers` (`python -m bench.peers_bench [--quick] [--repeats N]`): a folder of
PNG files scored by spark-keras, Ray Data and Daft, side by side, against the model alone.

:data:`FILES` photo-like 224 x 224 PNGs (about 96 kB each) written into a temporary
folder, MobileNetV2 (:func:`bench.models.mobilenet_model`, random weights) saved once as a
``.keras`` file that every mode loads, calls of :data:`BATCH_SIZE` rows, one TensorFlow
thread per process and two processes (or instances) holding the model in every mode:

* the model alone: :class:`bench.images_bench.Alone`, two spawned processes scoring the
  images already decoded into float32 arrays (the ceiling: no reading, no decoding);
* spark-keras on local[2] (this venv), each run reading the folder afresh, into the
  ``noop`` sink: ``spark.read.format("binaryFile")`` + ``BroadcastModel.transform`` (the
  files decoded in the Python workers: :mod:`spark_keras.inference.image_files`),
  ``spark.read.format("image")`` + ``transform`` (Spark's JVM decodes), ``binaryFile`` +
  the model behind a PNG decoder in its graph, and the image rows cached before timing
  (no decoding in the run);
* Ray Data (this venv) and Daft (its own venv, ``DAFT_PYTHON``): each in a process of its
  own (:mod:`bench.peer_ray`, :mod:`bench.peer_daft`), its idiomatic pattern.

Every mode runs once untimed first (its predictions checked against the model alone's on
the same files: :data:`CHECK_TOLERANCE` of the largest), then the modes take turns for the
rounds (the order reversed every other round, so that the machine's load falls on each
alike), each Spark run after a warm-up on :data:`WARM_FILES` files (Spark stops Python
workers idle for a minute). Printed: median rows/s, the median over the rounds of each run
against the same round's model alone, and against the same round's fastest peer; for the
spark-keras modes the CPU its Python workers and the driver's JVM used per row (medians);
versions and the load average beside them. A peer whose Python is missing is left out, said so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

FILES = 512
WARM_FILES = 16
SIZE = 224
BATCH_SIZE = 64
CHECK_TOLERANCE = 1e-3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALONE = "the model alone on decoded float32 arrays (2 processes)"
ROWS = "spark-keras: format('image') + transform (JVM decode)"
PNG = "spark-keras: binaryFile + PNG decoded in the model's graph"
FILE = "spark-keras: binaryFile + transform (decoded in the worker)"
CACHED = "spark-keras: image rows cached before timing + transform"
RAY = "Ray Data: read_images + map_batches, actor pool of 2"
DAFT = "Daft: decode_image + @daft.cls batch method, 2 instances"
PEERS = (RAY, DAFT)
PEER_MODULES = ("bench.peer_ray", "bench.peer_daft")


class Peer:
    """A peer system's process (:mod:`bench.peer_runner`'s protocol)."""

    def __init__(self, python: str, module: str, source: str, model_path: str, work: str,
                 batch_size: int = BATCH_SIZE) -> None:
        self.out = os.path.join(work, module.rsplit(".", 1)[1] + ".npz")
        self.log = open(os.path.join(work, module.rsplit(".", 1)[1] + ".log"), "w")
        env = {**os.environ, "PYTHONPATH": ROOT}
        self.proc = subprocess.Popen([python, "-m", module, source, model_path, self.out, str(batch_size)],
                                     cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.version = self._answer()["version"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer process stopped: its log is {self.log.name}")
        return json.loads(line)

    def run(self, command: str = "go") -> float:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return float(self._answer()["seconds"])

    def predictions(self) -> tuple[list[str], np.ndarray]:
        got = np.load(self.out)
        return [str(n) for n in got["names"]], got["predictions"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            self.proc.wait(120)
        self.log.close()


@dataclass
class Stage:
    """What a section's run holds: its work folder, the versions and the load average to
    print, and the peers, the model alone and the Spark session it starts (all closed, the
    folder removed, on leaving :meth:`made`)."""

    work: str
    versions: list[str]
    load: list[float]
    peers: dict[str, Peer] = field(default_factory=dict)
    alone: Any = None
    spark: Any = None

    @classmethod
    @contextlib.contextmanager
    def made(cls, prefix: str) -> Iterator[Stage]:
        import keras
        import pyspark
        import tensorflow as tf

        stage = cls(tempfile.mkdtemp(prefix=prefix), [f"PySpark {pyspark.__version__}", f"Keras {keras.__version__}",
                                                      f"TensorFlow {tf.__version__}"], [os.getloadavg()[0]])
        try:
            yield stage
            stage.load.append(os.getloadavg()[0])
        finally:
            for peer in stage.peers.values():
                peer.close()
            if stage.alone is not None:
                stage.alone.close()
            if stage.spark is not None:
                stage.spark.stop()
            shutil.rmtree(stage.work, ignore_errors=True)


def check(name: str, names: list[str], predictions: np.ndarray, expected: dict[str, np.ndarray]) -> None:
    """Every file (row) scored once, each prediction the model alone's on that file."""
    if sorted(names) != sorted(expected):
        raise AssertionError(f"{name}: scored {len(names)} rows, not the {len(expected)} given")
    want = np.stack([expected[n] for n in names])
    worst, scale = float(np.abs(np.asarray(predictions) - want).max()), float(np.abs(want).max())
    if not worst <= CHECK_TOLERANCE * scale:
        raise AssertionError(f"{name}: predictions differ from the model alone's (max |diff| {worst}, "
                             f"the largest {scale})")


def spark_modes(spark, model_path: str, folder: str, warm_folder: str) -> tuple[dict, dict, dict]:
    """The spark-keras modes: for each, a timed run, a warm-up run, and a run collecting
    (file names, predictions) for the check."""
    import keras
    from pyspark.sql import functions as F

    import spark_keras as sk
    from bench.images_bench import _noop
    from bench.models import png_mobilenet_model

    model = keras.saving.load_model(model_path)
    bm, bm_png = sk.BroadcastModel(spark, model), sk.BroadcastModel(spark, png_mobilenet_model(model))

    def images(path: str):
        return bm.transform(spark.read.format("image").load(path), "image", batch_size=BATCH_SIZE)

    def files(path: str):
        return bm.transform(spark.read.format("binaryFile").load(path), "content", batch_size=BATCH_SIZE)

    def png(path: str):
        return bm_png.transform(spark.read.format("binaryFile").load(path), "content", batch_size=BATCH_SIZE)

    # by a glob: Spark's cache serves any later read whose plan is the cached one's, so a
    # cached load(folder) would be what format('image') runs read, and they would decode nothing
    cached = spark.read.format("image").load(os.path.join(folder, "*.png")).cache()
    cached.count()
    frames: dict[str, Callable[[str], Any]] = {
        FILE: files, ROWS: images, PNG: png, CACHED: lambda path: bm.transform(cached, "image", batch_size=BATCH_SIZE)}
    names = {FILE: F.col("path"), ROWS: F.col("image.origin"), PNG: F.col("path"), CACHED: F.col("image.origin")}
    timed = {mode: (lambda f=f: _noop(f(folder))) for mode, f in frames.items()}
    warm = {mode: (lambda f=f: _noop(f(warm_folder))) for mode, f in frames.items()}
    warm[CACHED] = warm[ROWS]

    def collect(mode: str) -> tuple[list[str], np.ndarray]:
        got = frames[mode](folder).select(names[mode].alias("name"), "prediction").toArrow()
        return ([os.path.basename(n) for n in got.column("name").to_pylist()],
                np.stack(got.column("prediction").to_numpy(zero_copy_only=False)))

    return timed, warm, {mode: (lambda mode=mode: collect(mode)) for mode in frames}


def start_peers(stage: Stage, modules: dict[str, str], source: str, model_path: str,
                expected: dict[str, np.ndarray], batch_size: int = BATCH_SIZE) -> None:
    """Start each peer's process (``{label: module}``) into ``stage.peers``, its first
    run's predictions checked, its version added to the stage's; a peer whose Python is
    missing is left out, said so."""
    pythons = {"bench.peer_ray": sys.executable,
               "bench.peer_daft": os.environ.get("DAFT_PYTHON", os.path.join(ROOT, ".venv-daft", "bin", "python"))}
    for name, module in modules.items():
        python = pythons[module]
        if not os.path.exists(python):
            print(f"{name}: left out, no Python at {python} (make bench-peers makes it)", file=sys.stderr)
            continue
        peer = stage.peers[name] = Peer(python, module, source, model_path, stage.work, batch_size)
        peer.run("warm")
        check(name, *peer.predictions(), expected)
        stage.versions.append(peer.version)


def take_turns(runs: dict[str, Callable[[], Any]], warm: dict[str, Callable[[], Any]],
               rounds: int) -> tuple[dict, dict]:
    """The modes in turns for ``rounds`` rounds, the order reversed every other round: a
    mode in ``warm`` (a spark-keras one) runs after its warm-up, timed here with the CPU its
    Python workers and the JVM used; the others time themselves (return seconds).
    ``({mode: [seconds]}, {spark-keras mode: [(Python CPU s, JVM CPU s)]})``."""
    from bench.images_bench import measured, workers

    modes = list(runs)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[tuple[float, float]]] = {mode: [] for mode in warm}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            if mode in warm:
                warm[mode]()
                wall, python, jvm = measured(runs[mode], workers)
                times[mode].append(wall)
                cpu[mode].append((python, jvm))
            else:
                times[mode].append(runs[mode]())
    return times, cpu


def run(quick: bool = False, repeats: int | None = None, files: int | None = None) -> tuple[list[dict], str]:
    """One row per mode (see the module's docstring), and a line of versions and load;
    ``files``: :data:`FILES` by default."""
    import tensorflow as tf

    from bench.images_bench import Alone
    from bench.inputs_bench import pngs as make_pngs
    from bench.models import mobilenet_model
    from bench.sessions import local_session

    files = files or (64 if quick else FILES)
    rounds = 1 if quick else (repeats or 3)
    pngs = make_pngs(files, size=SIZE, distinct=files)
    model = mobilenet_model(SIZE)
    decoded = np.stack([tf.io.decode_png(p, channels=3).numpy() for p in pngs]).astype(np.float32)
    expected = dict(zip((f"{k:04d}.png" for k in range(files)),
                        model.predict(decoded, batch_size=BATCH_SIZE, verbose=0)))
    del decoded
    with Stage.made("peers-bench-") as stage:
        folder, warm_folder = os.path.join(stage.work, "pngs"), os.path.join(stage.work, "warm")
        for path in (folder, warm_folder):
            os.makedirs(path)
        for k, png in enumerate(pngs):
            for path in (folder, warm_folder) if k < WARM_FILES else (folder,):
                with open(os.path.join(path, f"{k:04d}.png"), "wb") as f:
                    f.write(png)
        model_path = os.path.join(stage.work, "model.keras")
        model.save(model_path)
        start_peers(stage, dict(zip(PEERS, PEER_MODULES)), folder, model_path, expected)
        stage.spark = local_session("peers-bench", driver_memory="4g")
        timed, warm, collect = spark_modes(stage.spark, model_path, folder, warm_folder)
        for mode, got in collect.items():
            check(mode, *got(), expected)
        stage.alone = Alone(model_path, pngs, files, BATCH_SIZE)
        times, cpu = take_turns({ALONE: stage.alone.run, **timed, **{n: p.run for n, p in stage.peers.items()}},
                                warm, rounds)
    return rows(times, cpu, files, stage.versions, stage.load)


def rows(times: dict[str, list[float]], cpu: dict[str, list[tuple[float, float]]], files: int,
         versions: list[str], load: list[float], alone: str = ALONE, peers: tuple[str, ...] = PEERS,
         unit: str = "files", cpu_unit: tuple[str, float] = ("ms", 1e3)) -> tuple[list[dict], str]:
    """The table: per mode, median rows/s and per-round ratios to the model alone (mode
    ``alone``) and to the round's fastest of ``peers``; ``files`` rows, counted in ``unit``;
    CPU per row in ``cpu_unit`` (its name, and its number in a second)."""
    rounds = range(len(times[alone]))
    best_peer = [min((times[p][r] for p in peers if p in times), default=None) for r in rounds]
    out = []
    for mode, walls in times.items():
        row = {"mode": mode, unit: files, "rows/s": files / statistics.median(walls),
               "x model alone": statistics.median(times[alone][r] / walls[r] for r in rounds)}
        if best_peer[0] is not None:
            row["x fastest peer"] = statistics.median(best_peer[r] / walls[r] for r in rounds)
        used = cpu.get(mode)  # the spark-keras modes only (None: a blank cell)
        name, scale = cpu_unit
        row[f"CPU {name}/row, Python workers"] = scale * statistics.median(p for p, _ in used) / files if used else None
        row[f"CPU {name}/row, JVM"] = scale * statistics.median(j for _, j in used) / files if used else None
        out.append(row)
    return out, (f"{', '.join(versions)}; load average (1 min) before, after: {load[0]:.1f}, "
                 f"{load[-1]:.1f}; median of {len(rounds)} rounds")


def main(argv: list[str] | None = None, section: Callable[..., tuple[list[dict], str]] | None = None,
         prog: str = "python -m bench.peers_bench", doc: str = __doc__,
         title: Callable[[list[dict]], str] | None = None) -> int:
    """Run ``section`` (this module's :func:`run` by default) with ``--quick`` and
    ``--repeats`` from ``argv``; print its table under ``title(rows)`` and its note."""
    import argparse

    from bench.report import table

    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few rows, one round (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds")
    parser.add_argument("--rows", type=int, help="files (rows) to score, in place of the section's default")
    args = parser.parse_args(argv)
    found, note = (section or run)(args.quick, args.repeats, args.rows)
    print("\n" + (title(found) if title else f"A folder of {found[0]['files']} PNG files (224 x 224), "
                   f"MobileNetV2, calls of {BATCH_SIZE}, {os.cpu_count()} cores") + "\n")
    print(table(found, floatfmt="{:,.2f}"))
    print(f"\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
