"""Plain-text tables for benchmark rows."""

from __future__ import annotations


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
                info.append(f"[info] {workload} ({variant}) transform / ceiling 1/(1/raw+1/identity), "
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


def write_docs(results: dict) -> None:
    import os

    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    legacy = results.get("flavour") == "tf_keras"
    lines = ["# Benchmarks under legacy tf-keras 2.x" if legacy else "# Benchmarks", "",
             f"Generated by the benchmark itself (`{'make bench-tf-keras' if legacy else 'make bench'}` "
             f"runs `{results['command']}`); "
             "numbers from one run, all ratios measured side by side in that run.", "",
             f"- command: `{results['command']}`", f"- machine: {results['machine']}",
             f"- date: {results['date']}", f"- wall time: {results['seconds']:.0f} s", ""]
    if "payload" in results:
        lines += ["## Model rebuild: Keras pickle vs spark_keras payload", "",
                  "`pickle.loads(pickle.dumps(m))` (Keras's own `.keras`-in-a-pickle path) against "
                  "`spark_keras.loads(spark_keras.dumps(m))` and against "
                  "`spark_keras.load(path, share_weights=True)` on a payload file written once "
                  "beforehand (its pages in the page cache), the way an executor's Python "
                  "workers build a `BroadcastModel` (with Keras 3 on TensorFlow the variables "
                  "are views of the mapped file; elsewhere the weights are copied), in the same "
                  "Keras flavour. Loads times are the best of the repeats, alternating the "
                  "three paths. Goal: the file load at least 3x faster than pickle.", "",
                  table(results["payload"]), "", "Targets:", ""]
        lines += [f"- {line}" for line in payload_targets(results["payload"])] + [""]
    if "scoring" in results:
        lines += ["## Scoring throughput on local[2]", "",
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
                  "- `ceiling 1/(1/raw+1/identity)`: the two combined, an idealized bound (no "
                  "overlap, no contention between the workers) reported for information, not "
                  "a target (`x ceiling`).", "",
                  "Peak RSS is the largest VmHWM of the Python workers during the timed run.", "",
                  table(results["scoring"], floatfmt="{:,.2f}"), "",
                  "![scoring throughput](benchmarks.png)", "", "Targets:", ""]
        lines += [f"- {line}" for line in scoring_targets(results["scoring"], results["facts"])]
        lines += ["", "Facts: " + ", ".join(f"{k} = {v:.1f}" for k, v in results["facts"].items()), "",
                  "Reading the memory rows: peak RSS is taken while a worker scores, so it includes "
                  "TensorFlow's buffers for one batch of activations (for the CNN at batch 64, one "
                  "118x158x32 float32 activation is 152 MB) and whatever earlier methods left in "
                  "that reused worker; it is an upper bound, not the cost of holding the model. "
                  "The weights themselves are held once per worker: the unpickled broadcast "
                  "bytes are dropped after the build (tests/test_spark_broadcast.py checks it).", ""]
        plot(results["scoring"], os.path.join(docs, "benchmarks.png"))
    if "memory" in results:
        lines += ["## Memory: N Python workers holding one model", "",
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
        lines += [f"- {line}" for line in memory_targets(results["memory"])] + [""]
    if "dask" in results:
        lines += ["## Dask: sending a model to a task", "",
                  "Seconds per `client.submit(f, model).result()` on a 2-worker LocalCluster: "
                  "Keras's own pickling, `make_picklable` (the payload), and a `ship()` handle "
                  "(first call builds, later calls hit the worker's cache).", "",
                  table(results["dask"]), ""]
    name = "benchmarks-tf-keras.md" if legacy else "benchmarks.md"
    with open(os.path.join(docs, name), "w") as f:
        f.write("\n".join(lines))
