"""keras-hub task models scored with their attached preprocessor: a ``BertTextClassifier``
on a string column and a ``ResNetImageClassifier`` on images of several sizes give what
``classifier.predict`` gives; tiny models built offline (tests/models.py), no downloads."""

from __future__ import annotations

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub")

import keras  # noqa: E402

import spark_keras as sk  # noqa: E402
from spark_keras.errors import ModelError  # noqa: E402
from spark_keras.inference import TensorSpec, predictor_for, signature_of  # noqa: E402
from tests import models  # noqa: E402
from tests.conftest import build_records, builds_by_worker, make_spark, preloaded_daemons, text_frame  # noqa: E402

pytestmark = pytest.mark.timeout(600)

TEXTS = ["the cat sat on the mat", "a dog ran fast", "big red dog", "", "words nobody knows",
         "The CAT is small and blue", "mat", "dog and cat"]


@pytest.fixture(scope="module")
def spark(build_log):
    """local[2], workers forked from a daemon that preloaded keras_hub."""
    session = make_spark("local[2]", build_log, **{"spark.executorEnv.SPARK_KERAS_PRELOAD": "keras_hub"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def classifier():
    return models.hub_text_classifier()


@pytest.fixture(scope="module")
def text_bm(spark, classifier):
    handle = sk.BroadcastModel(spark, classifier)
    yield handle
    handle.destroy()


def test_the_signature_is_the_preprocessors_input(classifier):
    sig = signature_of(classifier)
    assert sig.inputs == (TensorSpec("text", (), "string"),)
    assert [(s.shape, s.dtype) for s in sig.outputs] == [((3,), "float32")]
    got = predictor_for(classifier)([np.array(TEXTS, dtype=object)], batch_size=3)[0]
    np.testing.assert_allclose(got, classifier.predict(TEXTS, verbose=0), atol=1e-5)


@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_a_text_classifier_scores_a_string_column(spark, text_bm, classifier, build_log):
    want = classifier.predict(TEXTS, verbose=0)
    assert np.ptp(want, axis=0).max() > 1e-3  # the texts give different predictions
    df = text_frame(spark, TEXTS).repartition(2)
    got = [r.prediction for r in text_bm.transform(df, "text").orderBy("id").collect()]
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    got = [r.p for r in df.select("id", text_bm.predict_udf()("text").alias("p")).orderBy("id").collect()]
    np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    # built once per worker (the preprocessor and its vocabulary travel in the payload),
    # weights in the executor's shared payload file
    builds = builds_by_worker(build_log, text_bm.key)
    assert builds and set(builds.values()) == {1}, builds
    records = build_records(build_log, text_bm.key)
    assert records and all(r["shared"] for r in records), records


@pytest.mark.slow  # 24 s of make test's 15 min
def test_a_null_text_is_an_invalid_row(spark, text_bm, classifier):
    texts = ["the cat sat on the mat", None, "a dog ran fast"]
    df = text_frame(spark, texts).coalesce(1)
    with pytest.raises(Exception, match=r"column 'text': null value\(s\), first at row 1"):
        text_bm.transform(df, "text").collect()
    want = classifier.predict([texts[0], texts[2]], verbose=0)
    transformed = text_bm.transform(df, "text", on_invalid="null").orderBy("id")
    selected = df.orderBy("id").select(text_bm.predict_udf(on_invalid="null")("text").alias("p"))
    for got in ([r.prediction for r in transformed.collect()], [r.p for r in selected.collect()]):
        assert got[1] is None
        np.testing.assert_allclose(np.array([got[0], got[2]]), want, atol=1e-5)


def test_dumps_and_loads_keep_the_preprocessor(classifier):
    copy = sk.loads(sk.dumps(classifier))
    assert type(copy.preprocessor) is type(classifier.preprocessor)
    assert signature_of(copy) == signature_of(classifier)
    want = classifier.predict(TEXTS, verbose=0)
    np.testing.assert_allclose(copy.predict(TEXTS, verbose=0), want, atol=1e-6)
    np.testing.assert_allclose(predictor_for(copy)([np.array(TEXTS, dtype=object)])[0], want, atol=1e-5)


@pytest.mark.slow  # 20 s of make test's 15 min
def test_an_image_classifier_scores_images_of_several_sizes(spark):
    classifier = models.hub_image_classifier()
    sig = signature_of(classifier)
    assert sig.inputs == (TensorSpec("image", (None, None, 3), "float32"),)
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, shape).astype("float32")
              for shape in [(20, 24, 3), (16, 16, 3), (20, 24, 3), (9, 30, 3)]]
    want = np.concatenate([classifier.predict(image[None], verbose=0) for image in images])
    df = spark.createDataFrame([(i, image.tolist()) for i, image in enumerate(images)],
                               "id long, image array<array<array<float>>>").repartition(2)
    bm = sk.BroadcastModel(spark, classifier)
    try:
        got = [r.prediction for r in bm.transform(df, "image").orderBy("id").collect()]
        np.testing.assert_allclose(np.array(got), want, atol=1e-5)
        got = [r.p for r in df.select("id", bm.predict_udf()("image").alias("p")).orderBy("id").collect()]
        np.testing.assert_allclose(np.array(got), want, atol=1e-5)
    finally:
        bm.destroy()


def test_only_a_preprocessor_the_model_does_not_call_is_run():
    class Scaled(keras.Model):  # keeps a layer named `preprocessor` and calls it itself
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.preprocessor = keras.layers.Rescaling(2.0)
            self.dense = keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, x):
            return self.dense(self.preprocessor(x))

    model = Scaled()
    model.build((None, 3))
    x = np.ones((2, 3), "float32")
    assert signature_of(model).inputs == (TensorSpec("input", (3,), "float32"),)
    np.testing.assert_allclose(predictor_for(model)([x])[0], np.full((2, 1), 6.0))

    task = models.hub_text_classifier()
    task.preprocessor = None  # the task model alone: its own inputs
    assert sorted(s.name for s in signature_of(task).inputs) == ["padding_mask", "segment_ids", "token_ids"]
    task.preprocessor = keras.layers.Identity()
    with pytest.raises(ModelError, match="cannot tell what the preprocessor Identity of "
                                         "BertTextClassifier takes"):
        signature_of(task)


@pytest.mark.slow  # 30-50 s: daemons of their own that import keras-hub
def test_workers_fork_from_a_daemon_that_preloaded_keras_hub(spark, build_log):
    reports = preloaded_daemons(spark, build_log)
    assert all("keras_hub" in r["preloaded"] for r in reports), reports
