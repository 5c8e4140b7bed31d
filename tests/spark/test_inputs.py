"""Spark-level input handling of the three scoring helpers (issue 15): batches and
partitions that are entirely invalid, misshapen ML Vectors under both policies, dict rows
and multi-output dicts in predict_partition, empty partitions, the PySpark < 4.1 pandas-UDF
fallback, and custom_objects / safe_mode on executors. Real local Spark, real Keras."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time

import keras
import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml.linalg import Vectors
from pyspark.sql import functions as F
from pyspark.sql.pandas import functions as pandas_functions

try:
    from pyspark.util import PythonEvalType
except ImportError:  # PySpark 3.5
    from pyspark.rdd import PythonEvalType

import spark_keras as sk
from tests import models
from tests.conftest import builds_by_worker

NAN, INF = float("nan"), float("inf")
ATOL = 1e-6


# --- helpers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model3() -> keras.Model:
    """3 features -> one unit (scalar predictions)."""
    return models.mlp(n_features=3, hidden=8, outputs=1, name="mlp3")


@pytest.fixture(scope="module")
def multi() -> keras.Model:
    return models.multi_io()


def expected_by_id(model: keras.Model, features: dict[int, list]) -> dict[int, np.ndarray]:
    """The model's own predictions (eager call) for the valid rows, by id."""
    ids = sorted(features)
    y = np.asarray(model(np.asarray([features[i] for i in ids], dtype="float32")))
    return dict(zip(ids, y))


def assert_predictions(got: list[tuple[int, object]], expected: dict[int, np.ndarray],
                       invalid: set[int]) -> None:
    """``got`` = (id, prediction) pairs: every row once, null exactly for ``invalid``,
    the model's own output (within 1e-6) for the others."""
    ids = [i for i, _ in got]
    assert len(ids) == len(expected) + len(invalid), ids
    assert set(ids) == set(expected) | invalid and len(set(ids)) == len(ids), ids
    by_id = dict(got)
    assert {i for i, p in by_id.items() if p is None} == invalid
    for i, want in expected.items():
        np.testing.assert_allclose(np.asarray(by_id[i], dtype=float).reshape(-1),
                                   np.asarray(want, dtype=float).reshape(-1), atol=ATOL,
                                   err_msg=f"row id {i}")


def via_transform(bm, df, col="f", **kw) -> list[tuple[int, object]]:
    out = bm.transform(df, col, **kw)
    assert out.columns == [*df.columns, "prediction"]
    return [(r.id, r.prediction) for r in out.collect()]


def via_udf(bm, df, *cols, **kw) -> list[tuple[int, object]]:
    cols = cols or ("f",)
    return [(r.id, r.p) for r in df.select("id", bm.predict_udf(**kw)(*cols).alias("p")).collect()]


def via_partitions(bm, df, col="f", **kw) -> list[tuple[int, object]]:
    """``rdd.mapPartitions(bm.predict_partition)`` over the feature column alone; ids
    come from the same partitions in the same order."""
    ids = [r.id for r in df.select("id").collect()]
    preds = df.select(col).rdd.mapPartitions(functools.partial(bm.predict_partition, **kw)).collect()
    assert len(preds) == len(ids), (len(preds), len(ids))
    return list(zip(ids, preds))


def partitioned(spark, rows, schema, partitions: int):
    """A DataFrame with ``rows`` split in order over ``partitions`` partitions, cached so
    actions read it from the JVM (no Python source feeding rows beside the scoring)."""
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, partitions), schema).cache()
    df.count()
    return df


def partition_ids(df) -> list[list[int]]:
    """The ids in each partition (a JVM-only query)."""
    rows = df.select("id", F.spark_partition_id().alias("part")).collect()
    parts: dict[int, list[int]] = {}
    for r in rows:
        parts.setdefault(r.part, []).append(r.id)
    return [sorted(parts.get(p, [])) for p in range(df.rdd.getNumPartitions())]


@contextlib.contextmanager
def arrow_batch_rows(spark, n: int):
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key, None)
    spark.conf.set(key, str(n))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def arrow_batch_sizes(df) -> list[int]:
    """The sizes of the Arrow batches a mapInArrow over ``df`` receives."""
    def sizes(batches):
        for b in batches:
            yield pa.RecordBatch.from_arrays([pa.array([b.num_rows], pa.int64())], names=["n"])

    return [r.n for r in df.mapInArrow(sizes, "n long").collect()]


