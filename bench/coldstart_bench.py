"""Cold start of a fresh Spark Python worker: the stock daemon (``pyspark.daemon``)
against the preloading one (``spark_keras.executor.daemon``), side by side.

Spark forks every Python worker of an executor from a daemon; with
``spark.python.worker.reuse=false`` every task gets a fresh one. The daemon module is
fixed per SparkContext, so each configuration runs in its own ``local[2]`` session
(stopped before the next starts); the configurations alternate, one session each per
round, taking turns at going first, so machine noise hits them alike, after a throwaway
session that warms the driver's JVM (shared by all sessions of the process). In each
session:

1. a warm-up job (RDD, then SQL: each pool of Python workers has its own daemon) of
   trivial tasks starts the daemons; from /proc, the time from a daemon's start to its
   first fork is the daemon's own start, paid once per executor (and per pool);
2. for the MLP and the CNN of the scoring section, a job of tasks in fresh workers,
   each timing with ``time.perf_counter`` from the very first line of the task
   function: ``import tensorflow, keras`` (free when preloaded), then reading its PSS
   (``/proc/self/smaps_rollup``: TensorFlow and Keras loaded, no model), then the
   ``BroadcastModel`` build (``bm.value``), then the first prediction
   (``bm.predictor``, what ``transform`` calls). The time from the worker's fork to the
   task function's first line (``/proc/self/stat``, 10 ms resolution) is shown apart;
3. ``bm.transform(df, "features")`` on the MLP over a cached DataFrame of N partitions,
   collected (``toArrow``): the wall time of a job whose every task starts a worker.

Before all that, each session's very first job: ``transform`` of one row through a tiny
model, collected: the daemon's start (and preloading), the fork, the imports the daemon
did not do, the build and one prediction, as the first job on a fresh executor pays them.

Every task checks that its parent is the daemon the session asked for (the preloading
daemon becomes the stock one when forking would be unsafe, which would void the
comparison). The predictions of both daemons must be bit-identical (cold-start tasks
by input seed, the transform row by row), and close to the driver's; the benchmark
fails otherwise.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from bench.harness import pss_mb
from bench.sessions import local_session, start_seconds
from bench.targets import coldstart_goal

STOCK, PRELOADED = "pyspark.daemon (stock)", "spark_keras.executor.daemon"
DAEMONS = {STOCK: "pyspark.daemon", PRELOADED: "spark_keras.executor.daemon"}
RATIO = "daemon / stock"


# --- in the Python workers (module level: pickled by reference, imported by the worker
# --- when it unpickles the task, before the task function starts) -----------------------

def parent_command() -> str:
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def whoami() -> dict[str, Any]:
    """The worker, its daemon, and how long after the daemon's start it was forked."""
    ppid = os.getppid()
    return {"pid": os.getpid(), "ppid": ppid, "parent": parent_command(),
            "daemon_to_fork": start_seconds() - start_seconds(ppid)}


def cold_start_task(bm: Any, input_shape: tuple[int, ...], rows: int) -> Callable:
    """A task timing a fresh worker's way to its first prediction (see the module
    docstring); the partition index seeds its input."""

    def task(index: int, _items: Iterator[Any]) -> Iterator[dict]:
        started = time.perf_counter()  # first: nothing imported by the task yet
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        import keras  # noqa: F401
        import numpy as np
        import tensorflow  # noqa: F401

        imported = time.perf_counter()
        memory = pss_mb()  # TensorFlow and Keras loaded, no model
        x = np.random.default_rng(index).standard_normal((rows, *input_shape), dtype=np.float32)
        building = time.perf_counter()
        bm.value  # noqa: B018  (the build)
        built = time.perf_counter()
        y = bm.predictor([x], rows)[0]
        predicted = time.perf_counter()
        yield {"index": index, **whoami(), "fork_to_task": since_boot - start_seconds(),
               "import": imported - started, "build": built - building,
               "predict": predicted - built, "pss": memory,
               "y": y.tobytes(), "y_shape": y.shape, "y_dtype": str(y.dtype)}

    return task


# --- on the driver -----------------------------------------------------------------------

def session(daemon_module: str, reports: str):
    """A local[2] session forking a fresh Python worker for every task from
    ``daemon_module``; otherwise the settings of conf/spark-defaults.conf."""
    return local_session("spark-keras-bench-coldstart", **{
        "spark.python.worker.reuse": "false",
        "spark.python.daemon.module": daemon_module,
        "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.executorEnv.SPARK_KERAS_DAEMON_REPORT": reports})


