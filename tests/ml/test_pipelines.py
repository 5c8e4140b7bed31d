"""spark_keras.ml.KerasTransformer: a pyspark.ml stage between Spark's own stages, its
Params, and PipelineModel save/load (in this process, in a fresh driver process and on
local-cluster, through jobs/pipeline.py). Spark Connect: tests/ml/test_ml_connect.py."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for
from spark_keras.ml import KerasTransformer
from spark_keras.payload.stored import body_digest
from tests import models
from tests.conftest import REPO_ROOT, builds_by_worker

pytestmark = pytest.mark.timeout(600)

COLUMNS = ["a", "b", "c", "d"]


def _exact(model, inputs, batch_size=1024):
    """The model's own compiled outputs on the same batches (what a worker computes: a
    row's bits can depend on the rows beside it in a batch, through the matmul kernel's
    blocking)."""
    return predictor_for(model)(inputs, batch_size)


@pytest.fixture(scope="module")
def data(spark):
    """300 rows of four columns on very different scales, in one partition (one Arrow
    batch: the driver's predictor sees the very batch a worker sees)."""
    x = np.random.default_rng(3).standard_normal((300, 4)) * [1, 10, 300, 0.01] + [0, 5, -40, 1]
    schema = "id long, " + ", ".join(f"{c} double" for c in COLUMNS)
    rows = [(i, *map(float, r)) for i, r in enumerate(x)]
    return spark.createDataFrame(rows, schema).coalesce(1).cache()


@pytest.fixture(scope="module")
def mlp():
    return models.mlp(4, 16, 1)


@pytest.fixture(scope="module")
def pipeline(spark, mlp):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import SQLTransformer, StandardScaler, VectorAssembler

    return Pipeline(stages=[
        VectorAssembler(inputCols=COLUMNS, outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features", withMean=True, withStd=True),
        KerasTransformer(model=mlp, inputCol="features", outputCol="score", batchSize=64),
        SQLTransformer(statement="SELECT *, CAST(score > 0 AS INT) AS positive FROM __THIS__"),
    ])


@pytest.fixture(scope="module")
def fitted(pipeline, data):
    return pipeline.fit(data)


def _scored(pipeline_model, df) -> "object":
    return pipeline_model.transform(df).select("id", "features", "score", "positive").toPandas()


def test_between_spark_stages_bit_identical_to_the_model(fitted, data, mlp):
    out = _scored(fitted, data)
    features = np.stack([v.toArray() for v in out["features"]]).astype("float32")
    assert features.shape == (300, 4) and abs(features.mean()) < 0.1  # scaled by Spark
    want = _exact(mlp, [features], 64)[0][:, 0]  # the stage's batchSize
    assert out["score"].dtype == np.float32  # a single-unit output is a scalar column
    np.testing.assert_array_equal(out["score"].to_numpy(), want)
    # the stage after it
    np.testing.assert_array_equal(out["positive"].to_numpy(), (want > 0).astype(int))


def _metadata(stage_dir: str) -> tuple[str, dict]:
    parts = glob.glob(os.path.join(stage_dir, "metadata", "part-*"))
    assert len(parts) == 1, parts
    text = open(parts[0], encoding="utf-8").read()
    return text, json.loads(text)


def _keras_stage_dir(path: str) -> str:
    found = glob.glob(os.path.join(path, "stages", "*_KerasTransformer_*"))
    assert len(found) == 1, found
    return found[0]


def test_pipeline_model_save_load_round_trip(fitted, data, mlp, tmp_path):
    from pyspark.ml import PipelineModel

    path = str(tmp_path / "pipeline-model")
    stage = fitted.stages[2].setOnInvalid("null")
    fitted.save(path)

    stage_dir = _keras_stage_dir(path)
    assert sorted(os.listdir(stage_dir)) == ["metadata", "payload.skp"]
    payload = open(os.path.join(stage_dir, "payload.skp"), "rb").read()
    assert sk.is_payload(payload)
    np.testing.assert_array_equal(np.asarray(sk.loads(payload)(np.ones((2, 4), "float32"))),
                                  np.asarray(mlp(np.ones((2, 4), "float32"))))
    text, meta = _metadata(stage_dir)
    assert len(text) < 2048 and "SKPAYL" not in text  # params and a record, no model inside
    assert meta["class"] == "spark_keras.ml.KerasTransformer" and meta["uid"] == stage.uid
    assert meta["paramMap"] == {"inputCol": "features", "outputCol": "score", "batchSize": 64,
                                "onInvalid": "null"}
    record = meta["sparkKeras"]["payload"]
    assert record["file"] == "payload.skp" and record["nbytes"] == len(payload)
    assert record["body_sha256"] == body_digest(payload)

    loaded = PipelineModel.load(path)
    again = loaded.stages[2]
    assert isinstance(again, KerasTransformer) and again.uid == stage.uid
    params = (again.getInputCol(), again.getOutputCol(), again.getBatchSize(), again.getOnInvalid())
    assert params == ("features", "score", 64, "null")
    assert not again.isDefined(again.inputCols)
    want = _scored(fitted, data)
    got = _scored(loaded, data)
    np.testing.assert_array_equal(got["score"].to_numpy(), want["score"].to_numpy())
    np.testing.assert_array_equal(got["positive"].to_numpy(), want["positive"].to_numpy())

    with pytest.raises(Exception, match="already exists"):  # as Spark's own stages
        fitted.save(path)
    fitted.write().overwrite().save(path)
    # a loaded stage saves its payload file as is
    loaded.write().overwrite().save(str(tmp_path / "resaved"))
    resaved = os.path.join(_keras_stage_dir(str(tmp_path / "resaved")), "payload.skp")
    assert open(resaved, "rb").read() == payload


def test_the_stage_alone_at_paths_and_uris(fitted, data, tmp_path):
    stage = fitted.stages[2]
    scaled = fitted.stages[1].transform(fitted.stages[0].transform(data))
    want = stage.transform(scaled).select("score").toPandas()["score"].to_numpy()

    # (a relative path is resolved as Spark resolves it: by Hadoop, against the JVM's
    # working directory and default filesystem; the payload goes beside the metadata)
    places = {f"file://{tmp_path}/uri": tmp_path / "uri", f"file:{tmp_path}/hadoop-uri":
              tmp_path / "hadoop-uri", str(tmp_path / "plain"): tmp_path / "plain"}
    for where, folder in places.items():
        stage.write().overwrite().save(where)
        assert sorted(os.listdir(folder)) == ["metadata", "payload.skp"], where
        loaded = KerasTransformer.load(where)
        got = loaded.transform(scaled).select("score").toPandas()["score"].to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=where)

    payload = tmp_path / "plain" / "payload.skp"
    good = payload.read_bytes()
    payload.write_bytes(good[:-10])
    with pytest.raises(sk.PayloadError, match="has .* bytes, the stage's metadata says"):
        KerasTransformer.load(str(tmp_path / "plain"))
    payload.unlink()
    with pytest.raises(sk.StorageError, match="payload .* is missing"):
        KerasTransformer.load(str(tmp_path / "plain"))
    with pytest.raises(sk.SparkKerasError, match="not a spark_keras.ml.KerasTransformer"):
        KerasTransformer.load(_stage_dir_of(fitted, tmp_path, 1))


def _stage_dir_of(fitted, tmp_path, index: int) -> str:
    path = str(tmp_path / "other")
    fitted.stages[index].save(path)
    return path


def test_unfitted_pipeline_round_trip(pipeline, data, fitted, tmp_path):
    from pyspark.ml import Pipeline

    pipeline.save(str(tmp_path / "pipeline"))
    loaded = Pipeline.load(str(tmp_path / "pipeline"))
    assert [type(s).__name__ for s in loaded.getStages()][2] == "KerasTransformer"
    refitted = loaded.fit(data)
    np.testing.assert_array_equal(_scored(refitted, data)["score"].to_numpy(),
                                  _scored(fitted, data)["score"].to_numpy())


@pytest.mark.slow  # a local-cluster job and a fresh driver: about 90 s
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_job_on_local_cluster_then_loaded_in_a_fresh_driver(spark, tmp_path):
    """jobs/pipeline.py fits, saves, loads and scores on local-cluster (two executor
    JVMs); this process, which never saw the model, loads what it saved and scores the
    same batches to the same bits."""
    from pyspark.ml import PipelineModel

    out = tmp_path / "job"
    job_tmp = tmp_path / "tmp"  # the job's temporary folders: none left afterwards
    job_tmp.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(job_tmp))
    env.pop("SPARK_KERAS_BUILD_LOG", None)
    proc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "jobs", "pipeline.py"),
                           "--master", "local-cluster[2,1,1024]", "--out", str(out),
                           "--rows", "4000"],
                          env=env, capture_output=True, text=True, timeout=400)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("PIPELINE")]
    assert proc.returncode == 0 and summary, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert not os.listdir(job_tmp), os.listdir(job_tmp)
    fields = dict(re.findall(r"(\w+)=(\S+)", summary[0]))
    assert fields["rows"] == "4000" and fields["identical"] == "yes", summary
    assert fields["builds_per_worker"] == "1" and int(fields["workers"]) >= 2, summary
    assert float(fields["accuracy"]) > 0.85, summary

    loaded = PipelineModel.load(str(out / "pipeline-model"))
    df = spark.read.parquet(str(out / "data.parquet"))
    df = df.repartition(4, "id").sortWithinPartitions("id")  # the job's partitions and order
    got = loaded.transform(df).select("id", "probability", "predicted").toPandas().sort_values("id")
    theirs = spark.read.parquet(str(out / "scored.parquet")).toPandas().sort_values("id")
    assert len(got) == 4000
    np.testing.assert_array_equal(got["probability"].to_numpy(), theirs["probability"].to_numpy())
    np.testing.assert_array_equal(got["predicted"].to_numpy(), theirs["predicted"].to_numpy())