def assert_built_once_per_worker(build_log: str, key: str, tasks: int,
                                 workers: set[int] | None = None) -> None:
    """Every worker that built ``key`` built it once, and workers served several of the
    ``tasks`` that scored from their cache (fewer builds than tasks).

    Not "at most 2 per pool" for local[2]: a task that finds no idle Python worker gets a
    new one, and on back-to-back jobs PySpark 4.3 was seen to run 3-4 live RDD workers
    under local[2] (a worker not yet returned to the pool when the next job started).
    When the workers that ran the tasks are known (``workers``), the builders are among
    them.
    """
    builds = builds_by_worker(build_log, key)
    assert builds, f"no worker built {key}"
    assert all(n == 1 for n in builds.values()), builds
    assert len(builds) < tasks, (builds, tasks)
    if workers is not None:
        assert {pid for _, pid in builds} <= workers, (builds, workers)


def tag_pid(score):
    """``score`` for mapPartitions, each result paired with the worker's pid."""
    def tagged(rows):
        pid = os.getpid()
        for result in score(rows):
            yield pid, result
    return tagged


def udf_eval_types(df) -> set[int]:
    """Python eval types of the UDFs in ``df``'s physical plan
    (``ArrowEvalPython [...], [...], <evalType>``)."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return {int(t) for t in re.findall(r"ArrowEvalPython .*, (\d+)\s*$", plan, flags=re.M)}


# --- 1. batches and partitions that are entirely invalid ---------------------------------

# 12 rows on one partition; with 3 rows per Arrow batch: all null | all valid | mixed |
# all invalid without a null (too short, too long, NaN)
BATCHED_ROWS = [(0, None), (1, None), (2, None),
                (3, [0.5, -1.0, 2.0]), (4, [1.5, 0.25, -0.75]), (5, [-2.0, 1.0, 3.0]),
                (6, [1.0, 2.0]), (7, None), (8, [0.1, 0.2, 0.3]),
                (9, [1.0, 2.0, 3.0, 4.0]), (10, [1.0, NAN, 2.0]), (11, [INF, 1.0, 2.0])]
# two partitions: the first entirely invalid, the second entirely valid
SPLIT_ROWS = [(0, None), (1, [1.0, 2.0]), (2, [NAN, 1.0, 1.0]), (3, None),
              (4, [1.0, 2.0, 3.0]), (5, [-1.0, 0.0, 1.0]), (6, [2.0, 2.0, -2.0]), (7, [0.3, 0.2, 0.1])]


def valid_features(rows, width=3):
    return {i: f for i, f in rows if f is not None and len(f) == width and np.isfinite(f).all()}


def test_all_invalid_batches_and_partitions_give_null_rows(spark, build_log, model3):
    bm = sk.BroadcastModel(spark, model3)
    schema = "id long, f array<double>"
    null = {"on_invalid": "null"}

    # one partition, one batch, every row invalid (two nulls, one too short)
    only_invalid = spark.createDataFrame([(0, None), (1, None), (2, [1.0, 2.0])], schema).coalesce(1)
    for got in (via_transform(bm, only_invalid, **null), via_udf(bm, only_invalid, **null),
                via_partitions(bm, only_invalid, **null)):
        assert_predictions(got, {}, {0, 1, 2})

    # one partition entirely invalid, the other entirely valid
    split = partitioned(spark, SPLIT_ROWS, schema, 2)
    assert partition_ids(split) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    expected = expected_by_id(model3, valid_features(SPLIT_ROWS))
    assert set(expected) == {4, 5, 6, 7}
    for got in (via_transform(bm, split, **null), via_udf(bm, split, **null),
                via_partitions(bm, split, batch_size=2, **null)):
        assert_predictions(got, expected, {0, 1, 2, 3})

    # small Arrow batches: some entirely null, some entirely invalid, some valid
    batched = spark.createDataFrame(BATCHED_ROWS, schema).coalesce(1)
    expected = expected_by_id(model3, valid_features(BATCHED_ROWS))
    assert set(expected) == {3, 4, 5, 8}
    invalid = {i for i, _ in BATCHED_ROWS} - set(expected)
    with arrow_batch_rows(spark, 3):
        assert arrow_batch_sizes(batched) == [3, 3, 3, 3]
        for got in (via_transform(bm, batched, batch_size=2, **null),
                    via_udf(bm, batched, batch_size=2, **null)):
            assert_predictions(got, expected, invalid)
    assert_predictions(via_partitions(bm, batched, batch_size=3, **null), expected, invalid)
    # 12 scoring tasks: 3 + 3 on one partition, 6 on two; SQL and RDD worker pools
    assert_built_once_per_worker(build_log, bm.key, tasks=12)


# --- 2. ML Vectors of the wrong size --------------------------------------------------------

GOOD = {6: [0.5, -1.0, 2.0], 8: [0.0, 3.0, 0.0], 10: [1.5, 0.25, -0.75]}
VECTOR_ROWS = [
    # partition 0: every vector misshapen (dense and sparse)
    (0, Vectors.dense([1.0, 2.0])), (1, Vectors.sparse(4, {0: 1.0, 3: 2.0})),
    (2, Vectors.dense([1.0, 2.0, 3.0, 4.0])), (3, Vectors.sparse(2, {1: 5.0})),
    (4, Vectors.dense([1.0])), (5, Vectors.sparse(6, {5: 1.0})),
    # partition 1: good and misshapen, dense and sparse, and a null
    (6, Vectors.dense(GOOD[6])), (7, Vectors.dense([1.0, 2.0])),
    (8, Vectors.sparse(3, {1: 3.0})), (9, Vectors.sparse(5, {1: 3.0})),
    (10, Vectors.dense(GOOD[10])), (11, None),
]
VECTOR_INVALID = {0, 1, 2, 3, 4, 5, 7, 9, 11}


@pytest.fixture(scope="module")
def vector_df(spark):
    df = partitioned(spark, VECTOR_ROWS, ["id", "v"], 2)
    assert partition_ids(df) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    return df


def test_misshapen_vectors_null_policy(spark, model3, vector_df):
    bm = sk.BroadcastModel(spark, model3)
    expected = expected_by_id(model3, GOOD)
    invalid = VECTOR_INVALID
    null = {"on_invalid": "null"}
    assert_predictions(via_transform(bm, vector_df, "v", **null), expected, invalid)
    assert_predictions(via_udf(bm, vector_df, "v", **null), expected, invalid)
    assert_predictions(via_partitions(bm, vector_df, "v", batch_size=3, **null), expected, invalid)
    with arrow_batch_rows(spark, 2):  # batches of dense only, sparse only, mixed
        assert_predictions(via_transform(bm, vector_df, "v", **null), expected, invalid)
        assert_predictions(via_udf(bm, vector_df, "v", **null), expected, invalid)


# --- 3. predict_partition with dict rows; empty partitions ---------------------------------


def test_predict_partition_dict_rows_multi_output(spark, build_log, multi):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((12, 4))
    b = rng.standard_normal((12, 3, 2))
    want = multi({"a": a.astype("float32"), "b": b.astype("float32")})
    rows = [{"a": a[i].tolist(), "b": b[i].tolist()} for i in range(12)]
    bad = {3: {"a": a[3][:3].tolist(), "b": b[3].tolist()}, 7: {"a": a[7].tolist(), "b": None},
           10: {"b": b[10].tolist(), "a": a[10].tolist(), "extra": 1.0}}  # the last one is fine
    rows_with_bad = [bad.get(i, r) for i, r in enumerate(rows)]
    bm = sk.BroadcastModel(spark, multi)

    def check(preds, invalid):
        assert len(preds) == 12
        for i, p in enumerate(preds):
            if i in invalid:
                assert p is None, (i, p)
                continue
            assert isinstance(p, dict) and set(p) == {"score", "probs"}, p
            assert isinstance(p["score"], float)
            np.testing.assert_allclose(p["score"], np.asarray(want["score"])[i, 0], atol=ATOL)
            assert np.shape(p["probs"]) == (3,)
            np.testing.assert_allclose(p["probs"], np.asarray(want["probs"])[i], atol=ATOL)

    workers = set()

    def run(rdd, score):
        tagged = rdd.mapPartitions(tag_pid(score)).collect()
        workers.update(pid for pid, _ in tagged)
        return [p for _, p in tagged]

    check(run(spark.sparkContext.parallelize(rows, 3), bm.predict_partition), set())
    check(run(spark.sparkContext.parallelize(rows_with_bad, 3),
              functools.partial(bm.predict_partition, batch_size=2, on_invalid="null")), {3, 7})
    # Rows keyed by input name, in the other column order
    df = spark.createDataFrame([(i, r["a"], r["b"]) for i, r in enumerate(rows)],
                               "id long, a array<double>, b array<array<double>>").coalesce(2)
    ids = [r.id for r in df.select("id").collect()]
    preds = run(df.select("b", "a").rdd, bm.predict_partition)
    assert sorted(ids) == list(range(12))
    check([p for _, p in sorted(zip(ids, preds), key=lambda t: t[0])], set())
    assert_built_once_per_worker(build_log, bm.key, tasks=8, workers=workers)


def test_empty_partitions_through_all_three_helpers(spark, model3):
    bm = sk.BroadcastModel(spark, model3)
    rows = [(0, [1.0, 2.0, 3.0]), (1, None), (2, [-1.0, 0.5, 0.25])]
    df = partitioned(spark, rows, "id long, f array<double>", 4)
    parts = partition_ids(df)
    assert len(parts) == 4 and sum(1 for p in parts if not p) == 1
    expected = expected_by_id(model3, valid_features(rows))
    null = {"on_invalid": "null"}
    assert_predictions(via_transform(bm, df, **null), expected, {1})
    assert_predictions(via_udf(bm, df, **null), expected, {1})
    assert_predictions(via_partitions(bm, df, **null), expected, {1})
    none = df.filter("id < 0").coalesce(1)  # no rows at all, default policy
    assert via_transform(bm, none) == [] and via_udf(bm, none) == [] and via_partitions(bm, none) == []


# --- 4. the PySpark < 4.1 pandas-UDF fallback ---------------------------------------------


@contextlib.contextmanager
def pandas_fallback():
    """Hide ``arrow_udf`` on the driver, where the UDF is created: ``_make_udf`` then
    builds the pandas iterator UDF that PySpark < 4.1 gets (on PySpark 3.5 there is
    nothing to hide: the fallback is the only path)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delattr(pandas_functions, "arrow_udf", raising=False)
        yield


