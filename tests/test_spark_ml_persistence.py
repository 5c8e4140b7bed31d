"""KerasTransformer persistence edge cases: ``file:`` URIs resolved as Hadoop resolves them."""

from __future__ import annotations

import os

import numpy as np
import pytest

import spark_keras as sk
from spark_keras import ml
from spark_keras.inference import predictor_for
from spark_keras.ml import KerasTransformer

from . import models

pytestmark = pytest.mark.timeout(600)

COLUMNS = ["a", "b", "c", "d"]
X = np.random.default_rng(11).standard_normal((40, 4)).astype("float32")


def _exact(model) -> np.ndarray:
    """The model's own compiled outputs on X (what a worker computes, bit for bit)."""
    return predictor_for(model)([X], 1024)[0][:, 0]


@pytest.fixture(scope="module")
def df(spark):
    """X as an array column ``f`` and as four double columns, in one partition."""
    rows = [(i, X[i].tolist(), *map(float, X[i])) for i in range(len(X))]
    schema = "id long, f array<float>, " + ", ".join(f"{c} double" for c in COLUMNS)
    return spark.createDataFrame(rows, schema).coalesce(1).cache()


@pytest.fixture(scope="module")
def v1():
    return sk.loads(sk.dumps(models.mlp(4, 8, 1)))  # its config as a loaded model's


def _scores(stage, df, column: str = "prediction") -> np.ndarray:
    return stage.transform(df).orderBy("id").toPandas()[column].to_numpy()


def test_a_file_uri_with_percent_escapes_is_one_folder_as_hadoop_makes_it(spark, df, v1,
                                                                          tmp_path):
    from pyspark.ml.feature import Binarizer

    # Hadoop takes the path of a file: URI literally: Spark's own stage lands in "spark%20stage"
    Binarizer(inputCol="a", outputCol="b").save(f"file://{tmp_path}/spark%20stage")
    assert os.listdir(tmp_path) == ["spark%20stage"]

    where = f"file://{tmp_path}/my%20stage"
    KerasTransformer(model=v1, inputCol="f").save(where)
    assert sorted(os.listdir(tmp_path)) == ["my%20stage", "spark%20stage"]
    assert sorted(os.listdir(tmp_path / "my%20stage")) == ["metadata", "payload.skp"]
    np.testing.assert_array_equal(_scores(KerasTransformer.load(where), df), _exact(v1))

    # without a JVM to ask (Spark Connect), file: URIs are read as Hadoop reads them
    sc = spark.sparkContext
    for uri in [f"file://{tmp_path}/my%20stage", f"file:{tmp_path}/a%2Fb c",
                f"file://{tmp_path}/q?x=1#f", f"file:///{tmp_path}/./u/../v//w/"]:
        hadoop = sc._jvm.org.apache.hadoop.fs.Path(uri)
        qualified = hadoop.getFileSystem(sc._jsc.hadoopConfiguration()).makeQualified(hadoop)
        assert ml._file_uri_path(uri) == qualified.toUri().getPath(), uri