@dataclass
class Measured:
    """One daemon's figures, over all its sessions."""

    samples: dict[str, list[dict]] = field(default_factory=dict)  # model -> task results
    transform: list[float] = field(default_factory=list)          # job seconds, per session
    transform_predictions: list[Any] = field(default_factory=list)
    daemon_start: list[float] = field(default_factory=list)       # per daemon process
    preload_seconds: list[float] = field(default_factory=list)    # from the daemon reports
    load: list[float] = field(default_factory=list)               # host load at session ends
    first_job: list[float] = field(default_factory=list)          # job seconds, per session


def _check_parents(found: list[dict], daemon_module: str, what: str) -> None:
    wrong = {d["parent"] for d in found if f"-m {daemon_module}" not in d["parent"]}
    if wrong:
        raise RuntimeError(f"{what}: Python workers forked by {sorted(wrong)}, not by "
                           f"{daemon_module} (did the preloading daemon fall back?)")


def warm_up(spark) -> list[dict]:
    """Start the daemons with trivial tasks (RDD, then SQL); each worker's whoami()."""
    import pyarrow as pa

    found = spark.sparkContext.parallelize(range(2), 2).map(lambda _: whoami()).collect()

    def sql(batches: Iterator[Any]) -> Iterator[Any]:
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(whoami())])], names=["info"])

    rows = spark.range(2, numPartitions=2).mapInArrow(sql, "info string").collect()
    return found + [json.loads(r.info) for r in rows]


def cold_starts(spark, model, input_shape: tuple[int, ...], rows: int, tasks: int) -> list[dict]:
    """One result per task, each in a fresh worker."""
    import spark_keras as sk

    bm = sk.BroadcastModel(spark, model)
    try:
        found = (spark.sparkContext.parallelize(range(tasks), tasks)
                 .mapPartitionsWithIndex(cold_start_task(bm, input_shape, rows)).collect())
    finally:
        bm.destroy()
    if len({r["pid"] for r in found}) != tasks:
        raise RuntimeError(f"{tasks} tasks ran in workers {sorted(r['pid'] for r in found)}: "
                           "not a fresh worker each (spark.python.worker.reuse?)")
    return found


def first_job(spark, model) -> float:
    """Seconds of the session's very first job: ``transform`` of one row through ``model``
    (its daemon started, the worker forked, Keras imported where the daemon did not, the
    model built, one prediction), collected."""
    from pyspark.sql import functions as F

    size = model.inputs[0].shape[-1]
    df = spark.range(1).select("id", F.array(*[F.lit(0.5)] * size).cast("array<float>").alias("features"))
    return transform_job(spark, model, df, batch_size=1)[0]


def transform_job(spark, model, df, batch_size: int) -> tuple[float, Any]:
    """Seconds for ``bm.transform(df, "features")`` collected, and the (id, prediction) table."""
    import spark_keras as sk

    bm = sk.BroadcastModel(spark, model)
    try:
        started = time.perf_counter()
        table = bm.transform(df, "features", batch_size=batch_size).select("id", "prediction").toArrow()
        seconds = time.perf_counter() - started
    finally:
        bm.destroy()
    return seconds, table.sort_by("id")


def measure_session(label: str, models: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                    rows: dict[str, int], tasks: int, work: Any, partitions: int, reports: str,
                    into: Measured, tiny: Any) -> None:
    """One session of daemon ``label``: the first job (through ``tiny``), warm-up, cold
    starts of every model, transform."""
    from bench.frames import check_predictions, expected_predictions, make_frame

    module = DAEMONS[label]
    spark = session(module, reports)
    try:
        into.first_job.append(first_job(spark, tiny))
        started = warm_up(spark)
        _check_parents(started, module, f"{label} warm-up")
        for ppid in {d["ppid"] for d in started}:
            into.daemon_start.append(min(d["daemon_to_fork"] for d in started if d["ppid"] == ppid))
            report = os.path.join(reports, f"daemon-{ppid}.json")
            if os.path.exists(report):
                with open(report) as f:
                    into.preload_seconds.append(json.load(f)["seconds"])
        for name, model in models.items():
            found = cold_starts(spark, model, shapes[name], rows[name], tasks)
            _check_parents(found, module, f"{label}, {name} cold starts")
            into.samples.setdefault(name, []).extend(found)
        df = make_frame(spark, work, "array", partitions=partitions)
        expected = expected_predictions(models["MLP"], df, work, "array", ["features"])
        seconds, table = transform_job(spark, models["MLP"], df, work.batch_size)
        import pyarrow.compute as pc

        sampled = table.filter(pc.is_in(table.column("id"), value_set=pc.cast(expected.ids, "int64")))
        check_predictions(f"transform, {label}", sampled, expected)
        into.transform.append(seconds)
        into.transform_predictions.append(table)
        into.load.append(os.getloadavg()[0])
        df.unpersist()
    finally:
        spark.stop()


