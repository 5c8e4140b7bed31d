"""Operating a scoring job: per-row error reasons (``error_col``) and observed figures
(``observe``: rows, invalid rows, model builds) on local Spark, in a streaming query, in
``KerasTransformer`` and in the score job."""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.inference import columns as cols
from spark_keras.inference import predictor_for
from spark_keras.inference.engine import score
from spark_keras.spark.figures import reasons_observed
from tests.conftest import builds_by_worker
from tests.models import mlp

SPARK_4 = int(__import__("pyspark").__version__.split(".")[0]) >= 4

N_FEATURES = 4
BAD = {3: None, 11: [1.0, float("nan"), 0.0, 2.0], 22: [1.0, 2.0, 3.0]}  # null, NaN, short


def rows_with_bad_ones(n: int = 30) -> list[tuple[int, list[float] | None]]:
    rng = np.random.default_rng(7)
    return [(i, BAD[i] if i in BAD else rng.standard_normal(N_FEATURES).tolist())
            for i in range(n)]


def image_column(sizes: list[tuple[int, int]]) -> pa.StructArray:
    """Rows of Spark's image data source: 8-bit BGR images of the given sizes."""
    return pa.array([{"origin": f"img{i}.png", "height": h, "width": w, "nChannels": 3,
                      "mode": 16, "data": bytes(h * w * 3)} for i, (h, w) in enumerate(sizes)],
                    pa.struct([("origin", pa.string()), ("height", pa.int32()),
                               ("width", pa.int32()), ("nChannels", pa.int32()),
                               ("mode", pa.int32()), ("data", pa.binary())]))


def image_model():
    import keras

    return keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Flatten(),
                             keras.layers.Dense(1)])


@pytest.mark.parametrize("case", ["lists", "images"])
def test_each_reason_is_the_error_the_row_raises_alone(case):
    """The engine's reason for each invalid row is the error ``on_invalid="error"`` raises
    for that row (numbered as in the batch), less the count and the hint; valid rows have
    none, and their predictions are those of the batch without reasons."""
    if case == "lists":
        model = mlp(N_FEATURES)
        arr = pa.array([r for _, r in rows_with_bad_ones(12)], pa.list_(pa.float64()))
        bad = [3, 11]
        classes = ["input: null", "input: NaN"]
    else:
        model = image_model()
        arr = image_column([(4, 4), (4, 4), (5, 4), (4, 4), (3, 3)])
        bad = [2, 4]
        classes = ["input: image size", "input: image size"]
    handle = SimpleNamespace(predictor=predictor_for(model))
    scored = score(handle, cols.from_arrow(["x"], [arr]), batch_size=8, on_invalid="null",
                   reasons=True)
    assert np.flatnonzero(scored.invalid).tolist() == bad
    assert [i for i, r in enumerate(scored.reasons) if r is not None] == bad
    assert [(i, c) for i, c in enumerate(scored.classes) if c is not None] == list(zip(bad, classes))
    for row in bad:
        with pytest.raises(sk.ModelInputError) as raised:
            score(handle, cols.from_arrow(["x"], [arr[row:row + 1]]), batch_size=8,
                  first_row=row)
        alone = re.sub(r" \(1 invalid row\(s\) in this batch\)", "", str(raised.value))
        alone = alone[:alone.rindex(" (on_invalid=")]
        assert scored.reasons[row] == alone
        assert scored.reasons[row].startswith("column 'x': ")
    plain = score(handle, cols.from_arrow(["x"], [arr]), batch_size=8, on_invalid="null")
    assert plain.reasons is None
    np.testing.assert_array_equal(plain.outputs[0], scored.outputs[0])
    if case == "images":
        assert "(img2.png) is 5 x 4 x 3; the model input takes 4 x 4 x 3" in scored.reasons[2]


@pytest.fixture(scope="module")
def frame(spark):
    return spark.createDataFrame(rows_with_bad_ones(), "id long, features array<double>") \
        .repartition(3)


@pytest.fixture(scope="module")
def bm(spark):
    """One handle for the module: the first test using it sees all its builds."""
    return sk.BroadcastModel(spark, mlp(N_FEATURES))


