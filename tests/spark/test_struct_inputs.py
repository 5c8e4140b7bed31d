"""Spark's own ``predict_batch_udf`` test cases (pyspark/ml/tests/test_functions.py:
identity, scalar columns, struct input, named inputs, one and two tensor columns,
multiple named outputs), ported to Keras models and run through ``predict_udf`` (the
Arrow UDF and the pandas fallback) and ``transform`` on a struct column."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pyspark.sql.functions import col, struct

import spark_keras as sk
from tests.spark.test_inputs import pandas_fallback

DATA = np.arange(0, 1000, dtype=np.float64).reshape(-1, 4)
COLUMNS = ["a", "b", "c", "d"]


def linear(n_in: int, kernel: np.ndarray, name: str | None = None) -> keras.Layer:
    return keras.layers.Dense(kernel.shape[1], use_bias=False, dtype="float64", name=name,
                              kernel_initializer=keras.initializers.Constant(kernel))


def identity_model(width: int, outputs: list[str] | None = None) -> keras.Model:
    x = keras.Input((width,), dtype="float64")
    if outputs is None:
        return keras.Model(x, keras.layers.Identity(dtype="float64")(x))
    eye = np.eye(width)
    return keras.Model(x, {name: linear(width, eye[:, [i]], name)(x)
                           for i, name in enumerate(outputs)})


def sum_model(names: list[str] | None = None, widths=(4,)) -> keras.Model:
    """The sum of every input value: one (4,) input, or named inputs of ``widths``."""
    if names is None:
        x = keras.Input((widths[0],), dtype="float64")
        return keras.Model(x, linear(widths[0], np.ones((widths[0], 1)))(x))
    inputs = {n: keras.Input((w,), dtype="float64", name=n) for n, w in zip(names, widths)}
    parts = [linear(w, np.ones((w, 1)))(inputs[n]) for n, w in zip(names, widths)]
    total = parts[0] if len(parts) == 1 else keras.layers.Add(dtype="float64")(parts)
    return keras.Model(inputs, total)


@pytest.fixture(scope="module")
def frames(spark):
    import pandas as pd

    pdf = pd.DataFrame(DATA, columns=COLUMNS)
    tensors = pd.DataFrame({"t1": pdf.values.tolist(), "t2": pdf.drop(columns="d").values.tolist()})
    return spark.createDataFrame(pdf).coalesce(1), spark.createDataFrame(tensors).coalesce(1)


def both_udfs(df, bm, *columns, output="preds"):
    """The Arrow UDF's and the pandas fallback's results, as pandas frames."""
    arrow = df.withColumn(output, bm.predict_udf()(*columns)).toPandas()
    with pandas_fallback():
        pandas = df.withColumn(output, bm.predict_udf()(*columns)).toPandas()
    return [arrow, pandas]


def test_identity(spark, frames):
    df, _ = frames
    bm = sk.BroadcastModel(spark, identity_model(1))
    for given in (struct("a"), col("a"), "a"):
        for preds in both_udfs(df, bm, given):
            assert preds["a"].equals(preds["preds"])
    two = sk.BroadcastModel(spark, identity_model(2, ["a1", "b1"]))
    for given in ((struct("a", "b"),), (col("a"), col("b")), ("a", "b")):
        for preds in both_udfs(df, two, *given):
            a1 = np.array([r["a1"] for r in preds["preds"]])
            b1 = np.array([r["b1"] for r in preds["preds"]])
            assert np.array_equal(preds["a"], a1) and np.array_equal(preds["b"], b1)


def test_transform_scalar(spark, frames):
    df, _ = frames
    want = np.sum(DATA, axis=1)
    single = sk.BroadcastModel(spark, sum_model())  # struct fields stacked as features
    named = sk.BroadcastModel(spark, sum_model(COLUMNS, (1, 1, 1, 1)))  # matched by name
    renamed = sk.BroadcastModel(spark, sum_model(["a1", "b1", "c1", "d1"], (1, 1, 1, 1)))
    for bm in (single, named, renamed):
        for preds in both_udfs(df, bm, struct(*COLUMNS)):
            assert np.array_equal(want, preds["preds"].to_numpy())
        scored = bm.transform(df.withColumn("s", struct(*COLUMNS)), "s", "preds").toPandas()
        assert np.array_equal(want, scored["preds"].to_numpy())


def test_transform_single_tensor(spark, frames):
    _, tensors = frames
    bm = sk.BroadcastModel(spark, sum_model())
    t1 = tensors.select("t1")
    for preds in both_udfs(t1, bm, struct("t1")):
        assert np.array_equal(np.sum(DATA, axis=1), preds["preds"].to_numpy())
    scored = bm.transform(t1.withColumn("s", struct("t1")), "s", "preds").toPandas()
    assert np.array_equal(np.sum(DATA, axis=1), scored["preds"].to_numpy())


def test_transform_multi_tensor(spark, frames):
    _, tensors = frames
    want = np.sum(DATA, axis=1) + np.sum(DATA[:, 0:3], axis=1)
    bm = sk.BroadcastModel(spark, sum_model(["t1", "t2"], (4, 3)))
    for given in (struct("t1", "t2"), struct("t2", "t1")):  # by name, in any order
        for preds in both_udfs(tensors, bm, given):
            assert np.array_equal(want, preds["preds"].to_numpy())
    scored = bm.transform(tensors.withColumn("s", struct("t2", "t1")), "s", "preds").toPandas()
    assert np.array_equal(want, scored["preds"].to_numpy())


def test_return_multiple(spark, frames):
    df, _ = frames
    x = keras.Input((1,), dtype="float64")
    model = keras.Model(x, {"x2": linear(1, np.array([[2.0]]), "x2")(x),
                            "x3": linear(1, np.array([[3.0]]), "x3")(x)})
    bm = sk.BroadcastModel(spark, model)
    for preds in both_udfs(df, bm, "a"):
        x2 = np.array([r["x2"] for r in preds["preds"]])
        x3 = np.array([r["x3"] for r in preds["preds"]])
        assert np.array_equal(DATA[:, 0] * 2, x2) and np.array_equal(DATA[:, 0] * 3, x3)


def test_struct_errors_name_the_field(spark, frames):
    df, tensors = frames
    bm = sk.BroadcastModel(spark, sum_model(["t1", "t2"], (4, 3)))
    with pytest.raises(Exception, match=r"3 column\(s\) \['t1', 't2', 'a'\] given for a model "
                                        r"with 2 inputs"):
        tensors.withColumn("a", col("t1")).select(bm.predict_udf()(struct("t1", "t2", "a"))).collect()
    bad = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], [1.0, 2.0])], "t1 array<double>, t2 array<double>")
    with pytest.raises(Exception, match=r"column 't2': each row holds 2 values"):
        bad.select(bm.predict_udf()(struct("t1", "t2"))).collect()
    null_struct = spark.createDataFrame([(None,)], "s struct<t1: array<double>, t2: array<double>>")
    assert null_struct.select(bm.predict_udf(on_invalid="null")("s").alias("p")).first().p is None
