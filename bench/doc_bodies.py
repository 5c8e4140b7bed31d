"""What each section of docs/benchmarks.md on the library measures, its tables and targets:
the block after the section's heading and run line (:mod:`bench.docs` puts the blocks
together; :mod:`bench.doc_bodies_jobs` has the sections on clusters, the job and images)."""

from __future__ import annotations

from bench.plots import image_line
from bench.report import table
from bench.report import targets_block as _targets
from bench.targets import (
    coldstart_targets,
    inputs_targets,
    isolation_targets,
    keyed_targets,
    memory_targets,
    payload_targets,
    scoring_targets,
)


def _payload(results: dict) -> list[str]:
    return [
        "`pickle.loads(pickle.dumps(m))` (Keras's own `.keras`-in-a-pickle path) against "
        "`spark_keras.loads(spark_keras.dumps(m))` and against "
        "`spark_keras.load(path, share_weights=True)` on a payload file written once "
        "beforehand (its pages in the page cache), the way an executor's Python "
        "workers build a `BroadcastModel` (with Keras 3 on TensorFlow the variables "
        "are views of the mapped file; elsewhere the weights are copied), in the same "
        "Keras flavour. Loads times are the best of the repeats, alternating the "
        "three paths. Goal: the file load at least 3x faster than pickle.", "",
        table(results["payload"]), "", *_targets(payload_targets(results["payload"])), ""]


def _scoring(results: dict) -> list[str]:
    return [
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
        "![scoring throughput](benchmarks.png)", "", image_line("scoring-vs-ceiling.png"), "",
        *_targets(scoring_targets(results["scoring"], results["facts"])), "",
        "Facts: " + ", ".join(f"{k} = {v:.1f}" if isinstance(v, float) else f"{k} = {v}"
                              for k, v in results["facts"].items()), "",
        "Reading the memory rows: peak RSS is taken while a worker scores, so it includes "
        "TensorFlow's buffers for one batch of activations (for the CNN at batch 64, one "
        "118x158x32 float32 activation is 152 MB) and whatever earlier methods left in "
        "that reused worker; it is an upper bound, not the cost of holding the model. "
        "The weights themselves are held once per worker: the unpickled broadcast "
        "bytes are dropped after the build (tests/spark/test_broadcast.py checks it).", ""]


def _memory(results: dict) -> list[str]:
    return [
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
        table(results["memory"], floatfmt="{:,.2f}"), "", image_line("memory-per-executor.png"), "",
        *_targets(memory_targets(results["memory"])), ""]


def _dask(results: dict) -> list[str]:
    return [
        "Seconds per `client.submit(f, model).result()` on a 2-worker LocalCluster: "
        "Keras's own pickling, `make_picklable` (the payload), and a `ship()` handle "
        "(first call builds, later calls hit the worker's cache).", "",
        table(results["dask"]), ""]


def _coldstart(results: dict) -> list[str]:
    return [
        "Spark forks each Python worker from a daemon; with "
        "`spark.python.worker.reuse=false` every task gets a fresh worker. The stock "
        "daemon (`spark.python.daemon.module=pyspark.daemon`) against the preloading "
        "one (`spark_keras.executor.daemon`, which imported TensorFlow and Keras before "
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
        table(results["coldstart"]), "", *_targets(coldstart_targets(results["coldstart"])), ""]