HAS_ARROW_UDF = hasattr(pandas_functions, "arrow_udf")  # PySpark >= 4.1
PANDAS_ITER = PythonEvalType.SQL_SCALAR_PANDAS_ITER_UDF
ARROW_ITER = getattr(PythonEvalType, "SQL_SCALAR_ARROW_ITER_UDF", None)


def scored_both_ways(df, make_column) -> tuple[list, list]:
    """``df.select("id", column)`` collected with the arrow_udf column and with the pandas
    fallback's column, checking each really is of its kind. Without arrow_udf (PySpark
    3.5) both are the pandas UDF's results."""
    def run(expect_type):
        q = df.select("id", make_column().alias("p"))
        assert udf_eval_types(q) == {expect_type}
        return sorted(((r.id, r.p) for r in q.collect()), key=lambda t: t[0])

    arrow = run(ARROW_ITER) if HAS_ARROW_UDF else None
    with pandas_fallback():
        pandas = run(PANDAS_ITER)
    return (arrow if HAS_ARROW_UDF else pandas), pandas


@pytest.fixture(scope="module")
def columns_df(spark):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((24, 3))
    rows = [(i, x[i].tolist(), *map(float, x[i])) for i in range(24)]
    df = partitioned(spark, rows, "id long, f array<double>, f0 double, f1 double, f2 double", 3)
    return df, {i: x[i].tolist() for i in range(24)}