# --- params ------------------------------------------------------------------------------------

def test_params_explain_and_validate_like_spark_stages(mlp):
    stage = KerasTransformer(model=mlp, inputCol="features", batchSize=64)
    text = stage.explainParams()
    assert "batchSize: rows per model call on a worker (> 0)" in text
    assert "(default: 1024, current: 64)" in text
    assert "inputCols: input column names. (undefined)" in text
    assert "onInvalid: how to handle a row" in text and "(default: error)" in text
    assert "outputCol: output column name. (default: prediction)" in text
    assert stage.getOutputCol() == "prediction" and stage.getOnInvalid() == "error"

    with pytest.raises(ValueError, match="batchSize must be a positive integer, not 0"):
        KerasTransformer(model=mlp, inputCol="f", batchSize=0)
    with pytest.raises(TypeError, match='Invalid param value given for param "batchSize"'):
        KerasTransformer(model=mlp, inputCol="f", batchSize="64")
    with pytest.raises(TypeError, match="Could not convert 2.5 to int"):
        stage.setBatchSize(2.5)
    assert stage.setBatchSize(16.0).getBatchSize() == 16  # as Spark's int params
    with pytest.raises(ValueError, match="onInvalid must be one of 'error', 'null', not 'skip'"):
        stage.setOnInvalid("skip")
    with pytest.raises(ValueError, match='Invalid param value given for param "batchSize"'):
        stage.set(stage.batchSize, -1)
    with pytest.raises(TypeError, match='param "inputCols"'):
        stage.setInputCols("a")
    with pytest.raises(ValueError, match="positive"):
        stage.copy({stage.batchSize: 0})
    with pytest.raises(TypeError, match="forces keyword arguments"):
        KerasTransformer(mlp)
    with pytest.raises(TypeError, match="unexpected keyword"):
        KerasTransformer(model=mlp, inputcol="f")
    with pytest.raises(TypeError, match="model must be a Keras model"):
        KerasTransformer(model=42)
    with pytest.raises(sk.StorageError, match="does not exist"):
        KerasTransformer(model="no/such/model.keras")
    with pytest.raises(sk.PayloadError, match="not a spark_keras payload"):
        KerasTransformer(model=b"not a payload")
    # the failed sets changed nothing
    assert stage.getBatchSize() == 16 and stage.getOnInvalid() == "error"