def _frontends(results: dict) -> list[str]:
    return [
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


def _inputs(results: dict) -> list[str]:
    return [
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
        "Variable-length sequences: a masked GRU (`Input((None, 3))`, `Masking(0.0)`, 16 "
        "units) on an `array<array<float>>` column whose rows have one length (40 steps), 4 "
        "distinct lengths (10, 30, 50, 70) or 64 (8 to 71), every batch holding every length "
        "(the mean length is 40 in each case, so each holds the same work). `transform` "
        "groups the rows of a batch by shape and calls the model once per shape, so that "
        "each prediction is the model's on that row alone; with `buckets=8` it pads the "
        "rows of each batch (an Arrow batch of a partition: 2,500 rows) into the 8 lengths "
        "that pad the fewest steps and calls the model once per bucket (the mask keeps each "
        "prediction the row's own). The variants and transforms take turns in each round (3 "
        "rounds, each run after a warm-up), best run kept. The raw "
        "rows are the model alone on the rows transform's engine meets, one partition's "
        "Arrow batch (2,500 such rows), grouped by length by hand (compiled calls of up to "
        "1,024 rows per length), or bucketed as `buckets=8` buckets them (the same lengths "
        "chosen, padded with zeros by hand, calls of up to 1,024 rows per bucket). `padding %`: the "
        "padded steps among all the steps fed to the model. Predictions checked as above.", "",
        table(results["inputs_lengths"], floatfmt="{:,.2f}"), "",
        "Reading the sequence rows: the raw rows are the model's own cost of meeting many "
        "lengths in one batch (more calls, of fewer rows each); what separates `transform` "
        "from them is Spark's hand-over of 120 nested floats per row and the engine's per-row "
        "work on inputs with unknown dimensions (each row's shape read, rows grouped by "
        "shape, each group stacked or padded).", "",
        *_targets(inputs_targets(results["inputs"], results["inputs_lengths"])), ""]


def _threads(results: dict) -> list[str]:
    return [
        "`BroadcastModel.transform` of a 256-512-512-8 MLP on local[2], each mode in its own "
        "session after a warm-up build in every worker, best of the timed runs (noop sink). "
        "spark_keras sizes TensorFlow's pools to the task's CPUs (`TaskContext.cpus()`) before "
        "the runtime starts; `SPARK_KERAS_TF_THREADS=off` leaves TensorFlow's defaults (every "
        "worker sizes its pools to all the host's cores). The pools are the ones the workers' "
        "build log recorded.", "",
        table(results["threads"], floatfmt="{:,.2f}"), ""]


def _operations(results: dict) -> list[str]:
    return [
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


def _isolation(results: dict) -> list[str]:
    return [
        "`BroadcastModel.transform` on local[2] of two models that raise in their graph on "
        "some rows: the scoring MLP's shape behind a `tf.debugging.assert_less` (1,000,000 "
        "rows of 64 features; a failing row holds 50.0) and the PNG model (40,000 photo-like "
        "64 x 64 PNGs decoded in the graph; a failing row is not a PNG). `on_invalid=\"error\"` "
        "on clean input (the path of every clean batch before isolation existed), "
        "`on_invalid=\"null\"` on the same input (isolation armed, never used) and on input "
        "with 1 failing row per 10,000 (each costs a failed call of its batch of 1,024 rows "
        "and the search for it, by halves). The modes interleaved after a warm-up "
        "of each, 5 rounds (noop sink); the failing runs' null rows checked. Targets: clean "
        "within 3%, 1 failing row per 10,000 at 0.8x or better.", "",
        table(results["isolation"], floatfmt="{:,.3f}"), "",
        *isolation_targets(results["isolation"]), ""]


def _keyed(results: dict) -> list[str]:
    return [
        "Twelve scoring MLPs (64-256-256-1, each its own weights) on local[2], 20,000 rows "
        "per key (240,000 rows of 64 features), noop sink: twelve `BroadcastModel.transform` "
        "queries, each on the rows of its key (`df.where(key == k)` of one cached frame, the "
        "way it is done by hand), against one `KeyedModels.transform` on the frame clustered "
        "by key (`repartition(8, \"key\").sortWithinPartitions(\"key\")`, cached) and on the "
        "frame in random key order (every batch holds every key; a KeyedModels task makes room "
        "in each worker's model cache for every key's model, up to 64). Every row's prediction "
        "checked first against its key's own `BroadcastModel` (exact). The modes interleaved "
        "after a warm-up of each, 4 rounds. Then the executor's payload folder "
        "(local[2]: one executor): one file per model. Then the curve (issue 55 item 10): "
        "2, 5, 12, 20 and 50 models on the same 240,000 rows, the frame in random key order "
        "(8 partitions) against the rows clustered by key in 8 partitions of as many rows "
        "(`repartitionByRange(8, \"key\", \"id\")`, sorted within: a task holds a few keys, "
        "each in one run), each checked exact first (3 keys against their own "
        "`BroadcastModel`), one count at a time (another's models would turn the workers' "
        "caches over), the two modes interleaved after a warm-up of each, 4 rounds; a "
        "task puts consecutive "
        "batches of mixed keys together until each key has about two model calls' rows. "
        "Targets: clustered at 0.8x the twelve transforms or better; random order at 0.8x "
        "clustered with 12 models; on the curve 0.8x clustered up to 20 models, 0.5x with 50 "
        "(medians of the rounds' ratios).", "",
        table(results["keyed"], floatfmt="{:,.3f}"), "",
        table(results["keyed_memory"], floatfmt="{:,.2f}"), "",
        *([table(results["keyed_curve"], floatfmt="{:,.3f}"), ""] if "keyed_curve" in results else []),
        *keyed_targets(results["keyed"], results.get("keyed_curve", ())), ""]