def test_pandas_fallback_array_scalar_and_vector_columns(spark, model3, columns_df):
    bm = sk.BroadcastModel(spark, model3)
    df, features = columns_df
    expected = expected_by_id(model3, features)
    for cols in (("f",), ("f0", "f1", "f2")):
        arrow, pandas = scored_both_ways(df, lambda: bm.predict_udf(batch_size=5)(*cols))
        assert_predictions(arrow, expected, set())
        assert_predictions(pandas, expected, set())
    vectors = partitioned(  # partition 0 dense only, partition 1 dense and sparse
        spark, [(6, Vectors.dense(GOOD[6])), (10, Vectors.dense(GOOD[10])),
                (8, Vectors.sparse(3, {1: 3.0})), (9, Vectors.dense(GOOD[6]))], ["id", "v"], 2)
    assert partition_ids(vectors) == [[6, 10], [8, 9]]
    expected = expected_by_id(model3, {**GOOD, 9: GOOD[6]})
    arrow, pandas = scored_both_ways(vectors, lambda: bm.predict_udf()("v"))
    assert_predictions(arrow, expected, set())
    assert_predictions(pandas, expected, set())


def test_pandas_fallback_multi_output_struct(spark, multi):
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((10, 4)), rng.standard_normal((10, 3, 2))
    want = multi({"a": a.astype("float32"), "b": b.astype("float32")})
    rows = [(i, a[i].tolist(), b[i].tolist()) for i in range(10)]
    df = partitioned(spark, rows, "id long, a array<double>, b array<array<double>>", 2)
    bm = sk.BroadcastModel(spark, multi)
    arrow, pandas = scored_both_ways(df, lambda: bm.predict_udf()("a", "b"))
    for got in (arrow, pandas):
        assert [i for i, _ in got] == list(range(10))
        np.testing.assert_allclose([p.score for _, p in got], np.asarray(want["score"]).reshape(-1),
                                   atol=ATOL)
        np.testing.assert_allclose([p.probs for _, p in got], np.asarray(want["probs"]), atol=ATOL)