def assert_identical(what: str, found: list[tuple[str, Any]], labels: set[str]) -> None:
    """Raise AssertionError unless every (label, array) in ``found`` holds the same bits
    and every label in ``labels`` gave one."""
    import numpy as np

    missing = labels - {label for label, _ in found}
    if missing:
        raise AssertionError(f"{what}: no predictions from {sorted(missing)}")
    first_label, first = found[0]
    for label, y in found[1:]:
        np.testing.assert_array_equal(
            y, first, err_msg=f"{what}: the predictions with {label} differ from those with {first_label}")


def check_identical(measured: dict[str, Measured], models: dict[str, Any],
                    rows: dict[str, int], shapes: dict[str, tuple[int, ...]]) -> None:
    """Every cold-start prediction for one input seed, and every transform, bit-identical
    across daemons and sessions; the cold-start ones also close to the driver's."""
    import numpy as np

    from spark_keras.inference import predictor_for

    for name, model in models.items():
        by_seed: dict[int, list[tuple[str, Any]]] = {}
        for label, m in measured.items():
            for r in m.samples[name]:
                y = np.frombuffer(r["y"], dtype=r["y_dtype"]).reshape(r["y_shape"])
                by_seed.setdefault(r["index"], []).append((label, y))
        for seed, found in by_seed.items():
            x = np.random.default_rng(seed).standard_normal((rows[name], *shapes[name]), dtype=np.float32)
            driver = predictor_for(model)([x], rows[name])[0]
            assert_identical(f"{name} cold start, input seed {seed}", found, set(measured))
            np.testing.assert_allclose(found[0][1], driver, rtol=1e-3, atol=1e-4,
                                       err_msg=f"{name}, input seed {seed}: workers vs driver")
    tables = [(label, t) for label, m in measured.items() for t in m.transform_predictions]
    assert_identical("transform ids", [(label, t.column("id").to_numpy()) for label, t in tables],
                     set(measured))
    assert_identical("transform", [(label, t.column("prediction").to_numpy()) for label, t in tables],
                     set(measured))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def table_rows(measured: dict[str, Measured], rounds: int, partitions: int, rows: int) -> list[dict]:
    stock, pre = measured[STOCK], measured[PRELOADED]

    def row(measure: str, a: Any, b: Any, goal: str = "") -> dict:
        ratio = b / a if isinstance(a, float) and isinstance(b, float) and a else None
        return {"measure": measure, STOCK: a, PRELOADED: b, RATIO: ratio, "goal": goal}

    def phase(m: Measured, name: str, key: str) -> list[float]:
        return [r[key] for r in m.samples[name]]

    def total(m: Measured, name: str) -> list[float]:
        return [r["import"] + r["build"] + r["predict"] for r in m.samples[name]]

    out = [row(f"first job of a new session: transform of 1 row, tiny model, collected (daemon "
               f"start, fork, imports, build, prediction), median of {len(pre.first_job)} s",
               _median(stock.first_job), _median(pre.first_job),
               coldstart_goal("first job", _median(pre.first_job), _median(stock.first_job)))]
    for name in stock.samples:
        tasks = len(pre.samples[name])
        a, b = total(stock, name), total(pre, name)
        less_build = [t - r["build"] for t, r in zip(b, pre.samples[name])]
        out += [
            row(f"{name}: task start to first prediction, median of {tasks} fresh workers, s",
                _median(a), _median(b)),
            row(f"{name}: task start to first prediction, min / max s",
                f"{min(a):.3f} / {max(a):.3f}", f"{min(b):.3f} / {max(b):.3f}"),
            row(f"{name}: of which import tensorflow, keras, median s",
                _median(phase(stock, name, "import")), _median(phase(pre, name, "import"))),
            row(f"{name}: of which model build (bm.value), median s",
                _median(phase(stock, name, "build")), _median(phase(pre, name, "build"))),
            row(f"{name}: of which first prediction (bm.predictor), median s",
                _median(phase(stock, name, "predict")), _median(phase(pre, name, "predict"))),
            row(f"{name}: cold start less the model build, median s",
                _median([t - r["build"] for t, r in zip(a, stock.samples[name])]),
                _median(less_build), coldstart_goal("cold start", _median(less_build))),
            row(f"{name}: the same from the fork (+ fork to task start), median s",
                *(_median([r["fork_to_task"] + r["import"] + r["predict"] for r in m.samples[name]])
                  for m in (stock, pre))),
        ]
    every = {label: [r for rs in m.samples.values() for r in rs] for label, m in measured.items()}
    out.append(row("fork to task start (before the task function runs), median s",
                   _median([r["fork_to_task"] for r in every[STOCK]]),
                   _median([r["fork_to_task"] for r in every[PRELOADED]])))
    pss = {label: _median([r["pss"]["Pss"] for r in rs]) for label, rs in every.items()}
    out.append(row("worker PSS, tensorflow and keras imported, no model, median MB",
                   pss[STOCK], pss[PRELOADED], coldstart_goal("pss", pss[PRELOADED], pss[STOCK])))
    if all("Pss_Anon" in r["pss"] for rs in every.values() for r in rs):
        out.append(row("worker PSS: of which anonymous (Pss_Anon), median MB",
                       *(_median([r["pss"]["Pss_Anon"] for r in every[label]]) for label in DAEMONS)))
    best = "" if rounds == 1 else f", best of {rounds}"
    out.append(row(f"transform job wall (MLP, {partitions} partitions x {rows:,} rows, "
                   f"collected{best}) s", min(stock.transform), min(pre.transform)))
    out.append(row("daemon start to its first fork (once per executor and worker pool), median s",
                   _median(stock.daemon_start), _median(pre.daemon_start)))
    if pre.preload_seconds:
        out.append(row("daemon start: of which preloading (SPARK_KERAS_DAEMON_REPORT seconds), median s",
                       None, _median(pre.preload_seconds)))
    out.append(row("host 1-min load average at the end of each session, max (this benchmark "
                   "alone: about 3)", max(stock.load), max(pre.load)))
    return out