def test_errors_at_transform(spark, mlp):
    df = spark.createDataFrame([(1, [1.0, 2.0, 3.0, 4.0])], "id long, f array<float>")
    with pytest.raises(ValueError, match="requires exactly one of inputCol, inputCols"):
        KerasTransformer(model=mlp).transform(df)
    with pytest.raises(ValueError, match="both inputCol .* and inputCols"):
        KerasTransformer(model=mlp, inputCol="f", inputCols=["f"]).transform(df)
    with pytest.raises(sk.ModelInputError, match=r"input column\(s\) \['g'\] not in the DataFrame"):
        KerasTransformer(model=mlp, inputCol="g").transform(df)
    with pytest.raises(ValueError, match="output column 'id' already exists"):
        KerasTransformer(model=mlp, inputCol="f", outputCol="id").transform(df)
    with pytest.raises(sk.SparkKerasError, match="has no model"):
        KerasTransformer(inputCol="f").transform(df)
    with pytest.raises(Exception, match="column 'f': each row holds 4 values"):
        KerasTransformer(model=models.mlp(3, 4, 1), inputCol="f").transform(df).collect()


def test_copy_is_independent_and_shares_the_shipped_model(spark, build_log, mlp):
    x = np.random.default_rng(4).standard_normal((64, 4)).astype("float32")
    rows = [(i, x[i].tolist()) for i in range(64)]
    df = spark.createDataFrame(rows, "id long, f array<float>").repartition(4)
    stage = KerasTransformer(model=mlp, inputCol="f", outputCol="p")
    twin = stage.copy({stage.outputCol: "q"})
    assert twin is not stage and twin.uid == stage.uid  # Spark's copy keeps the uid
    assert (twin.getOutputCol(), stage.getOutputCol()) == ("q", "p")
    twin.setBatchSize(8)
    assert stage.getBatchSize() == 1024 and not stage.isSet(stage.batchSize)

    def scores(which, column):
        out = which.transform(df).select("id", column).toPandas().sort_values("id")
        return out[column].to_numpy()

    firsts = [scores(stage, "p"), scores(stage, "p"), scores(twin, "q")]
    override = stage.transform(df, {stage.outputCol: "r"})  # Transformer.transform(df, params)
    assert "r" in override.columns and stage.getOutputCol() == "p"
    override.collect()
    for got in firsts:
        np.testing.assert_allclose(got, np.asarray(mlp(x))[:, 0], atol=1e-6)

    handle = stage.broadcastModel(spark)
    assert twin.broadcastModel(spark) is handle and stage.broadcastModel() is handle
    builds = builds_by_worker(build_log, handle.key)
    assert builds and all(n == 1 for n in builds.values()), builds  # four transforms, one build