def test_pandas_fallback_null_policy_multi_output(spark, multi):
    """Invalid rows are a null struct on both paths (not a struct of null fields)."""
    rng = np.random.default_rng(17)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((6, 3, 2))
    rows = [(0, a[0].tolist(), b[0].tolist()), (1, None, b[1].tolist()),
            (2, a[2][:3].tolist(), b[2].tolist()), (3, a[3].tolist(), b[3].tolist()),
            (4, a[4].tolist(), None), (5, a[5].tolist(), b[5].tolist())]
    df = spark.createDataFrame(rows, "id long, a array<double>, b array<array<double>>").coalesce(1)
    bm = sk.BroadcastModel(spark, multi)
    arrow, pandas = scored_both_ways(df, lambda: bm.predict_udf(on_invalid="null")("a", "b"))
    want = multi({"a": a[[0, 3, 5]].astype("float32"), "b": b[[0, 3, 5]].astype("float32")})
    for got in (arrow, pandas):
        assert [i for i, _ in got] == list(range(6))
        assert [i for i, p in got if p is None] == [1, 2, 4], got
        valid = [p for _, p in got if p is not None]
        np.testing.assert_allclose([p.score for p in valid], np.asarray(want["score"]).reshape(-1),
                                   atol=ATOL)
        np.testing.assert_allclose([p.probs for p in valid], np.asarray(want["probs"]), atol=ATOL)


def test_pandas_fallback_null_policy_all_invalid_batches(spark, model3):
    """on_invalid="null" with Arrow batches that are entirely null or entirely invalid."""
    bm = sk.BroadcastModel(spark, model3)
    batched = spark.createDataFrame(BATCHED_ROWS, "id long, f array<double>").coalesce(1)
    expected = expected_by_id(model3, valid_features(BATCHED_ROWS))
    invalid = {i for i, _ in BATCHED_ROWS} - set(expected)
    with arrow_batch_rows(spark, 3):
        arrow, pandas = scored_both_ways(batched,
                                         lambda: bm.predict_udf(on_invalid="null")("f"))
    assert_predictions(arrow, expected, invalid)
    assert_predictions(pandas, expected, invalid)


def test_pandas_fallback_null_policy_vectors(spark, model3, vector_df):
    bm = sk.BroadcastModel(spark, model3)
    expected = expected_by_id(model3, GOOD)
    invalid = VECTOR_INVALID
    with arrow_batch_rows(spark, 2):  # batches of dense only, sparse only, mixed, with a null
        arrow, pandas = scored_both_ways(vector_df,
                                         lambda: bm.predict_udf(on_invalid="null")("v"))
    assert_predictions(arrow, expected, invalid)
    assert_predictions(pandas, expected, invalid)


# --- 5. custom_objects and safe_mode on executors ----------------------------------------


class ScaleShift(keras.layers.Layer):
    """A custom layer (not registered): x * factor + a learned shift."""

    def __init__(self, factor: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape):
        self.shift = self.add_weight(shape=(input_shape[-1],), initializer="random_normal",
                                     name="shift")

    def call(self, x):
        return x * self.factor + self.shift

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def shifted_tanh(x):
    """A custom activation: known to workers only through custom_objects."""
    return keras.ops.tanh(x) + 0.5


