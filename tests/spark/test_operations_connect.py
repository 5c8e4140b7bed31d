"""``error_col`` and ``observe`` on Spark Connect (a real local Connect server; see
tests/spark/test_operations.py for classic Spark and streaming)."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")
pytest.importorskip("zstandard")

import spark_keras as sk  # noqa: E402
from tests.models import mlp  # noqa: E402
from tests.spark.test_connect import worker_caches  # noqa: E402
from tests.spark.test_operations import BAD, N_FEATURES, joined, rows_with_bad_ones  # noqa: E402

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # a Connect server of its own: 90 s here


def test_error_col_and_observed_figures_on_connect(connect):
    from pyspark.sql import Observation

    frame = connect.createDataFrame(rows_with_bad_ones(), "id long, features array<double>") \
        .repartition(3)
    bm = sk.BroadcastModel(connect, mlp(N_FEATURES))
    observation = Observation("connect")
    out = bm.transform(frame, "features", on_invalid="null", error_col="error",
                       observe=observation)
    assert out.columns == ["id", "features", "prediction", "error"]
    errors = {r.id: r.error for r in out.collect() if r.error is not None}
    figures = observation.get
    assert figures["rows"] == 30 and figures["invalid_rows"] == 3, figures
    assert figures["invalid_by_reason"] == {"input: null": 1, "input: NaN": 1,
                                            "input: shape": 1}, figures
    assert sorted(errors) == sorted(BAD) and "NaN or infinite" in errors[11]
    # the workers' caches: every build of this model happened in that query
    caches = worker_caches(connect, bm)
    builds = sum(i["builds_by_key"].get(bm.key, 0) for i in caches.values())
    assert figures["model_builds"] == builds >= 1, (figures, caches)
    with pytest.raises(sk.ArgumentError, match="needs on_invalid='null'"):
        bm.transform(frame, "features", error_col="error")


def test_repeated_column_names_and_a_ddl_return_type_on_connect(connect):
    from pyspark.sql import Observation
    from pyspark.sql.types import DoubleType

    bm = sk.BroadcastModel(connect, mlp(N_FEATURES))
    df = joined(connect)
    observation = Observation("joined")
    out = bm.transform(df, "features", on_invalid="null", error_col="error",
                       observe=observation)
    assert out.columns == ["id", "tag", "features", "id", "tag", "prediction", "error"]
    rows = out.collect()
    assert sorted(r[0] for r in rows if r.error is not None) == sorted(BAD)
    assert observation.get["rows"] == 30 and observation.get["invalid_rows"] == 3
    udf = bm.predict_udf(return_type="double", on_invalid="null")
    assert udf.returnType == DoubleType()
    scored = df.select(udf("features").alias("p")).collect()
    assert len(scored) == 30 and sum(r.p is None for r in scored) == len(BAD)
    with pytest.raises(sk.ArgumentError, match="return_type 'array<doubel>'"):
        bm.predict_udf(return_type="array<doubel>")


def test_the_score_job_on_connect_resumes_a_partitioned_table_and_its_quarantine(connect, tmp_path):
    """The job's Python entry point on a Connect session (pyarrow paths on the client):
    ``--output-table`` with ``--resume``, ``--partition-by`` and ``--invalid-output``; a
    rerun after the last group was lost scores that group only; the table and the
    quarantine hold each row once, the reasons counted."""
    from spark_keras.jobs.score.arrow_paths import ArrowPaths
    from spark_keras.jobs.score.run import score
    from tests.jobs.test_score_outputs import BAD, CLASSES, FILES, ROWS, job_args, predictions, write_data

    data = write_data(tmp_path)
    connect.sql(f"CREATE DATABASE sk_connect_job LOCATION '{tmp_path / 'warehouse'}'")
    try:
        name = "sk_connect_job.scored"
        args = job_args(data, "--output-table", name, "--partition-by", "k", "--on-invalid",
                        "null", "--id-col", "id", "--invalid-output", str(tmp_path / "q"),
                        per_group=2)
        first = score(connect, ArrowPaths(), args)
        assert first["groups"] == 2 and first["invalid_by_reason"] == CLASSES, first
        reference = connect.table(name).toPandas().sort_values("id").reset_index(drop=True)
        assert reference["id"].tolist() == list(range(FILES * ROWS))
        log = tmp_path / "warehouse" / "scored" / "_spark_keras" / "commits"
        (log / "g00001.json").unlink()
        second = score(connect, ArrowPaths(), args)
        assert (second["groups"], second["groups_skipped"]) == (1, 1), second
        again = connect.table(name).toPandas().sort_values("id").reset_index(drop=True)
        assert again["id"].tolist() == reference["id"].tolist()
        assert predictions(again) == predictions(reference)
        held = connect.read.parquet(str(tmp_path / "q")).toPandas()
        assert sorted(held["id"]) == BAD and set(held["model_version"]) == {"1"}
    finally:
        connect.sql("DROP DATABASE sk_connect_job CASCADE")