def test_error_col_and_observed_figures(build_log, frame, bm):
    from pyspark.sql import Observation

    with pytest.raises(sk.ArgumentError, match="error_col='error' needs on_invalid='null'"):
        bm.transform(frame, "features", error_col="error")
    with pytest.raises(sk.ArgumentTypeError, match="observe must be"):
        bm.transform(frame, "features", observe=3)

    first = Observation("first")
    out = bm.transform(frame, "features", on_invalid="null", error_col="error", observe=first)
    assert out.columns == ["id", "features", "prediction", "error"]
    got = {r.id: (r.prediction, r.error) for r in out.collect()}
    figures = first.get
    assert figures["rows"] == 30 and figures["invalid_rows"] == 3, figures
    # by class of reason: what is wrong, without where (row 3 null, 11 NaN, 22 short)
    assert isinstance(figures["invalid_by_reason"], dict if SPARK_4 else str)  # 3.5: JSON
    assert reasons_observed(figures["invalid_by_reason"]) == {"input: null": 1, "input: NaN": 1,
                                            "input: shape": 1}, figures
    errors = {i: e for i, (_, e) in got.items() if e is not None}
    assert sorted(errors) == sorted(BAD)
    assert all(got[i][0] is None for i in BAD) and all(got[i][0] is not None
                                                       for i in got if i not in BAD)
    assert "null value(s)" in errors[3] and "NaN or infinite" in errors[11]
    assert "3 values" in errors[22] and "4 are expected" in errors[22]
    assert all(e.startswith("column 'features': ") for e in errors.values())
    # every build of this model so far happened in this query's tasks
    builds = sum(builds_by_worker(build_log, bm.key).values())
    assert figures["model_builds"] == builds >= 1, (figures, builds)
    assert figures["build_seconds"] > 0

    # a second query: workers that have the model cached build nothing for it
    second = Observation("second")
    bm.transform(frame, "features", on_invalid="null", observe=second).count()
    more = sum(builds_by_worker(build_log, bm.key).values()) - builds
    assert second.get["model_builds"] == more and second.get["rows"] == 30, second.get
    assert second.get["invalid_rows"] == 3
    assert sum(reasons_observed(second.get["invalid_by_reason"]).values()) == 3  # classes made without error_col
    clean = Observation("clean")
    bm.transform(frame.where(~frame.id.isin(list(BAD))), "features", on_invalid="null",
                 observe=clean).count()
    assert clean.get["invalid_rows"] == 0 and reasons_observed(clean.get["invalid_by_reason"]) == {}
    assert (second.get["build_seconds"] > 0) == (more > 0)


