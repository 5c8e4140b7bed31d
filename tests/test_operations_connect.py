"""``error_col`` and ``observe`` on Spark Connect (a real local Connect server; see
tests/test_operations.py for classic Spark and streaming)."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")
pytest.importorskip("zstandard")

import spark_keras as sk  # noqa: E402

from .models import mlp  # noqa: E402
from .test_operations import BAD, N_FEATURES, joined, rows_with_bad_ones  # noqa: E402
from .test_spark_connect import worker_caches  # noqa: E402

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
