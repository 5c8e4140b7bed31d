"""One engine, three front-ends: the same bad rows give the same errors and the same
``on_invalid="null"`` results through Spark (transform, UDF, mapPartitions), Dask
(``predict_dask``) and multiprocessing (``pool_predict``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

import spark_keras as sk  # noqa: E402
from spark_keras.dask import predict_dask, ship  # noqa: E402
from spark_keras.multiprocessing import pool_predict  # noqa: E402
from tests import models  # noqa: E402

pytestmark = pytest.mark.timeout(600)

NAN = float("nan")
GOOD = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]

# name, the bad row (between the two good ones), what every front-end says about it
CASES = [
    ("null row", None, r"null value\(s\), first at row 1 of this"),
    ("null element", [1.0, None, 3.0], r"null array element\(s\), first at row 1 of this"),
    ("NaN", [1.0, NAN, 3.0], r"NaN or infinite value\(s\), first at row 1 of this"),
    ("infinity", [1.0, float("inf"), 3.0], r"NaN or infinite value\(s\), first at row 1 of this"),
    ("too short", [1.0, 2.0], r"ragged arrays: row 1 of this has 2 values where 3 are expected"),
    ("too long", [1.0, 2.0, 3.0, 4.0], r"ragged arrays: row 1 of this has 4 values"),
]
IDS = [c[0] for c in CASES]


def rows_with(bad):
    return [GOOD[0], bad, GOOD[1]]


@pytest.fixture(scope="module")
def model():
    return models.mlp(3, 4, 2)


@pytest.fixture(scope="module")
def expected(model):
    return np.asarray(model(np.array(GOOD, "float32"), training=False))


@pytest.fixture(scope="module")
def bm(spark, model):
    handle = sk.BroadcastModel(spark, model)
    yield handle
    handle.destroy()


@pytest.fixture(scope="module")
def dask_handle(model):
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        with ship(client, model) as handle:
            yield handle


def frame(spark, bad):
    data = [(i, r) for i, r in enumerate(rows_with(bad))]
    return spark.createDataFrame(data, "id long, f array<double>").coalesce(1)


def spark_results(bm, spark, bad, **kw):
    df = frame(spark, bad)
    by_transform = [r.prediction for r in bm.transform(df, "f", **kw).orderBy("id").collect()]
    by_udf = [r.p for r in df.select("id", bm.predict_udf(**kw)("f").alias("p"))
              .orderBy("id").collect()]
    by_rows = df.orderBy("id").select("f").rdd.mapPartitions(
        lambda rows: bm.predict_partition(rows, **kw)).collect()
    return {"transform": by_transform, "udf": by_udf, "partition": by_rows}


def dask_frame(pdf):
    import dask
    import dask.dataframe as dd

    # dask turns object columns into strings unless told not to: these hold arrays
    with dask.config.set({"dataframe.convert-string": False}):
        return dd.from_pandas(pdf, npartitions=1)


def dask_result(handle, bad, **kw):
    pdf = pd.DataFrame({"f": pd.Series(rows_with(bad), dtype=object)})
    return predict_dask(handle, dask_frame(pdf), **kw).compute()


def pool_result(model, bad, **kw):
    pdf = pd.DataFrame({"f": pd.Series(rows_with(bad), dtype=object)})
    return pool_predict(model, pdf, processes=1, **kw)


@pytest.mark.parametrize("name, bad, message", CASES, ids=IDS)
def test_the_same_error_everywhere(spark, bm, dask_handle, model, name, bad, message):
    pattern = rf"column 'f': {message}.*the model input '.*' expects float32 of shape \(3,\)"
    for run in (lambda: bm.transform(frame(spark, bad), "f").collect(),
                lambda: frame(spark, bad).select(bm.predict_udf()("f")).collect()):
        with pytest.raises(Exception, match=pattern.replace("of this", "of this batch")):
            run()
    with pytest.raises(Exception, match=pattern.replace("of this", "of this partition")):
        frame(spark, bad).select("f").rdd.mapPartitions(bm.predict_partition).collect()
    with pytest.raises(Exception, match=pattern.replace("of this", "of this partition")):
        dask_result(dask_handle, bad)
    with pytest.raises(sk.ModelInputError, match=pattern.replace("of this", "of this input")):
        pool_result(model, bad)


@pytest.fixture(scope="module")
def pool_nulls(model) -> dict[str, np.ndarray]:
    """``pool_predict(on_invalid="null")`` of every case's three rows, one after another in
    one input (one spawned pool, not one per case: each bad row is still among good ones),
    by case name."""
    rows = [row for _, bad, _ in CASES for row in rows_with(bad)]
    got = pool_predict(model, pd.DataFrame({"f": pd.Series(rows, dtype=object)}), processes=1,
                       on_invalid="null")
    return {name: got[3 * i:3 * i + 3] for i, name in enumerate(IDS)}


@pytest.mark.parametrize("name, bad, message", CASES, ids=IDS)
def test_the_same_nulls_everywhere(spark, bm, dask_handle, pool_nulls, expected, name, bad,
                                   message):
    for how, got in spark_results(bm, spark, bad, on_invalid="null").items():
        assert got[1] is None, how
        np.testing.assert_allclose(np.array([got[0], got[2]], "float32"), expected, atol=1e-6,
                                   err_msg=how)
    for got in (dask_result(dask_handle, bad, on_invalid="null").to_numpy(), pool_nulls[name]):
        assert np.isnan(got[1]).all()
        np.testing.assert_allclose(got[[0, 2]], expected, atol=1e-6)


def test_column_problems_raise_everywhere_even_with_the_null_policy(spark, bm, dask_handle, model):
    import dask.dataframe as dd

    pattern = r"column 'f' has type (large_)?string; the model input .* expects numbers"
    df = spark.createDataFrame([(0, "a")], "id long, f string")
    with pytest.raises(Exception, match=pattern):
        bm.transform(df, "f", on_invalid="null").collect()
    pdf = pd.DataFrame({"f": ["a", "b"]})
    with pytest.raises(Exception, match=pattern):
        predict_dask(dask_handle, dd.from_pandas(pdf, npartitions=1),
                     on_invalid="null").compute()
    with pytest.raises(sk.ModelInputError, match=pattern):
        pool_predict(model, pdf, on_invalid="null")
    for call in (lambda: bm.predict_udf(on_invalid="skip"),
                 lambda: predict_dask(dask_handle, dd.from_pandas(pdf, npartitions=1),
                                      on_invalid="skip"),
                 lambda: pool_predict(model, pdf, on_invalid="skip")):
        with pytest.raises(sk.ArgumentError, match="on_invalid must be one of"):
            call()


def test_empty_input_everywhere_has_the_output_dtype(spark, bm, dask_handle):
    int_model = models.mlp(3, 4, 2)
    empty = np.zeros((0, 3), "float32")
    out = pool_predict(int_model, empty)
    assert out.shape == (0, 2) and out.dtype == np.float32
    df = spark.createDataFrame([], "id long, f array<double>")
    assert bm.transform(df, "f").collect() == []
    pdf = pd.DataFrame({"f": pd.Series([], dtype=object)})
    got = predict_dask(dask_handle, dask_frame(pdf)).compute()
    assert got.shape == (0, 2) and (got.dtypes == np.float32).all()


@pytest.mark.slow  # 13 s of make test's 15 min
def test_pandas_nullable_columns_and_integer_labels_in_dask_and_the_pool(dask_handle, model,
                                                                       expected):
    import dask.dataframe as dd

    scalars = pd.DataFrame(np.array([GOOD[0], GOOD[0], GOOD[1]]))  # labels 0, 1, 2
    np.testing.assert_allclose(pool_predict(model, scalars, processes=1),
                               expected[[0, 0, 1]], atol=1e-6)
    nullable = scalars.astype("Float32")
    nullable.iloc[1, 2] = pd.NA
    with pytest.raises(sk.ModelInputError, match=r"column '2': null value\(s\), first at row 1"):
        pool_predict(model, nullable, processes=1)
    got = pool_predict(model, nullable, processes=1, on_invalid="null")
    assert np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, 2]], expected, atol=1e-6)
    nullable.columns = ["a", "b", "c"]  # dask needs string labels
    got = predict_dask(dask_handle, dd.from_pandas(nullable, npartitions=1),
                       on_invalid="null").compute().to_numpy()
    assert np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, 2]], expected, atol=1e-6)


def test_predict_udf_takes_a_ddl_return_type(spark, bm, expected):
    """``return_type`` as a DDL string, as ``pandas_udf`` takes it (the UDF of PySpark
    >= 4.1 is an ``arrow_udf``, which needs a DataType)."""
    from pyspark.sql.types import ArrayType, DoubleType

    df = frame(spark, GOOD[1])  # three good rows
    out = df.select("id", bm.predict_udf(return_type="array<double>")("f").alias("p"))
    assert out.schema["p"].dataType == ArrayType(DoubleType())
    got = np.array([r.p for r in out.orderBy("id").collect()])
    np.testing.assert_allclose(got[[0, 2]], expected, atol=1e-6)
    assert bm.predict_udf(return_type=" DOUBLE ").returnType == DoubleType()
    with pytest.raises(sk.ArgumentError, match=r"return_type 'array<doubel>' is not a Spark SQL"):
        bm.predict_udf(return_type="array<doubel>")
    with pytest.raises(sk.ArgumentTypeError, match="return_type must be a pyspark.sql.types"):
        bm.predict_udf(return_type=3)
