"""What the sections of docs/benchmarks.md on large models across executors, the score
job's commits and images measure, their tables and targets (:mod:`bench.doc_bodies` has
the others; :mod:`bench.docs` puts the blocks together)."""

from __future__ import annotations

from bench.report import table
from bench.report import targets_block as _targets
from bench.targets import (
    commits_targets,
    images_targets,
    large_targets,
    resume_kill_targets,
)


def _large(results: dict) -> list[str]:
    return [
        "A model of 2.1 GiB of weights (`Input((4096,))`, 34 tanh `Dense(4096)`, `Dense(8)`) on "
        "local-cluster[2,1,1024] with Spark's default heaps (driver 1 GiB, executors 1 GiB; "
        "only `spark.executor.memoryOverhead` raised), each path in a fresh driver process: "
        "`BroadcastModel(spark, model)` (ship seconds), then the first "
        "`transform(df).collect()` of 32 rows in 2 partitions (seconds from the ship's start: "
        "the payload lands on the executors and a worker of each builds the model; the workers "
        "had started and imported Keras before). Predictions compared with the driver's, "
        "partition by partition on one thread (exact: bit-identical). Every process's peak "
        "resident set (GiB, from /proc every 50 ms; a worker's includes the pages of the "
        "mapped payload file, shared with the page cache) and the workers' private memory "
        "(`RssAnon`) at its peak above its value at the end. `ship='auto'`: chunk broadcasts "
        "(8 MiB chunks, each a Spark broadcast, written into each executor's file); "
        "`ship='driver'`: the driver's file, streamed by the driver's channel to each "
        "executor. `file://` URI: each executor "
        "reads the file from storage. `ship='broadcast'`: the path every model took before "
        "(a broadcast, in the JVMs' heaps), with the default heap and with a 5 GiB one.", "",
        table(results["large"], floatfmt="{:,.2f}"), "",
        *large_targets(results["large"]), ""]


def _commits(results: dict) -> list[str]:
    from bench import commit_cost, resume_kill
    from bench.commits_bench import (
        CLUSTER,
        FEATURES,
        FILES,
        FILES_PER_COMMIT,
        PROGRESS_SECONDS,
        ROWS_PER_FILE,
    )

    lines = [
        f"The score job's Python entry point (`spark_keras.jobs.score.run.score`, what "
        f"`spark-keras score` runs) in one local[2] session, then one on {CLUSTER} (two "
        f"executor JVMs of 2 task slots: more slots than a group's tasks, 6 groups in "
        f"flight), on a parquet input of {FILES} "
        f"files x {ROWS_PER_FILE:,} rows of {FEATURES} float32 features (an array column), "
        f"a small MLP ({FEATURES}-64-64-4): the plain job (no `--resume`, `--no-progress`: one "
        f"write, one rename) against `--resume` with the default settings (a commit per file "
        f"of this input: 4 groups in flight on local[2], groups of at most a tenth of the "
        f"input over them), `--resume` with commits of {FILES_PER_COMMIT} files each "
        f"(`--commit-bytes`) and `--resume --progress` with the default settings "
        f"(`--progress-seconds {PROGRESS_SECONDS:g}`, so the short runs log their periodic "
        f"lines too; the lines formatted and written to a buffer). Wall time of the call "
        f"(reading the input's metadata, planning, shipping the model, scoring, writing, "
        f"publishing), each run into a fresh output folder; a warm-up of each mode, then the "
        f"modes alternated in rounds: median rows/s and the median over the rounds of each "
        f"run against the same round's plain run. \"plain again\": the plain job twice per "
        f"round, the spread of identical work. Every run's rows checked. Target: within 5%.", "",
        table(results["commits"], floatfmt="{:,.3f}"), ""]
    for key, module in (("commit_cost", commit_cost), ("resume_kill", resume_kill)):
        if key in results:
            lines += [module.described(), "", table(results[key], floatfmt="{:,.2f}"), ""]
    targets = commits_targets(results["commits"]) + \
        resume_kill_targets(results.get("resume_kill", []))
    return lines + [*_targets(targets), ""]


def _images(results: dict) -> list[str]:
    from bench.images_bench import BATCH_SIZE, DISTINCT, PARTITIONS

    rows = results["images"][0]["rows"]
    return [
        f"MobileNetV2 (224 x 224 x 3, random weights, `preprocess_input`'s scaling in the model, "
        f"1,000 logits) on local[2], {rows:,} rows ({DISTINCT} distinct photo-like PNGs of about "
        f"96 kB, repeated) in {PARTITIONS} cached partitions, calls of {BATCH_SIZE} rows, noop "
        f"sink. `model alone`: one process per core (2, spawned), each with one TensorFlow "
        f"intra-op and one inter-op thread (what spark_keras gives each of local[2]'s Python "
        f"workers: a task of one CPU), scoring its half of the rows as decoded float32 arrays "
        f"already in memory (`model(x, training=False)` compiled, as spark_keras calls it); its "
        f"rows/s is all the rows over the wall time until both are done. `transform, Spark image "
        f"rows`: `BroadcastModel.transform` on a column of `spark.read.format(\"image\")` rows "
        f"(decoded by the JVM when cached; the engine turns BGR bytes into RGB float32). "
        f"`transform, PNG bytes`: the same model behind a PNG decoder in its graph "
        f"(`tf.io.decode_png`, a registered layer) on a binary column of the files: its decoding "
        f"is work the model alone does not do. Each transform's predictions on 5% of the rows "
        f"checked against the model alone on the same images first. The modes alternate after a "
        f"warm-up of each, each transform's timed run after a warm-up on 5% of its rows (Spark "
        f"stops Python workers idle for a minute, as they are while the model alone runs): "
        f"median rows/s, the median over the rounds of each transform run "
        f"against the same round's model-alone run, and the CPU the Python processes (the two "
        f"spawned ones, or Spark's two workers) and the driver's JVM used per row (medians): "
        f"on a machine others share, the CPU per row tells where the work went when the wall "
        f"times cannot. Target: 0.9x the model alone.", "",
        table(results["images"], floatfmt="{:,.3f}"), "",
        _IMAGES_READING, "",
        *_targets(images_targets(results["images"])), ""]


_IMAGES_READING = (
    'Reading the rows: on this shared 2-core machine (the load average is in the table) the w'
    'all times move by tens of percent from one run to the next, so the ratios are medians of'
    ' per-round ratios and the CPU per row is shown beside them. Before commit 06185af the en'
    'gine converted a whole Arrow batch of image rows at once (up to 64 MiB of pixels: a uint'
    '8 copy, a gather per image for BGR to RGB, a float32 array 4x the batch); py-spy on a Sp'
    'ark worker then found 55-61% of its Python samples in that float32 conversion and 21-24%'
    " in the per-image reordering, against 11-18% in the model call's Python side and 3-4% re"
    "ading Arrow from the socket (the model's own compute runs with the GIL released), and th"
    'is section measured image rows at 0.61x the model alone (PNG bytes 0.69x; load 6-8.5; th'
    "at run's transforms did not yet warm up before each timed run). Now each call's rows are"
    " converted in one pass when the call takes them, the next call's made in a background th"
    "read while the model computes: the Spark workers' CPU per row is the model alone's, and "
    "what is left is the JVM's (reading the cached rows, moving them to Python: about 1-2 ms "
    "of CPU per row, 3-5% of the model's 38-40 ms).")
