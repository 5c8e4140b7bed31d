"""Row ids (issue 34): with ``id_col`` errors and ``error_col`` reasons name a row by that
column's value, a record an operator can find, through every Spark front-end
(``transform``, ``predict_partition``, ``KerasTransformer(idCol=...)``). Real local
Spark, real Keras."""

from __future__ import annotations

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.ml import KerasTransformer
from tests import models

NAN = float("nan")


@pytest.fixture(scope="module")
def bm(spark):
    return sk.BroadcastModel(spark, models.mlp(4, 8, 1))


@pytest.fixture(scope="module")
def df(spark):
    """Ids that are not row numbers (1000, 1010...), two bad rows: a NaN and a short one."""
    rows = [(f"order-{1000 + 10 * i}", [float(i)] * 4) for i in range(30)]
    rows[7] = (rows[7][0], [1.0, NAN, 2.0, 3.0])
    rows[21] = (rows[21][0], [1.0, 2.0])
    return spark.createDataFrame(rows, "order string, f array<double>").coalesce(1)


def test_error_col_reasons_name_the_rows_by_id(bm, df):
    out = bm.transform(df, "f", on_invalid="null", error_col="error", id_col="order") \
        .where("error is not null").orderBy("order").collect()
    assert [r.order for r in out] == ["order-1070", "order-1210"]
    assert "row order='order-1070'" in out[0].error and "NaN" in out[0].error, out[0].error
    assert "row order='order-1210'" in out[1].error and "of this batch" not in out[1].error
    without = bm.transform(df, "f", on_invalid="null", error_col="error") \
        .where("error is not null").orderBy("order").collect()
    assert "of this batch" in without[0].error and "order=" not in without[0].error  # a place


def test_a_failed_task_names_the_row_by_id(bm, df):
    with pytest.raises(Exception, match=r"row order='order-1070'"):
        bm.transform(df, "f", id_col="order").collect()


def test_an_id_column_must_exist(bm, df):
    with pytest.raises(sk.ModelInputError, match="'nope'"):
        bm.transform(df, "f", id_col="nope")


def test_predict_partition_names_rows_by_their_id_field(bm, df):
    rows = df.rdd.mapPartitions(
        lambda part: bm.predict_partition(part, on_invalid="null", id_col="order")).collect()
    assert len(rows) == 30 and rows[7] is None and rows[21] is None
    assert all(r is not None for i, r in enumerate(rows) if i not in (7, 21))
    with pytest.raises(Exception, match=r"row order='order-1070'"):
        df.rdd.mapPartitions(lambda part: bm.predict_partition(part, id_col="order")).collect()


def test_keras_transformer_id_col_is_saved_with_the_stage(df, tmp_path):
    stage = KerasTransformer(model=models.mlp(4, 8, 1), inputCol="f", onInvalid="null",
                             errorCol="error", idCol="order")
    stage.save(str(tmp_path / "stage"))
    loaded = KerasTransformer.load(str(tmp_path / "stage"))
    assert loaded.getIdCol() == "order"
    errors = sorted(r.error for r in loaded.transform(df).where("error is not null").collect())
    assert len(errors) == 2 and "row order='order-1070'" in errors[0] \
        and "row order='order-1210'" in errors[1], errors
    got = loaded.transform(df).where("error is null").select("prediction").collect()
    assert len(got) == 28 and np.isfinite([r.prediction for r in got]).all()


def test_a_row_without_an_id_is_still_a_row(spark, bm):
    """A null id (transform) or a row lacking the id field (predict_partition, under
    "null") costs no row: it is scored, or if invalid named by its number."""
    frame = spark.createDataFrame([("a", [1.0] * 4), (None, [NAN] * 4), ("c", [2.0] * 4)],
                                  "order string, f array<double>").coalesce(1)
    out = bm.transform(frame, "f", on_invalid="null", error_col="error", id_col="order") \
        .collect()
    assert [r.error is None for r in out] == [True, False, True]
    assert "row 1 of this batch (order is null)" in out[1].error, out[1].error
    dicts = [{"order": "a", "f": [1.0] * 4}, {"f": [3.0] * 4}, {"order": "c", "f": [NAN] * 4}]
    rdd = spark.sparkContext.parallelize(dicts, 1)
    got = rdd.mapPartitions(
        lambda part: bm.predict_partition(part, on_invalid="null", id_col="order")).collect()
    assert len(got) == 3 and got[0] is not None and got[1] is not None and got[2] is None
    with pytest.raises(Exception, match=r"row 1 of this partition has no such field"):
        rdd.mapPartitions(lambda part: bm.predict_partition(part, id_col="order")).collect()
