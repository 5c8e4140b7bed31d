"""Plain-text tables for benchmark rows."""

from __future__ import annotations

from typing import Callable


def table(rows: list[dict], floatfmt: str = "{:,.3f}") -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    cells = [[_fmt(r.get(c), floatfmt) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cols), sep, *(line(r) for r in cells)])


def _fmt(value, floatfmt: str) -> str:
    if isinstance(value, float):
        return floatfmt.format(value)
    return "" if value is None else str(value)


def _pick(rows: list[dict], workload: str, variant: str, method: str) -> dict | None:
    return next((r for r in rows if r["workload"].startswith(workload) and r["input"] == variant
                 and r["method"] == method), None)


def _target(label: str, value: float | None, ok: bool) -> str:
    shown = "n/a" if value is None else f"{value:.2f}"
    return f"[{'met' if ok else 'NOT met'}] {label}: {shown}"


REBUILD_SPEED_UP = 3.0  # the payload file against Keras's pickle path, every model


def payload_targets(rows: list[dict]) -> list[str]:
    """The rebuild target: a payload file loaded as executors load it (weights shared)
    at least 3x faster than Keras's own pickle path, for every model."""
    return [_target(f"{r['model']} rebuild from a payload file (share_weights=True) >= "
                    f"{REBUILD_SPEED_UP:g}x Keras pickle", r["file load speed-up"],
                    r["file load speed-up"] >= REBUILD_SPEED_UP) for r in rows]


SHARED_LIMIT = 1.5  # the workers' added memory, in copies of the weights


def memory_targets(rows: list[dict]) -> list[str]:
    """The shared-weights memory target at 4 workers; the copy-per-worker figure and
    the build seconds of both modes for information."""
    from .memory_bench import COPY, SHARED

    at4 = {r["mode"]: r for r in rows if r["workers"] == 4}
    if SHARED not in at4 or COPY not in at4:
        return []
    shared, copy = at4[SHARED]["x weights"], at4[COPY]["x weights"]
    return [_target(f"shared weights at 4 workers <= {SHARED_LIMIT:g}x weights", shared,
                    shared <= SHARED_LIMIT),
            f"[info] a copy per worker at 4 workers, not a target: {copy:.2f}x weights",
            f"[info] build s per worker at 4 workers (mean): {at4[COPY]['build s mean']:.2f} with a copy "
            f"per worker, {at4[SHARED]['build s mean']:.2f} on the shared file"]


def scoring_targets(rows: list[dict], facts: dict) -> list[str]:
    """The issue's throughput and memory targets, each marked met or not, and the
    idealized ceiling for information."""
    out, info = [], []

    def check(label: str, value: float | None, ok: bool) -> None:
        out.append(_target(label, value, ok))

    transform = _pick(rows, "MLP", "array", "BroadcastModel.transform")
    if transform:
        check("MLP (array) transform / predict_batch_udf >= 4 (fair peer: model.predict with "
              "the same batch size)", transform["x predict_batch_udf"], transform["x predict_batch_udf"] >= 4)
    for workload in ("MLP", "CNN"):
        for variant in ("array", "scalars", "vector"):
            row = _pick(rows, workload, variant, "BroadcastModel.transform")
            if row:
                check(f"{workload} ({variant}) transform >= 0.9x hand-written best case",
                      row["x best case"], row["x best case"] >= 0.9)
            for method in ("BroadcastModel.transform", "BroadcastModel.predict_udf"):
                row = _pick(rows, workload, variant, method)
                if row and workload == "MLP":
                    check(f"MLP ({variant}) {method.split('.')[-1]} >= {CEILING_SHARE}x the ceiling "
                          f"1/(1/raw+1/identity) (aim {CEILING_AIM}x)", row["x ceiling"],
                          row["x ceiling"] >= CEILING_SHARE)
                elif row:
                    info.append(f"[info] {workload} ({variant}) {method.split('.')[-1]} / ceiling, "
                                f"not a target: {row['x ceiling']:.2f}")
            row = _pick(rows, workload, variant, "BroadcastModel.predict_udf")
            if row:
                slower = 1 / row["x transform"]
                check(f"{workload} ({variant}) transform / predict_udf <= 1.5", slower, slower <= 1.5)
    baseline = facts.get("tf_baseline_rss_mb")
    for workload in ("MLP", "CNN"):
        weights = facts.get(f"{workload} weights MB")
        for method in ("BroadcastModel.transform", "BroadcastModel.predict_udf"):
            row = _pick(rows, workload, "array", method)
            if row and baseline and weights is not None and row["peak worker RSS MB"]:
                limit = baseline + 2 * weights
                check(f"{workload} {method.split('.')[-1]} peak worker RSS MB <= {limit:.0f} "
                      f"(TF baseline {baseline:.0f} + 2 x {weights:.1f} MB weights)",
                      row["peak worker RSS MB"], row["peak worker RSS MB"] <= limit)
    return out + info