def test_every_kind_of_model_source(spark, mlp, tmp_path):
    x = np.random.default_rng(5).standard_normal((40, 4)).astype("float32")
    rows = [(i, x[i].tolist()) for i in range(40)]
    df = spark.createDataFrame(rows, "id long, f array<float>").coalesce(1)
    want = _exact(mlp, [x])[0][:, 0]
    mlp.save(tmp_path / "m.keras")
    sk.save(mlp, tmp_path / "m.skp")
    sources = {
        "model": mlp,
        ".keras path": str(tmp_path / "m.keras"),
        "payload path": tmp_path / "m.skp",
        "payload URI": f"file://{tmp_path}/m.skp",
        "payload bytes": sk.dumps(mlp),
        "BroadcastModel": sk.BroadcastModel(spark, mlp),
    }
    for kind, source in sources.items():
        stage = KerasTransformer(model=source, inputCol="f")
        got = stage.transform(df).orderBy("id").toPandas()["prediction"].to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=kind)
        if kind not in (".keras path", "payload bytes", "BroadcastModel"):
            continue  # saving the others: the other tests
        saved = str(tmp_path / "saved" / re.sub(r"\W", "_", kind))
        stage.save(saved)
        again = KerasTransformer.load(saved).transform(df).orderBy("id").toPandas()["prediction"]
        np.testing.assert_array_equal(again.to_numpy(), want, err_msg=f"{kind}, saved and loaded")
    assert KerasTransformer(model=sources["BroadcastModel"], inputCol="f").broadcastModel(spark) \
        is sources["BroadcastModel"]
    from_file = KerasTransformer(model=str(tmp_path / "m.keras"))
    assert from_file.model.count_params() == mlp.count_params()  # the driver's copy


