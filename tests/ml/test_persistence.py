"""KerasTransformer persistence edge cases: saving a loaded stage (alone or in a
PipelineModel) back over the folder it came from, a failed save leaving the old stage on
disk, a loaded stage holding the model it was loaded with, a payload file that is not the
one the metadata describes, and ``file:`` URIs resolved as Hadoop resolves them."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for
from spark_keras.ml import KerasTransformer
from spark_keras.spark import paths
from tests import models

pytestmark = pytest.mark.timeout(600)

COLUMNS = ["a", "b", "c", "d"]
X = np.random.default_rng(11).standard_normal((40, 4)).astype("float32")


def _exact(model, batch_size: int = 1024) -> np.ndarray:
    """The model's own compiled outputs on X in batches of ``batch_size`` (what a worker
    computes, bit for bit: a row's bits can depend on the rows beside it in a batch)."""
    return predictor_for(model)([X], batch_size)[0][:, 0]


@pytest.fixture(scope="module")
def df(spark):
    """X as an array column ``f`` and as four double columns, in one partition."""
    rows = [(i, X[i].tolist(), *map(float, X[i])) for i in range(len(X))]
    schema = "id long, f array<float>, " + ", ".join(f"{c} double" for c in COLUMNS)
    return spark.createDataFrame(rows, schema).coalesce(1).cache()


@pytest.fixture(scope="module")
def v1():
    return sk.loads(sk.dumps(models.mlp(4, 8, 1)))  # its config as a loaded model's


@pytest.fixture(scope="module")
def v2(v1):
    """v1's config (so a payload of the same size) with other weights."""
    model = sk.loads(sk.dumps(v1))
    model.set_weights([w + 0.5 for w in v1.get_weights()])
    return model


def _scores(stage, df, column: str = "prediction") -> np.ndarray:
    return stage.transform(df).orderBy("id").toPandas()[column].to_numpy()


def _files(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            full = os.path.join(root, name)
            found[os.path.relpath(full, folder)] = open(full, "rb").read()
    return found


def test_a_loaded_stage_saved_over_its_own_folder(df, v1, tmp_path):
    path = str(tmp_path / "stage")
    KerasTransformer(model=v1, inputCol="f").save(path)
    loaded = KerasTransformer.load(path).setBatchSize(7).setOutputCol("score")
    loaded.write().overwrite().save(path)
    assert sorted(os.listdir(path)) == ["metadata", "payload.skp"]
    again = KerasTransformer.load(path)
    assert (again.getBatchSize(), again.getOutputCol()) == (7, "score")
    np.testing.assert_array_equal(_scores(again, df, "score"), _exact(v1, 7))

    # a stage made from the payload file inside the folder it is saved over
    from_file = KerasTransformer(model=os.path.join(path, "payload.skp"), inputCol="f")
    from_file.write().overwrite().save(path)
    np.testing.assert_array_equal(_scores(KerasTransformer.load(path), df), _exact(v1))


def test_a_loaded_pipeline_model_saved_over_its_own_folder(df, v1, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    path = str(tmp_path / "pipeline-model")
    Pipeline(stages=[
        VectorAssembler(inputCols=COLUMNS, outputCol="features"),
        KerasTransformer(model=v1, inputCol="features", outputCol="score"),
    ]).fit(df).save(path)
    loaded = PipelineModel.load(path)
    loaded.stages[1].setBatchSize(5).setOnInvalid("null")
    loaded.write().overwrite().save(path)

    again = PipelineModel.load(path)
    stage = again.stages[1]
    assert (stage.getBatchSize(), stage.getOnInvalid()) == (5, "null")
    got = again.transform(df).orderBy("id").toPandas()["score"].to_numpy()
    np.testing.assert_array_equal(got, _exact(v1, 5))


class _LosesArguments(keras.Model):
    """A subclassed model without get_config whose auto-config loses ``act``: spark_keras
    refuses to serialize it (PayloadError)."""

    def __init__(self, units: int = 1, act: str = "relu", **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(units, activation=act)

    def call(self, x):
        return self.dense(x)


def test_a_failed_save_leaves_the_old_stage_intact(df, v1, tmp_path):
    path = str(tmp_path / "stage")
    KerasTransformer(model=v1, inputCol="f").save(path)
    before = _files(path)
    bad = _LosesArguments(act="tanh")
    bad(X[:2])
    with pytest.raises(sk.PayloadError, match="get_config"):
        KerasTransformer(model=bad, inputCol="f").write().overwrite().save(path)
    assert _files(path) == before
    np.testing.assert_array_equal(_scores(KerasTransformer.load(path), df), _exact(v1))


def test_a_loaded_stage_keeps_the_model_it_was_loaded_with(df, v1, v2, tmp_path):
    path = str(tmp_path / "stage")
    KerasTransformer(model=v1, inputCol="f").save(path)
    loaded = KerasTransformer.load(path)
    KerasTransformer(model=v2, inputCol="f").write().overwrite().save(path)  # v2 over it
    assert not np.array_equal(_exact(v1), _exact(v2))
    np.testing.assert_array_equal(_scores(loaded, df), _exact(v1))
    np.testing.assert_array_equal(_scores(KerasTransformer.load(path), df), _exact(v2))


def test_a_payload_that_is_not_the_saved_one_is_refused_at_load(v1, v2, tmp_path):
    path = tmp_path / "stage"
    KerasTransformer(model=v1, inputCol="f").save(str(path))
    payload_file = path / "payload.skp"
    good = payload_file.read_bytes()

    other = sk.dumps(v2)  # another model's payload, of the very same size
    assert len(other) == len(good) and other != good
    payload_file.write_bytes(other)
    with pytest.raises(sk.PayloadError, match=r"payload .*payload\.skp has body digest .* the "
                                              r"stage's metadata says"):
        KerasTransformer.load(str(path))

    damaged = bytearray(good)
    damaged[-1] ^= 0xFF  # the last weight's last byte: the header still holds
    payload_file.write_bytes(bytes(damaged))
    with pytest.raises(sk.PayloadError, match=r"payload\.skp is not sound .*body checksum"):
        KerasTransformer.load(str(path))

    payload_file.write_bytes(good)
    assert KerasTransformer.load(str(path)).getInputCol() == "f"


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
        assert paths.file_uri_path(uri) == qualified.toUri().getPath(), uri