BEST_CASE_SHARE = 0.9  # transform against the hand-written mapInArrow, in rows/s
CEILING_SHARE, CEILING_AIM = 0.7, 0.8  # transform and predict_udf against the ceiling (MLP)


def inputs_targets(rows: list[dict], lengths: list[dict]) -> list[str]:
    """The inputs section's target (text and image: transform within 10% of the
    hand-written mapInArrow), and for information transform against predict_batch_udf and
    the cost of many distinct sequence lengths in a batch."""
    from .inputs_bench import IMAGE, PNGS, STRINGS, TEXT

    out, info = [], []
    for workload, variant in ((TEXT, STRINGS), (IMAGE, PNGS)):
        row = _pick(rows, workload, variant, "BroadcastModel.transform")
        if row:
            out.append(_target(f"{workload} ({variant}) transform >= {BEST_CASE_SHARE:g}x hand-written "
                               "best case", row["x best case"], row["x best case"] >= BEST_CASE_SHARE))
            info.append(f"[info] {workload} ({variant}) transform / predict_batch_udf, not a target: "
                        f"{row['x predict_batch_udf']:.2f}")
    for row in lengths:
        if row["input"] != lengths[0]["input"]:
            info.append(f"[info] {row['method']} on {row['input']} per batch: {row['x equal lengths']:.2f}x "
                        "its rows/s on equal lengths")
    return out + info


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["input"]) for r in rows}, key=lambda g: (g[0], g[1]))
    methods = [m for m in dict.fromkeys(r["method"] for r in rows)]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.6), squeeze=False)
    for ax, (workload, variant) in zip(axes[0], groups):
        values = [(_pick(rows, workload.split(" ")[0], variant, m) or {}).get("rows/s", 0) for m in methods]
        colors = ["#c44" if "predict_batch" in m or "closure" in m else
                  "#36c" if "BroadcastModel" in m else "#999" for m in methods]
        ax.barh(range(len(methods)), values, color=colors)
        ax.set_yticks(range(len(methods)), methods if ax is axes[0][0] else [""] * len(methods), fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_title(f"{workload}\ninput: {variant}", fontsize=9)
        ax.set_xlabel("rows/s (log)")
    fig.suptitle("Scoring on local[2]: blue spark_keras, red the usual ways, grey references", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLD_START_LIMIT = 0.5  # s: a fresh worker's task start to first prediction, less the build
PSS_CUT = 0.40  # a worker's PSS with TensorFlow loaded: at least this much lower with the daemon


def coldstart_goal(kind: str, value: float, baseline: float | None = None) -> str:
    """The goal cell of a cold-start row, for the preloading daemon: ``"met: ..."`` or
    ``"NOT met: ..."``. ``cold start``: the median time from task start to first
    prediction less the model build, at most 0.5 s. ``pss``: the median worker PSS with
    TensorFlow loaded at least 40% lower than with the stock daemon (``baseline``).
    ``first job``: the median first job of a session no slower than the stock daemon's."""
    if kind == "cold start":
        ok, detail = value <= COLD_START_LIMIT, f"{value:.3f} s <= {COLD_START_LIMIT:g} s"
    elif kind == "first job":
        ok, detail = value <= baseline, f"{value:.2f} s <= stock daemon's {baseline:.2f} s"
    elif kind == "pss":
        cut = 1 - value / baseline
        ok, detail = cut >= PSS_CUT, f"{100 * cut:.0f}% lower >= {100 * PSS_CUT:.0f}%"
    else:
        raise ValueError(kind)
    return f"{'met' if ok else 'NOT met'}: {detail}"


def coldstart_targets(rows: list[dict]) -> list[str]:
    """One line per row with a goal, as the other sections print their targets."""
    out = []
    for row in rows:
        if row.get("goal"):
            status, _, detail = row["goal"].partition(": ")
            out.append(f"[{status}] {row['measure'].strip()}, preloading daemon: {detail}")
    return out


# --- docs/benchmarks.md: one block per section; a run rewrites only its sections -------

TITLES = {  # section -> its heading in the docs (the order of the docs)
    "payload": "## Model rebuild: Keras pickle vs spark_keras payload",
    "scoring": "## Scoring throughput on local[2]",
    "memory": "## Memory: N Python workers holding one model",
    "dask": "## Dask: sending a model to a task",
    "coldstart": "## Cold start: a fresh Python worker, stock daemon vs preloading daemon",
    "frontends": "## Front-ends: predict_partition, pool_predict, predict_dask",
    "inputs": "## Text, image bytes and variable-length sequences on local[2]",
    "threads": "## TensorFlow thread pools per Python worker: the task's CPUs vs all cores",
    "operations": "## Operating a scoring job: transform with error_col and observe vs without",
}
RUN_PREFIX = "_Measured by "


def run_line(command: str, date: str, machine: str, seconds: str) -> str:
    """The line under each section's heading: the command that produced its numbers."""
    return f"{RUN_PREFIX}`{command}` on {date} ({seconds}); machine: {machine}._"


def _sections(results: dict, docs: str) -> dict[str, list[str]]:
    """The blocks of the sections in ``results``, each starting with its heading and the
    line naming the run."""
    import os

    blocks: dict[str, list[str]] = {}
    seconds = results.get("section_seconds", {})

    def start(name: str) -> list[str]:
        took = f"{seconds[name]:.0f} s for this section" if name in seconds \
            else f"{results['seconds']:.0f} s for the whole run"
        return [TITLES[name], "", run_line(results["command"], results["date"], results["machine"], took), ""]

    if "payload" in results:
        lines = start("payload") + [
            "`pickle.loads(pickle.dumps(m))` (Keras's own `.keras`-in-a-pickle path) against "
            "`spark_keras.loads(spark_keras.dumps(m))` and against "
            "`spark_keras.load(path, share_weights=True)` on a payload file written once "
            "beforehand (its pages in the page cache), the way an executor's Python "
            "workers build a `BroadcastModel` (with Keras 3 on TensorFlow the variables "
            "are views of the mapped file; elsewhere the weights are copied), in the same "
            "Keras flavour. Loads times are the best of the repeats, alternating the "
            "three paths. Goal: the file load at least 3x faster than pickle.", "",
            table(results["payload"]), "", "Targets:", ""]
        blocks["payload"] = lines + [f"- {line}" for line in payload_targets(results["payload"])] + [""]
    if "scoring" in results:
        lines = start("scoring") + [
            "Each method scores the same cached DataFrame (written to the `noop` sink), "
            "after a warm-up on 5% of the rows (every 20th id, from every partition); best "
            "of two timed runs when one takes under 8 s. The warm-up's predictions are "
            "collected and compared, row by row and id by id, with `model.predict` on the "
            "same rows on the driver: the benchmark stops if any method disagrees.", "",
            "The methods, all calling the model on batches of the workload's batch size:",
            "",
            "- `predict_batch_udf`: `pyspark.ml.functions.predict_batch_udf`, the model "
            "rebuilt from a broadcast of its config and weights in `make_predict_fn`, "
            "calling `model.predict(x, batch_size=len(x))` on each batch (one step per "
            "batch, not Keras's default batch size of 32);",
            "- `closure pandas_udf`: an iterator pandas UDF with the model captured in its "
            "closure (unpickled in every task), calling `model.predict(x, batch_size=...)` "
            "per Arrow batch;",
            "- `BroadcastModel.predict_udf` and `BroadcastModel.transform`: spark_keras;",
            "- `hand-written mapInArrow (best case)`: what a careful user writes by hand for "
            "this one model: the model rebuilt once per worker from a broadcast, one "
            "`tf.function` of `model(x, training=False)`, zero-copy Arrow-to-numpy, no "
            "input checks, returning the input columns and the prediction as `transform` "
            "does. `x best case` is the ratio to it; the target is `transform` within 10% "
            "of it;",
            "- `identity mapInArrow`: Spark moving every row to a Python worker and back, "
            "no model; `raw model (1 process)`: the model alone on numpy batches;",
            "- `ceiling 1/(1/raw+1/identity)`: the two combined, the bound if the two costs "
            "simply add (`x ceiling`); the target is `transform` and `predict_udf` >= 0.7x "
            "of it for the MLP (aim 0.8x). Each method, the identity and the raw model "
            "(at its fastest call size, in the driver) are timed in three interleaved "
            "rounds, best round each.", "",
            "Peak RSS is the largest VmHWM of the Python workers during the timed run.", "",
            table(results["scoring"], floatfmt="{:,.2f}"), "",
            "![scoring throughput](benchmarks.png)", "", "Targets:", ""]
        lines += [f"- {line}" for line in scoring_targets(results["scoring"], results["facts"])]
        lines += ["", "Facts: " + ", ".join(f"{k} = {v:.1f}" if isinstance(v, float) else f"{k} = {v}"
                                         for k, v in results["facts"].items()), "",
                  "Reading the memory rows: peak RSS is taken while a worker scores, so it includes "
                  "TensorFlow's buffers for one batch of activations (for the CNN at batch 64, one "
                  "118x158x32 float32 activation is 152 MB) and whatever earlier methods left in "
                  "that reused worker; it is an upper bound, not the cost of holding the model. "
                  "The weights themselves are held once per worker: the unpickled broadcast "
                  "bytes are dropped after the build (tests/test_spark_broadcast.py checks it).", ""]
        blocks["scoring"] = lines
        plot(results["scoring"], os.path.join(docs, "benchmarks.png"))
    if "memory" in results:
        lines = start("memory") + [
            "N Python workers (`local[N]`, one task each, all running at once in a barrier "
            "stage) hold one large MLP: `BroadcastModel(spark, model, "
            "share_weights=False)`, a copy of the weights in every worker (`copy per "
            "worker`, the behaviour before shared weights), against the default "
            "`share_weights=True`, where the executor's first worker writes the payload to "
            "one file and every worker builds its model on weights mapped copy-on-write "
            "from it (`shared file`). Each N and mode runs in a fresh session. A warm-up "
            "job imports Keras and runs one op in every worker; then each worker waits at "
            "a barrier (every worker has TensorFlow mapped), reads its PSS, builds the "
            "model through `bm.predictor` and scores its rows as `transform` does, waits "
            "at a second barrier until all N hold the model, and reads its PSS again. "
            "The predictions are checked against `model.predict`.", "",
            "PSS (proportional set size, from `/proc/self/smaps`) splits each page among "
            "the processes mapping it: a page of the shared file mapped by 4 workers "
            "counts a quarter in each, so the sum of the workers' PSS growths is the "
            "memory the N workers really added, the shared file counted once. "
            "`x weights` is that sum over the size of the weights. `anon MB` is private "
            "(anonymous) memory, `file MB` the payload file's pages; code (the "
            "interpreter and shared libraries, TensorFlow's among them) is left out of "
            "the growth and shown apart, since its share moves whenever unrelated "
            "processes on the host map the same libraries. `weights mapped %` is the "
            "smallest share of weight bytes on the mapped file "
            "(`cache_info()[\"memory_by_key\"]`); build seconds per worker are "
            "`cache_info()[\"build_seconds\"]` (on the shared file they include waiting "
            "for the worker that writes it).", "",
            table(results["memory"], floatfmt="{:,.2f}"), "", "Targets:", ""]
        blocks["memory"] = lines + [f"- {line}" for line in memory_targets(results["memory"])] + [""]
    if "dask" in results:
        blocks["dask"] = start("dask") + [
            "Seconds per `client.submit(f, model).result()` on a 2-worker LocalCluster: "
            "Keras's own pickling, `make_picklable` (the payload), and a `ship()` handle "
            "(first call builds, later calls hit the worker's cache).", "",
            table(results["dask"]), ""]
    if "coldstart" in results:
        lines = start("coldstart") + [
            "Spark forks each Python worker from a daemon; with "
            "`spark.python.worker.reuse=false` every task gets a fresh worker. The stock "
            "daemon (`spark.python.daemon.module=pyspark.daemon`) against the preloading "
            "one (`spark_keras.spark.daemon`, which imported TensorFlow and Keras before "
            "forking), each in its own `local[2]` session (the daemon module is fixed per "
            "SparkContext) with the settings of `conf/spark-defaults.conf` (one TensorFlow "
            "and OpenMP thread per worker); the two alternate, one session each per round, "
            "taking turns at going first, after a throwaway session that warms the driver's "
            "JVM; every session first measures its first job, then runs a warm-up job (RDD and SQL) of trivial tasks to "
            "start its daemons.", "",
            "Cold start, per task in a fresh worker, for the MLP and the CNN of the scoring "
            "section: `time.perf_counter()` from the task function's first line through "
            "`import tensorflow, keras`, the `BroadcastModel` build (`bm.value`, on the "
            "executor's shared payload file) and the first prediction (`bm.predictor` on "
            "64 rows for the MLP, 8 for the CNN: tracing its `tf.function` and running it); "
            "reading the PSS in between is not counted. Fork to task start (from "
            "`/proc/self/stat`, 10 ms resolution) is the time before the task function "
            "runs: PySpark's worker setup and unpickling the task (`the same from the fork` "
            "adds it to the cold start less the build). Worker PSS is `Pss:` "
            "of `/proc/self/smaps_rollup`, read in the same tasks right after the imports, "
            "before any model exists: the preloaded TensorFlow pages are shared with the "
            "daemon and counted in part. The transform job is `bm.transform(df, "
            "\"features\")` on the MLP over a cached DataFrame, collected with `toArrow()`, "
            "one fresh worker per partition. Daemon start is the time from a daemon "
            "process's start to its first fork, paid once per executor and worker pool "
            "(RDD and SQL tasks have separate daemons). The host load average tells whether "
            "other work shared the 2 cores during the run.", "",
            "Every task checks that its parent is the daemon the session asked for (the "
            "preloading daemon falls back to the stock one when forking would be unsafe). "
            "The predictions of both daemons are bit-identical (cold-start tasks input by "
            "input, the transform row by row) and close to the driver's `model.predict`: "
            "the benchmark fails otherwise. Goals: a cold start, less the model build, of "
            "at most 0.5 s with the preloading daemon; its workers' PSS at least 40% lower "
            "than with the stock daemon.", "",
            table(results["coldstart"]), "", "Targets:", ""]
        blocks["coldstart"] = lines + [f"- {line}" for line in coldstart_targets(results["coldstart"])] + [""]
    if "frontends" in results:
        blocks["frontends"] = start("frontends") + [
            "The MLP of the scoring section (64 float32 features, batch size 1024) scored "
            "through each non-UDF front-end's public API, side by side with the model alone "
            "(`model(x, training=False)` on numpy batches in one process; `x raw` is the ratio "
            "to it): `df.select(\"features\").rdd.mapPartitions(bm.predict_partition).count()` "
            "on local[2] (a cached DataFrame of 4 partitions, one TensorFlow thread per worker), "
            "after a warm-up; `pool_predict(model, x, processes=2)` on a numpy array, the "
            "spawn pool's start included (every call starts one); `predict_dask(ship(client, "
            "model), ...).compute()` on a dask array and on a dask DataFrame of 64 scalar "
            "columns, both persisted on a 2-worker LocalCluster in 4 chunks, after a warm-up. "
            "Best of 2. Each front-end's predictions are compared with `model.predict` on a "
            "few rows: the benchmark stops if one differs.", "",
            table(results["frontends"], floatfmt="{:,.2f}"), ""]
    if "inputs" in results:
        lines = start("inputs") + [
            "A text model (`keras.Input((), dtype=\"string\")`, `TextVectorization` over a "
            "100-word vocabulary, `Embedding`, `Dense`) on a string column of short random "
            "sentences (3 to 12 words), and an image model (PNG bytes decoded in its graph by "
            "a registered layer, 64 x 64 x 3, two convolutions, `Dense`) on a binary column of "
            "photo-like PNGs (about 8.6 kB each; 2,000 distinct images, repeated), in one "
            "local[2] session, each DataFrame "
            "cached in 8 partitions. Methods as in the scoring section, on the same batch "
            "size: `predict_batch_udf` turns each batch's strings or bytes into a "
            "`tf.constant` and calls `model.predict`; the hand-written `mapInArrow` turns "
            "each Arrow batch's column into one `tf.string` tensor "
            "(`tf.constant(column.to_numpy(zero_copy_only=False))`, the fastest way tried: "
            "`tf.constant(column.to_pylist())` is as fast on text and slower on bytes, "
            "`tf.strings.substr` over the Arrow data buffer much slower on bytes) and calls "
            "a `tf.function` of the model cached per worker. Each method is built once, "
            "then the methods take turns (3 rounds, each run after a warm-up on 5% of the "
            "rows), best run kept; the first warm-up's predictions are checked against the "
            "model called directly on the same rows. The target is `transform` within 10% "
            "of the hand-written one (`x best case`).", "",
            table(results["inputs"], floatfmt="{:,.2f}"), "",
            "Variable-length sequences: a GRU (`Input((None, 3))`, 16 units) on an "
            "`array<array<float>>` column whose rows have one length (40 steps), 4 distinct "
            "lengths (10, 30, 50, 70) or 64 (8 to 71), every batch holding every length "
            "(the mean length is 40 in each case, so each holds the same work). `transform` "
            "groups the rows of a batch by shape and calls the model once per shape, so that "
            "each prediction is the model's on that row alone; the raw rows are the model "
            "alone on one batch of 1,024 such rows, grouped by length by hand (one compiled "
            "call per length). Predictions checked as above; best of 3 runs.", "",
            table(results["inputs_lengths"], floatfmt="{:,.2f}"), "",
            "Reading the sequence rows: the raw rows are the model's own cost of meeting many "
            "lengths in one batch (more calls, of fewer rows each); what separates `transform` "
            "from them is Spark's hand-over of 120 nested floats per row and the engine's per-row "
            "work on inputs with unknown dimensions (each row's shape read, rows grouped by "
            "shape, each group stacked).", "", "Targets:", ""]
        blocks["inputs"] = lines + [f"- {line}" for line in inputs_targets(
            results["inputs"], results["inputs_lengths"])] + [""]
    if "threads" in results:
        blocks["threads"] = start("threads") + [
            "`BroadcastModel.transform` of a 256-512-512-8 MLP on local[2], each mode in its own "
            "session after a warm-up build in every worker, best of the timed runs (noop sink). "
            "spark_keras sizes TensorFlow's pools to the task's CPUs (`TaskContext.cpus()`) before "
            "the runtime starts; `SPARK_KERAS_TF_THREADS=off` leaves TensorFlow's defaults (every "
            "worker sizes its pools to all the host's cores). The pools are the ones the workers' "
            "build log recorded.", "",
            table(results["threads"], floatfmt="{:,.2f}"), ""]
    if "operations" in results:
        blocks["operations"] = start("operations") + [
            "`BroadcastModel.transform` on local[2] with `on_invalid=\"null\"` (one row in 1,000 "
            "null) of two MLPs: the bench's fast 64-256-256-8 (1,000,000 rows) and a 15x heavier "
            "64-1024-1024-8 (200,000 rows); plain against with `error_col`, with `observe` (an "
            "`Observation` of rows, invalid rows, model builds and build seconds) and with both. "
            "The modes interleaved after a warm-up of each, 7 rounds (noop sink): the best runs' "
            "ratio and the median over the rounds of each run against the same round's plain run. "
            "\"plain again\" measures the plain transform twice: the spread of identical work on "
            "this machine. The last row observes the plain transform's output with "
            "`df.observe` alone (rows, null predictions; no build figures). Target: within 5%.", "",
            table(results["operations"], floatfmt="{:,.3f}"), ""]
    return blocks


def _read_blocks(path: str) -> tuple[dict[str, str], dict[str, list[str]], list[list[str]]]:
    """An existing docs file: the header's ``- name: value`` fields, the blocks of the
    known sections, and any other ``## `` blocks (kept as they are, after the known ones)."""
    import os

    fields: dict[str, str] = {}
    known: dict[str, list[str]] = {}
    other: list[list[str]] = []
    if not os.path.exists(path):
        return fields, known, other
    with open(path) as f:
        lines = f.read().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    for line in lines[:heads[0] if heads else len(lines)]:
        if line.startswith("- ") and ": " in line:
            name, _, value = line[2:].partition(": ")
            fields[name] = value
    by_title = {title: name for name, title in TITLES.items()}
    for i, j in zip(heads, [*heads[1:], len(lines)]):
        block = lines[i:j]
        name = by_title.get(block[0])
        if name is None:
            other.append(block)
        else:
            known[name] = block
    return fields, known, other


def _with_run_line(block: list[str], fields: dict[str, str]) -> list[str]:
    """A kept block, with the line naming its run; written before runs were recorded per
    section, it takes the run from the old header's command, date, machine and wall time."""
    if any(line.startswith(RUN_PREFIX) for line in block[:4]) or "command" not in fields:
        return block
    took = f"{fields['wall time']} for the whole run" if "wall time" in fields else "whole run"
    line = run_line(fields["command"].strip("`"), fields.get("date", "?"), fields.get("machine", "?"), took)
    return [block[0], "", line, *block[1:]]


def write_docs(results: dict, docs: str | None = None) -> None:
    """Rewrite the sections in ``results`` in docs/benchmarks.md (benchmarks-tf-keras.md
    under tf-keras); the sections this run did not measure are kept as they were, each
    with the line naming the run that produced it."""
    import os

    docs = docs or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    legacy = results.get("flavour") == "tf_keras"
    path = os.path.join(docs, "benchmarks-tf-keras.md" if legacy else "benchmarks.md")
    fields, kept, other = _read_blocks(path)
    fresh = _sections(results, docs)
    make = ("`make bench-tf-keras` runs `TF_USE_LEGACY_KERAS=1 python -m bench --only payload --write`"
            if legacy else "`make bench` runs `python -m bench --write`, every section")
    lines = ["# Benchmarks under legacy tf-keras 2.x" if legacy else "# Benchmarks", "",
             f"Generated by the benchmark itself ({make}; `python -m bench --only <sections> "
             "--write` rewrites those sections and keeps the others). Each section names the "
             "command, date and machine of the run that produced it; the numbers of a section "
             "come from that one run, all its ratios measured side by side in it.", ""]
    blocks = [fresh[name] if name in fresh else _with_run_line(kept[name], fields)
              for name in TITLES if name in fresh or name in kept]
    for block in [*blocks, *other]:
        while block and not block[-1].strip():
            block = block[:-1]
        lines += [*block, ""]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")


def section_main(prog: str, heading: str, run: Callable[[bool, int], list[dict]], floatfmt: str,
                 argv: list[str] | None = None) -> int:
    """``python -m bench.<section>``: one section alone, ``--quick`` and ``--repeats``
    passed to ``run(quick, repeats)``, its table printed under ``heading``."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"\n{heading}, local[2], {os.cpu_count()} cores\n")
    print(table(run(args.quick, args.repeats), floatfmt=floatfmt))
    return 0