def test_multi_input_multi_output_and_scalar_columns(spark):
    two = models.multi_io()
    inputs = models.random_like_inputs(two, 20, seed=2)
    frame = spark.createDataFrame(
        [(i, inputs["a"][i].tolist(), inputs["b"][i].reshape(-1).tolist()) for i in range(20)],
        "id long, a array<float>, b array<float>").coalesce(1)
    got = KerasTransformer(model=two, inputCols=["a", "b"], outputCol="out").transform(frame) \
        .orderBy("id").toPandas()["out"]
    sig = predictor_for(two).signature
    expected = dict(zip(sig.output_names, _exact(two, [inputs[s.name] for s in sig.inputs])))
    np.testing.assert_array_equal(np.array([r["score"] for r in got]), expected["score"][:, 0])
    np.testing.assert_array_equal(np.stack([r["probs"] for r in got]), expected["probs"])

    mlp3 = models.mlp(3, 8, 2)
    x = np.random.default_rng(6).standard_normal((30, 3)).astype("float32")
    scalars = spark.createDataFrame([(i, *map(float, x[i])) for i in range(30)],
                                    "id long, u float, v float, w float").coalesce(1)
    out = KerasTransformer(model=mlp3, inputCols=["u", "v", "w"]).transform(scalars).orderBy("id")
    got = np.stack(out.toPandas()["prediction"].to_numpy())
    np.testing.assert_array_equal(got, _exact(mlp3, [x])[0])


def test_on_invalid_null(spark):
    mlp3 = models.mlp(3, 8, 1)
    rows = [(0, [1.0, 2.0, 3.0]), (1, None), (2, [1.0, 2.0]), (3, [float("nan"), 0.0, 0.0]),
            (4, [0.5, 0.5, 0.5])]
    df = spark.createDataFrame(rows, "id long, f array<float>").coalesce(1)
    stage = KerasTransformer(model=mlp3, inputCol="f", onInvalid="null")
    got = stage.transform(df).orderBy("id").toPandas()["prediction"].to_numpy()
    assert np.isnan(got[1:4].astype("float64")).all()  # null predictions (NaN in pandas)
    want = np.asarray(mlp3(np.array([[1, 2, 3], [0.5, 0.5, 0.5]], "float32")))[:, 0]
    np.testing.assert_allclose(got[[0, 4]].astype("float32"), want, atol=1e-6)
    with pytest.raises(Exception, match="column 'f'"):
        stage.copy({stage.onInvalid: "error"}).transform(df).collect()


