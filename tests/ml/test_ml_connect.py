"""KerasTransformer on Spark Connect (a real local server, ``remote("local[2]")``):
pyspark.ml runs Python stages on the client, Spark's own stages on the server."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("zstandard")

from spark_keras.inference import predictor_for  # noqa: E402
from spark_keras.ml import KerasTransformer  # noqa: E402
from tests import models  # noqa: E402
from tests.conftest import worker_cache_infos  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.mark.slow  # a cluster or a server of its own: 20-50 s
def test_pipeline_fit_save_load_on_connect(connect, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import SQLTransformer, StandardScaler, VectorAssembler

    from spark_keras.executor.transport import is_connect

    assert is_connect(connect)
    x = np.random.default_rng(7).standard_normal((120, 3)) * [1.0, 50.0, 0.02]
    df = connect.createDataFrame([(i, *map(float, r)) for i, r in enumerate(x)],
                                 "id long, a double, b double, c double").coalesce(1)
    model = models.mlp(3, 8, 1)
    pipeline = Pipeline(stages=[
        VectorAssembler(inputCols=["a", "b", "c"], outputCol="raw"),
        StandardScaler(inputCol="raw", outputCol="features", withMean=True),
        KerasTransformer(model=model, inputCol="features", outputCol="score", batchSize=32),
        SQLTransformer(statement="SELECT *, CAST(score > 0 AS INT) AS positive FROM __THIS__"),
    ])
    fitted = pipeline.fit(df)
    out = fitted.transform(df).toPandas()
    features = np.stack([v.toArray() for v in out["features"]]).astype("float32")
    want = predictor_for(model)([features], 32)[0][:, 0]  # the stage's batches
    np.testing.assert_array_equal(out["score"].to_numpy(), want)
    np.testing.assert_array_equal(out["positive"].to_numpy(), (want > 0).astype(int))

    path = str(tmp_path / "pipeline-model")
    fitted.write().overwrite().save(path)
    fitted.write().overwrite().save(path)  # overwrite goes through Connect's ML helper
    (stage_dir,) = glob.glob(os.path.join(path, "stages", "*_KerasTransformer_*"))
    assert sorted(os.listdir(stage_dir)) == ["metadata", "payload.skp"]
    loaded = PipelineModel.load(path)
    stage = loaded.stages[2]
    assert isinstance(stage, KerasTransformer) and stage.getBatchSize() == 32
    for _ in range(2):
        again = loaded.transform(df).toPandas()
        np.testing.assert_array_equal(again["score"].to_numpy(), want)
    handle = stage.broadcastModel(connect)
    assert type(handle._transport).__name__ == "ArtifactTransport"  # a local path: uploaded once
    builds = [i["builds_by_key"][handle.key] for i in worker_cache_infos(connect).values()
              if handle.key in i["builds_by_key"]]
    assert builds and set(builds) == {1}, builds  # two transforms, one build per worker

    stage.write().overwrite().save(str(tmp_path / "stage"))  # the stage alone, overwritten
    stage.write().overwrite().save(str(tmp_path / "stage"))
    alone = KerasTransformer.load(str(tmp_path / "stage"))
    scaled = loaded.stages[1].transform(loaded.stages[0].transform(df))
    np.testing.assert_array_equal(alone.transform(scaled).toPandas()["score"].to_numpy(), want)

    pipeline.save(str(tmp_path / "pipeline"))  # the unfitted Pipeline too
    refitted = Pipeline.load(str(tmp_path / "pipeline")).fit(df)
    np.testing.assert_array_equal(refitted.transform(df).toPandas()["score"].to_numpy(), want)