def warm_jvm(reports: str) -> None:
    """One throwaway session with a trivial SQL job: the driver's JVM (started once per
    Python process, shared by later sessions) loads and compiles its classes here, so
    neither daemon's first measured job pays for that."""
    import pyarrow as pa

    def noop(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            yield pa.RecordBatch.from_arrays([batch.column(0)], names=["id"])

    spark = session(DAEMONS[STOCK], reports)
    try:
        spark.range(2, numPartitions=2).mapInArrow(noop, "id long").collect()
    finally:
        spark.stop()


def run(quick: bool = False) -> list[dict]:
    """Rows for the table; both daemons alternate, one session each per round."""
    import keras

    from bench.frames import Workload
    from bench.models import actor_model, mlp_model

    models = {"MLP": mlp_model(), "CNN": actor_model()}
    tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])  # the first job's
    shapes = {"MLP": (64,), "CNN": (120, 160, 2)}
    rows = {"MLP": 64, "CNN": 8}  # rows predicted by each cold-start task
    rounds, tasks = (1, 2) if quick else (2, 4)
    partitions, per_partition = (2, 100) if quick else (16, 1_000)
    work = Workload("MLP", mlp_model, (64,), partitions * per_partition, 1024, ("array",))
    measured = {label: Measured() for label in DAEMONS}
    with tempfile.TemporaryDirectory(prefix="sk-coldstart-") as reports:
        warm_jvm(reports)
        for round_ in range(rounds):
            # the daemons take turns at going first, so a drift of the machine hits both
            for label in (list(DAEMONS) if round_ % 2 == 0 else list(DAEMONS)[::-1]):
                measure_session(label, models, shapes, rows, tasks, work, partitions, reports,
                                measured[label], tiny)
    check_identical(measured, models, rows, shapes)
    keras.backend.clear_session()
    return table_rows(measured, rounds, partitions, per_partition)
