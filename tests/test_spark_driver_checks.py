"""What the driver can see is refused on the driver (issue 34): a DataFrame's schema
against the model's signature at ``transform()`` / ``KerasTransformer.transform`` time,
before any task runs, with the :class:`ModelInputError` a worker's batch would raise.
Real local Spark, real Keras."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark.ml.functions import array_to_vector

import spark_keras as sk
from spark_keras.ml import KerasTransformer

from . import models


@pytest.fixture(scope="module")
def wide(spark):
    """A 20-feature model, broadcast."""
    return sk.BroadcastModel(spark, models.mlp(20, 8, 1))


@pytest.fixture(scope="module")
def df(spark):
    rows = [(1.0, 2.0, 3.0, "text", b"\x00", [0.5] * 20, True)]
    return spark.createDataFrame(rows, "a double, b double, c double, s string, raw binary, "
                                       "f array<double>, flag boolean")


def _jobs(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(None))


@pytest.mark.parametrize("columns, says", [
    (["a", "b", "c"], "3 columns ['a', 'b', 'c'] given; the model input"),
    ("s", "column 's' has type string; the model input"),
    ("raw", "column 'raw' has type binary"),
    ("flag", "column 'flag' has type bool"),
])
def test_transform_refuses_what_no_row_can_fix(spark, wide, df, columns, says):
    jobs = _jobs(spark)
    with pytest.raises(sk.ModelInputError, match=says.replace("[", r"\[").replace("]", r"\]")):
        wide.transform(df, columns)  # lazy: no action, the driver refused it
    assert _jobs(spark) == jobs  # no Spark job ran


def test_the_driver_says_what_a_worker_would(spark, wide, df):
    """The same text: a predict_udf (which cannot see the schema when it is made) fails in
    the worker with the message transform() gives on the driver."""
    with pytest.raises(sk.ModelInputError) as driver:
        wide.transform(df, "s")
    with pytest.raises(Exception) as worker:
        df.select(wide.predict_udf()("s")).collect()
    assert str(driver.value) in str(worker.value)


def test_columns_the_model_takes_pass_the_driver_check(spark, wide, df):
    vectors = df.withColumn("v", array_to_vector("f"))
    for column in ("f", "v"):  # an array column, an ML Vector
        got = wide.transform(vectors, column).collect()[0].prediction
        assert np.isfinite(got)
    # a row the schema cannot judge (a short array) is the workers' to find: not refused here
    short = spark.createDataFrame([([1.0, 2.0],)], "f array<double>")
    wide.transform(short, "f", on_invalid="null")  # no error: lazy, and legal on the driver


def test_a_preprocess_function_sees_the_columns_first(spark, df):
    """With ``preprocess=`` the model takes the function's output: no schema check."""
    def to_features(pdf):
        return np.full((len(pdf), 20), 0.5, "float32")

    bm = sk.BroadcastModel(spark, models.mlp(20, 8, 1), preprocess=to_features)
    out = bm.transform(df, "s").collect()
    assert np.isfinite(out[0].prediction)


def test_keras_transformer_refuses_on_the_driver(spark, df):
    stage = KerasTransformer(model=models.mlp(20, 8, 1), inputCol="s")
    jobs = _jobs(spark)
    with pytest.raises(sk.ModelInputError, match="column 's' has type string"):
        stage.transform(df)
    assert _jobs(spark) == jobs