def test_version_col_follows_the_stage_models_updates(spark):
    """``versionCol``: the label of the version that scored each row, a new version
    shipped through the stage's BroadcastModel taking over the same stage."""
    v1, v2 = models.mlp(3, 8, 1, name="a"), models.mlp(3, 8, 1, name="b")
    x = np.array([[1, 2, 3], [0.5, 0.5, 0.5]], "float32")
    df = spark.createDataFrame([(i, r.tolist()) for i, r in enumerate(x)], "id long, f array<float>")
    stage = KerasTransformer(model=v1, inputCol="f", versionCol="model_version")
    first = stage.transform(df).orderBy("id").toPandas()
    assert first["model_version"].tolist() == ["1", "1"]
    assert stage.broadcastModel(spark).update(v2, version="b") == "b"
    after = stage.transform(df).orderBy("id").toPandas()
    assert after["model_version"].tolist() == ["b", "b"]
    np.testing.assert_allclose(after["prediction"].to_numpy("float32"), np.asarray(v2(x))[:, 0], atol=1e-6)
    assert stage.copy().getVersionCol() == "model_version"


@keras.saving.register_keras_serializable(package="spark_keras_ml_tests")
class Doubler(keras.layers.Layer):
    """A registered custom layer: a loaded stage finds it by name."""

    def call(self, x):
        return 2.0 * x


class Halver(keras.layers.Layer):
    """An unregistered custom layer: only the custom_objects given to the stage know it."""

    def call(self, x):
        return 0.5 * x


def test_custom_layers_must_be_registered_where_a_stage_is_loaded(spark, tmp_path):
    rows = [(i, [float(i), 1.0, -2.0]) for i in range(8)]
    df = spark.createDataFrame(rows, "id long, f array<float>").coalesce(1)

    def scores(stage):
        return stage.transform(df).orderBy("id").toPandas()["prediction"].to_numpy()

    registered = KerasTransformer(
        model=keras.Sequential([keras.Input((3,)), Doubler(), keras.layers.Dense(1)]), inputCol="f")
    registered.save(str(tmp_path / "registered"))
    np.testing.assert_array_equal(scores(KerasTransformer.load(str(tmp_path / "registered"))),
                                  scores(registered))

    model = keras.Sequential([keras.Input((3,)), Halver(), keras.layers.Dense(1)])
    unregistered = KerasTransformer(model=model, inputCol="f", custom_objects={"Halver": Halver})
    x = np.array([r[1] for r in rows], "float32")
    np.testing.assert_allclose(scores(unregistered), np.asarray(model(x))[:, 0], atol=1e-6)
    unregistered.save(str(tmp_path / "unregistered"))
    loaded = KerasTransformer.load(str(tmp_path / "unregistered"))  # params and file: fine
    with pytest.raises(sk.PayloadError, match="(?s)custom classes must be registered.*Could not locate class 'Halver'"):
        loaded.transform(df)


def test_payloads_at_uris(spark, s3, mlp, tmp_path):
    """A payload written to and read from S3 (the storage I/O a stage saves with), and a
    stage whose model is an S3 URI: executors read it themselves; saving copies it."""
    from spark_keras import storage
    from spark_keras.spark.paths import stage_file

    hadoop_style = s3.uri("pm/stages/2_KerasTransformer_x").replace("s3://", "s3a://")
    location = stage_file(spark, hadoop_style, "payload.skp")
    assert location == s3.uri("pm/stages/2_KerasTransformer_x/payload.skp")
    payload = sk.dumps(mlp)
    storage.write(location, payload)
    assert storage.size(location) == len(payload) and storage.size(s3.uri("nothing")) is None
    assert sk.storage.read(location) == payload

    x = np.random.default_rng(8).standard_normal((16, 4)).astype("float32")
    rows = [(i, x[i].tolist()) for i in range(16)]
    df = spark.createDataFrame(rows, "id long, f array<float>").coalesce(1)
    stage = KerasTransformer(model=location, inputCol="f")
    got = stage.transform(df).orderBy("id").toPandas()["prediction"].to_numpy()
    np.testing.assert_array_equal(got, _exact(mlp, [x])[0][:, 0])
    assert type(stage.broadcastModel(spark)._transport).__name__ == "StorageTransport"
    stage.save(str(tmp_path / "from-s3"))
    assert (tmp_path / "from-s3" / "payload.skp").read_bytes() == payload