def test_custom_objects_travel_to_workers(spark, columns_df):
    df, features = columns_df
    model = keras.Sequential([keras.Input((3,)), ScaleShift(3.0),
                              keras.layers.Dense(2, activation=shifted_tanh)])
    expected = expected_by_id(model, features)
    bm = sk.BroadcastModel(spark, model, custom_objects={"shifted_tanh": shifted_tanh})
    assert_predictions(via_transform(bm, df), expected, set())
    assert_predictions(via_udf(bm, df), expected, set())


def lambda_model() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t * 2.0 - 1.0),
                             keras.layers.Dense(2)])


def test_safe_mode_off_scores_a_lambda_on_workers(spark, columns_df):
    df, features = columns_df
    model = lambda_model()
    bm = sk.BroadcastModel(spark, model, safe_mode=False)
    assert_predictions(via_transform(bm, df), expected_by_id(model, features), set())
    assert_predictions(via_udf(bm, df, "f0", "f1", "f2"), expected_by_id(model, features), set())


def test_a_lambda_model_is_refused_at_construction_under_safe_mode(spark):
    """Its workers would refuse to rebuild it at the first action (44 s later, 41 lines):
    the handle refuses it at once, naming the layer, from its config; nothing shipped."""
    model = lambda_model()
    started = time.perf_counter()
    with pytest.raises(sk.PayloadError, match=r"layer\(s\) 'lambda\w*' of this model hold a "
                                              r"Python lambda.*safe_mode=False"):
        sk.BroadcastModel(spark, model)
    assert time.perf_counter() - started < 5


# --- errors last: a task that fails ends its Python worker, and the next one imports ---
# --- TensorFlow again ----------------------------------------------------------------


def test_misshapen_vectors_error_policy_names_the_column(spark, model3):
    bm = sk.BroadcastModel(spark, model3)
    sparse_wrong = spark.createDataFrame(
        [(0, Vectors.dense([1.0, 2.0, 3.0])), (1, Vectors.sparse(4, {0: 1.0})),
         (2, Vectors.sparse(3, {2: 1.0}))], ["id", "v"]).coalesce(1)
    with pytest.raises(Exception, match=r"column 'v'.*sparse vector at row 1.*size 4"):
        bm.transform(sparse_wrong, "v").collect()
    dense_wrong = spark.createDataFrame(
        [(0, Vectors.dense([1.0, 2.0, 3.0])), (1, Vectors.dense([1.0, 2.0])),
         (2, Vectors.dense([0.0, 1.0, 2.0]))], ["id", "v"]).coalesce(1)
    with pytest.raises(Exception, match=r"column 'v'.*row 1 of this batch has 2"):
        dense_wrong.select(bm.predict_udf()("v")).collect()
    # predict_partition, on the driver (the same generator a task runs)
    rows = [r.v for r in sparse_wrong.collect()]
    with pytest.raises(sk.ModelInputError, match=r"row 1 of this partition.*4 values"):
        list(bm.predict_partition(iter(rows)))


def test_pandas_fallback_null_vector_error_names_the_column(spark, model3):
    bm = sk.BroadcastModel(spark, model3)
    df = spark.createDataFrame([(0, Vectors.dense([1.0, 2.0, 3.0])), (1, None),
                                (2, Vectors.dense([3.0, 2.0, 1.0]))], ["id", "v"]).coalesce(1)
    with pandas_fallback():
        q = df.select(bm.predict_udf()("v"))
    assert udf_eval_types(q) == {PANDAS_ITER}
    with pytest.raises(Exception, match=r"ModelInputError: column 'v'.*null.*row 1"):
        q.collect()


def test_custom_objects_missing_is_refused_clearly(spark, columns_df):
    df, _ = columns_df
    model = keras.Sequential([keras.Input((3,)), ScaleShift(3.0),
                              keras.layers.Dense(2, activation=shifted_tanh)])
    clear = r"(?s)Pass it in custom_objects.*Could not locate function 'shifted_tanh'"
    with pytest.raises(Exception, match=clear):
        sk.BroadcastModel(spark, model).transform(df.coalesce(1), "f").collect()
