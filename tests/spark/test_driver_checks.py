"""What the driver can see is refused on the driver (issue 34): a DataFrame's schema
against the model's signature at ``transform()`` / ``KerasTransformer.transform`` time,
before any task runs, with the :class:`ModelInputError` a worker's batch would raise.
Real local Spark, real Keras."""

from __future__ import annotations

import contextlib
import uuid

import numpy as np
import pytest
from pyspark.ml.functions import array_to_vector

import spark_keras as sk
from spark_keras.ml import KerasTransformer
from tests import models


@pytest.fixture(scope="module")
def wide(spark):
    """A 20-feature model, broadcast."""
    return sk.BroadcastModel(spark, models.mlp(20, 8, 1))


@pytest.fixture(scope="module")
def df(spark):
    rows = [(1.0, 2.0, 3.0, "text", b"\x00", [0.5] * 20, True)]
    return spark.createDataFrame(rows, "a double, b double, c double, s string, raw binary, "
                                       "f array<double>, flag boolean")


@contextlib.contextmanager
def _counting_jobs(spark):
    """Gives a function counting the Spark jobs started in the block (in a job group of its
    own: the shared session's status tracker keeps only its last spark.ui.retainedJobs)."""
    sc = spark.sparkContext
    group = f"driver-checks-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "spark-keras driver checks")
    try:
        yield lambda: len(sc.statusTracker().getJobIdsForGroup(group))
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            sc.setLocalProperty(key, None)


def _assert_refused_on_the_driver(spark, action, says: str) -> None:
    """``action`` raises the driver's ModelInputError saying ``says``, and no Spark job
    starts (a task's failure would come as a PythonException, after a job started)."""
    with _counting_jobs(spark) as jobs:
        with pytest.raises(Exception) as raised:
            action()
        started = jobs()
    assert started == 0, f"{started} Spark job(s) started: {raised.value!s:.300}"
    assert type(raised.value) is sk.ModelInputError, raised.value  # the driver's, not a task's
    assert says in str(raised.value)


CASES = [
    (["a", "b", "c"], "3 columns ['a', 'b', 'c'] given; the model input"),
    ("s", "column 's' has type string; the model input"),
    ("raw", "column 'raw' has type binary"),
    ("flag", "column 'flag' has type bool"),
]


@pytest.mark.parametrize("columns, says", CASES)
def test_transform_refuses_what_no_row_can_fix(spark, wide, df, columns, says):
    """``transform()`` itself raises, on the driver: the action after it never starts.
    Without the driver check the action would start a job whose task raises (a
    PythonException, and a job counted: the control below)."""
    _assert_refused_on_the_driver(spark, lambda: wide.transform(df, columns).collect(), says)


@pytest.mark.parametrize("columns, says", CASES)
def test_the_driver_says_what_a_worker_would(spark, wide, df, columns, says):
    """The control of the test above: a predict_udf (which cannot see the schema when it is
    made) lets the action start a job, whose task fails with the message transform()
    gives on the driver."""
    with pytest.raises(sk.ModelInputError) as driver:
        wide.transform(df, columns)
    names = columns if isinstance(columns, list) else [columns]
    with _counting_jobs(spark) as jobs:
        with pytest.raises(Exception) as worker:
            df.select(wide.predict_udf()(*names)).collect()
        assert jobs() >= 1  # the counter sees the job a check left to the workers runs
    assert not isinstance(worker.value, sk.ModelInputError)  # a task's failure, as Spark reports it
    assert says in str(worker.value) and str(driver.value) in str(worker.value)


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
    _assert_refused_on_the_driver(spark, lambda: stage.transform(df).collect(),
                                  "column 's' has type string")