def test_streaming_query_reports_the_figures(spark, bm, tmp_path):
    import pyarrow.parquet as pq

    folder = tmp_path / "in"
    folder.mkdir()
    for part in range(2):
        rows = rows_with_bad_ones()[part * 15:(part + 1) * 15]
        pq.write_table(pa.table({"id": pa.array([i for i, _ in rows], pa.int64()),
                                 "features": pa.array([r for _, r in rows],
                                                      pa.list_(pa.float64()))}),
                       folder / f"part-{part}.parquet")
        # the file source orders by modification time; files written within one
        # clock tick tie and come in listing order (Spark 3.5 took part-1 first)
        os.utime(folder / f"part-{part}.parquet", (1_700_000_000 + part * 60,) * 2)
    stream = spark.readStream.schema("id long, features array<double>") \
        .option("maxFilesPerTrigger", 1).parquet(str(folder))
    scored = bm.transform(stream, "features", on_invalid="null", error_col="error",
                          observe="scoring")
    query = (scored.writeStream.format("parquet").option("path", str(tmp_path / "sink"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None, query.exception()
    observed = [p["observedMetrics"]["scoring"] for p in query.recentProgress
                if p["numInputRows"]]
    assert len(observed) == 2, query.recentProgress
    assert sum(o["rows"] for o in observed) == 30
    assert sum(o["invalid_rows"] for o in observed) == 3
    assert [o["invalid_rows"] for o in observed] == [2, 1]  # rows 3, 11 | row 22
    assert [reasons_observed(o["invalid_by_reason"]) for o in observed] == \
        [{"input: null": 1, "input: NaN": 1}, {"input: shape": 1}]
    sink = spark.read.parquet(str(tmp_path / "sink")).where("error is not null")
    assert sorted(r.id for r in sink.select("id").collect()) == sorted(BAD)


def test_keras_transformer_error_col(frame, bm):
    from spark_keras.ml import KerasTransformer

    stage = KerasTransformer(model=bm, inputCol="features", onInvalid="null", errorCol="why")
    out = stage.transform(frame).where("why is not null").select("id", "why").collect()
    assert sorted(r.id for r in out) == sorted(BAD)
    assert KerasTransformer().getErrorCol() is None
    with pytest.raises(sk.ArgumentError, match="errorCol='why' needs onInvalid='null'"):
        stage.copy().setOnInvalid("error").transform(frame)


def test_keras_transformer_error_col_is_saved(spark, frame, tmp_path):
    from spark_keras.ml import KerasTransformer

    stage = KerasTransformer(model=mlp(N_FEATURES), inputCol="features", onInvalid="null",
                             errorCol="why", maxInvalid=3)
    stage.write().save(str(tmp_path / "stage"))
    loaded = KerasTransformer.load(str(tmp_path / "stage"))
    assert loaded.getErrorCol() == "why" and loaded.getOnInvalid() == "null"
    assert loaded.getMaxInvalid() == 3 and KerasTransformer().getMaxInvalid() is None
    out = loaded.transform(frame.coalesce(1)).where("why is not null").select("id", "why").collect()
    assert sorted(r.id for r in out) == sorted(BAD)
    with pytest.raises(Exception, match=r"InvalidRowsError: max_invalid=2 passed: 3 of 30 rows"):
        loaded.copy().setMaxInvalid(2).transform(frame.coalesce(1)).collect()
    with pytest.raises(sk.ArgumentError, match="maxInvalid"):
        loaded.copy().setMaxInvalid(2.5)


@pytest.mark.slow  # three jobs on this module's session
def test_score_job_error_col_and_metrics_json(spark, build_log, tmp_path):
    """--error-col and --metrics-json through the job's Python entry point on this
    module's session (the job's command line runs end to end in tests/jobs/test_score_job.py
    (--on-invalid null, its SCORED line) and test_score_resume.py (--metrics-json, Connect)):
    the figures, the SCORED line main() prints, the error column; --error-col without
    --on-invalid null and past --max-invalid: main()'s line and exit status 2."""
    import pyarrow.parquet as pq

    from spark_keras.jobs.score.errors import outcome
    from spark_keras.jobs.score.files import HadoopPaths
    from spark_keras.jobs.score.main import parse_args, scored_line
    from spark_keras.jobs.score.run import score

    rows = rows_with_bad_ones()
    pq.write_table(pa.table({"id": pa.array([i for i, _ in rows], pa.int64()),
                             "features": pa.array([r for _, r in rows], pa.list_(pa.float64()))}),
                   tmp_path / "in.parquet")
    sk.save(mlp(N_FEATURES), str(tmp_path / "model.skp"))
    metrics = tmp_path / "metrics.json"

    def job(out: str, *more: str) -> dict:
        return score(spark, HadoopPaths(spark), parse_args([
            "--model", str(tmp_path / "model.skp"), "--input", str(tmp_path / "in.parquet"),
            "--output", str(tmp_path / out), "--features", "features", *more]))

    builds = len(read_build_log(build_log))  # this session's workers' builds so far
    summary = job("out", "--on-invalid", "null", "--error-col", "error",
                  "--metrics-json", str(metrics))
    line = scored_line(summary, 0.0)  # what main() prints
    assert line.startswith("SCORED rows=30 invalid_rows=3 "), line
    figures = json.loads(metrics.read_text())
    assert figures["rows"] == 30 and figures["invalid_rows"] == 3
    assert figures["model_builds"] == len(read_build_log(build_log)) - builds >= 1
    assert f"model_builds={figures['model_builds']} " in line
    out = pq.read_table(str(tmp_path / "out")).to_pandas()
    assert sorted(out.loc[out["error"].notna(), "id"]) == sorted(BAD)
    with pytest.raises(Exception) as bad:
        job("out2", "--error-col", "error")
    line, status = outcome(bad.value)  # the line main() prints, and its exit status
    assert status == 2 and "needs --on-invalid null" in line, line
    assert not os.path.exists(tmp_path / "out2")
    with pytest.raises(Exception) as over:  # a worker's InvalidRowsError, through Spark
        job("out3", "--on-invalid", "null", "--max-invalid", "2")
    line, status = outcome(over.value)
    assert status == 2 and "max_invalid=2 passed: 3 of 30" in line, line


@pytest.mark.parametrize("output_col", ["p.x`y", "a b"])
def test_observed_figures_under_quoted_regex_column_names(spark, frame, bm, output_col):
    """``spark.sql.parser.quotedRegexColumnNames=true`` (a documented Spark setting): a
    quoted name in SQL text is a regular expression there, so figures built from SQL text
    failed for an output column holding a dot or a space (INVALID_USAGE_OF_STAR_OR_REGEX,
    found by a review attack); built from columns they are the same as ever."""
    from pyspark.sql import Observation

    spark.conf.set("spark.sql.parser.quotedRegexColumnNames", "true")
    try:
        seen = Observation("regex")
        bm.transform(frame, "features", output_col=output_col, on_invalid="null",
                     error_col="why it", observe=seen).count()
        assert seen.get["rows"] == 30 and seen.get["invalid_rows"] == 3, seen.get
    finally:
        spark.conf.unset("spark.sql.parser.quotedRegexColumnNames")


def test_builds_made_by_a_sorts_sampling_job_are_observed(build_log, spark):
    """A sort runs the scoring plan twice: first in a sampling job (whose observation
    Spark drops), where the workers build the model, then in the observed job, which
    finds it cached; the observed job still reports those builds."""
    from pyspark.sql import Observation

    fresh = sk.BroadcastModel(spark, mlp(N_FEATURES))  # no worker has it yet
    observation = Observation("sorted")
    frame = spark.createDataFrame(rows_with_bad_ones(), "id long, features array<double>") \
        .repartition(8)  # every worker runs tasks of both jobs
    out = fresh.transform(frame, "features", on_invalid="null", error_col="error",
                          observe=observation).orderBy("id").collect()
    assert [r.id for r in out] == list(range(30))
    assert sorted(r.id for r in out if r.error is not None) == sorted(BAD)
    figures = observation.get
    import pyspark

    # Spark 4 drops the sampling job's observation; 3.5 adds it to the observed job's
    times = 1 if int(pyspark.__version__.split(".")[0]) >= 4 else 2
    assert figures["rows"] == 30 * times and figures["invalid_rows"] == 3 * times, figures
    builds = sum(builds_by_worker(build_log, fresh.key).values())
    assert figures["model_builds"] == builds >= 1, (figures, builds)
    assert figures["build_seconds"] > 0


def test_each_stage_of_a_query_reports_its_builds_once():
    from spark_keras.spark.figures import BuildLedger

    ledger = BuildLedger(keep=2)
    ledger.add("m", "q1", 1, 0.5)  # built in the sampling stage 0
    assert ledger.report("m", "q1", 0) == (1, 0.5)
    assert ledger.report("m", "q1", 1) == (1, 0.5)  # the observed stage 1 reports it too
    assert ledger.report("m", "q1", 1) == (0, 0.0)  # once
    ledger.add("m", "q1", 1, 0.25)
    assert ledger.report("m", "q1", 1) == (1, 0.25)
    assert ledger.report("other", "q1", 1) == (0, 0.0)
    assert ledger.report("m", "q2", 1) == (0, 0.0)  # another query: not its builds
    ledger.add("m", "q3", 2, 1.0)  # keeps the last two (model, query) entries
    assert ledger.report("m", "q1", 0) == (0, 0.0)


def joined(spark):
    """A join's output: ``id, tag, features, id, tag`` (two names twice)."""
    left = spark.createDataFrame([(i, f"l{i}", r) for i, r in rows_with_bad_ones()],
                                 "id long, tag string, features array<double>")
    right = spark.createDataFrame([(i, f"r{i}") for i in range(30)], "id long, tag string")
    return left.join(right, left.id == right.id)


def test_error_col_and_observe_on_a_join_with_repeated_column_names(spark, bm):
    from pyspark.sql import Observation

    df = joined(spark)
    assert df.columns == ["id", "tag", "features", "id", "tag"]
    observation = Observation("joined")
    out = bm.transform(df, "features", on_invalid="null", error_col="error",
                       observe=observation)
    assert out.columns == ["id", "tag", "features", "id", "tag", "prediction", "error"]
    rows = out.collect()
    assert sorted((r[0], r[1], r[3], r[4]) for r in rows) \
        == [(i, f"l{i}", i, f"r{i}") for i in range(30)]
    assert sorted(r[0] for r in rows if r.error is not None) == sorted(BAD)
    assert all((r.prediction is None) == (r[0] in BAD) for r in rows)
    figures = observation.get
    assert figures["rows"] == 30 and figures["invalid_rows"] == 3, figures
    with pytest.raises(sk.ModelInputError, match="input column 'tag' is ambiguous"):
        bm.transform(df, "tag")


def test_the_mapinarrow_path_takes_repeated_column_names(spark, bm):
    """The path of ``profile=`` and of PySpark < 4.1 (``mapInArrow``, which names every
    column of the DataFrame)."""
    import functools

    from pyspark.sql.types import StringType, StructField

    from spark_keras.spark import transform
    from spark_keras.spark.scoring import scored_columns
    from spark_keras.spark.types import prediction_type

    fields = [StructField("prediction", prediction_type(bm.signature)),
              StructField("error", StringType())]
    score_batches = functools.partial(scored_columns, bm, ["features"], batch_size=64,
                                      on_invalid="null", reasons=True, figures=False)
    out = transform._with_mapinarrow_columns(joined(spark), score_batches, ["features"],
                                             fields, None)
    assert out.columns == ["id", "tag", "features", "id", "tag", "prediction", "error"]
    rows = out.collect()
    assert sorted((r[1], r[4]) for r in rows) == sorted((f"l{i}", f"r{i}") for i in range(30))
    assert sorted(r[0] for r in rows if r.error is not None) == sorted(BAD)
