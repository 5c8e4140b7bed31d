"""Legacy tf-keras 2.x (``TF_USE_LEGACY_KERAS=1``): payload, pickling, Spark, spawn.

Runs in the tf-keras leg of ``make test-compat`` (a venv with tf-keras, this process
started with ``TF_USE_LEGACY_KERAS=1``); skipped in a Keras 3 process. The seed 001
story is here: a 42-input sigmoid ``Sequential`` compiled with Nadam, broadcast to
Spark executors.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from spark_keras import flavour

pytestmark = pytest.mark.skipif(
    not flavour.legacy_requested(), reason="tf-keras leg: run with TF_USE_LEGACY_KERAS=1")

if flavour.legacy_requested():
    import tf_keras as keras

import spark_keras as sk  # noqa: E402
from spark_keras.errors import PayloadError  # noqa: E402
from tests.conftest import DAEMON, REPO_ROOT, builds_by_worker, make_spark, preloaded_daemons  # noqa: E402


def seed_model(rng, fit: bool = True):
    """The seed 001 model, trained a little so the optimizer has slots."""
    from tf_keras.layers import Dense
    from tf_keras.models import Sequential

    model = Sequential()
    model.add(Dense(1, input_dim=42, activation="sigmoid"))
    model.compile(optimizer="Nadam", loss="binary_crossentropy", metrics=["accuracy"])
    if fit:
        x = rng.standard_normal((256, 42)).astype("float32")
        model.fit(x, (x[:, 0] > 0).astype("float32"), epochs=2, batch_size=32, verbose=0)
    return model


def rich_model():
    """Functional, dict inputs and outputs, an adapted StringLookup (an asset),
    BatchNormalization (non-trainable state) and a float64 layer."""
    words = keras.Input((1,), dtype="string", name="words")
    nums = keras.Input((3,), name="nums")
    lookup = keras.layers.StringLookup(name="lookup")
    lookup.adapt(np.array([["red"], ["green"], ["green"], ["blue"]]))
    ids = keras.layers.Flatten()(keras.layers.Embedding(5, 4, name="emb")(lookup(words)))
    norm = keras.layers.BatchNormalization(name="bn")
    h = keras.layers.Concatenate()([ids, norm(nums)])
    out_a = keras.layers.Dense(2, name="a")(h)
    out_b = keras.layers.Dense(1, name="b", dtype="float64")(h)
    model = keras.Model({"words": words, "nums": nums}, {"a": out_a, "b": out_b})
    norm.moving_mean.assign([1.0, -2.0, 0.5])  # non-default, non-trainable state
    norm.moving_variance.assign([4.0, 0.25, 2.0])
    return model


def rich_inputs(rng, n: int = 8):
    words = np.array([["red"], ["blue"], ["purple"], ["green"]] * (n // 4))
    return {"words": words, "nums": rng.standard_normal((n, 3)).astype("float32")}


def same_predictions(a, b, x) -> None:
    pa, pb = a.predict(x, verbose=0), b.predict(x, verbose=0)
    if isinstance(pa, dict):
        assert pa.keys() == pb.keys()
        for k in pa:
            assert pa[k].dtype == pb[k].dtype and np.array_equal(pa[k], pb[k]), k
    else:
        assert np.array_equal(pa, pb)


def test_process_runs_tf_keras():
    fl = flavour.current()
    assert fl.name == flavour.TF_KERAS and fl.version.startswith("2.")


def test_seed_model_round_trips_with_compile_config_and_optimizer_slots(rng):
    model = seed_model(rng)
    x = rng.standard_normal((50, 42)).astype("float32")

    plain = sk.loads(sk.dumps(model))
    same_predictions(model, plain, x)
    assert plain.optimizer is None  # compile state only when asked for

    trained = sk.loads(sk.dumps(model, include_optimizer=True))
    same_predictions(model, trained, x)
    assert trained.get_compile_config() == model.get_compile_config()
    assert type(trained.optimizer).__name__ == "Nadam"
    saved = [v.numpy() for v in model.optimizer.variables]
    loaded = [v.numpy() for v in trained.optimizer.variables]
    assert len(saved) == len(loaded) == 5  # iteration, m and v of kernel and bias
    assert all(np.array_equal(s, v) for s, v in zip(saved, loaded))


def test_adam_training_resumes_exactly_after_round_trip(rng):
    # (Nadam also keeps a u-product outside its variables, which no tf-keras format
    # saves, so only slot-only optimizers can resume bit for bit.)
    model = keras.Sequential([keras.Input((42,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    x = rng.standard_normal((64, 42)).astype("float32")
    y = (x[:, 0] > 0).astype("float32")
    model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
    copy = sk.loads(sk.dumps(model, include_optimizer=True))
    model.fit(x, y, epochs=1, batch_size=16, shuffle=False, verbose=0)
    copy.fit(x, y, epochs=1, batch_size=16, shuffle=False, verbose=0)
    same_predictions(model, copy, x)


def test_payload_matches_tf_keras_own_keras_format(rng, tmp_path):
    model = rich_model()
    x = rich_inputs(rng)
    path = tmp_path / "rich.keras"
    model.save(path)
    reference = keras.saving.load_model(path)
    ours = sk.loads(sk.dumps(model))
    same_predictions(reference, ours, x)
    same_predictions(model, ours, x)
    assert ours.get_layer("lookup").get_vocabulary() == model.get_layer("lookup").get_vocabulary()
    assert np.array_equal(ours.get_layer("bn").moving_mean.numpy(), [1.0, -2.0, 0.5])
    assert ours.get_layer("b").dtype == "float64"


def test_save_load_file_and_make_picklable(rng, tmp_path):
    model = seed_model(rng, fit=False)
    x = rng.standard_normal((20, 42)).astype("float32")
    sk.save(model, tmp_path / "seed.skp")
    same_predictions(model, sk.load(tmp_path / "seed.skp"), x)

    copy = pickle.loads(pickle.dumps(sk.make_picklable(model)))
    same_predictions(model, copy, x)
    assert copy.get_compile_config() == model.get_compile_config()


def test_subclassed_model_with_auto_config(rng):
    @keras.saving.register_keras_serializable(package="tfk_tests")
    class Scaled(keras.Model):
        def __init__(self, units=2, scale=1.0, **kwargs):
            super().__init__(**kwargs)
            self.units, self.scale = units, scale
            self.dense = keras.layers.Dense(units)

        def call(self, x):
            return self.dense(x) * self.scale

    model = Scaled(units=3, scale=2.5)
    model.build((None, 4))
    back = sk.loads(sk.dumps(model))
    x = rng.standard_normal((6, 4)).astype("float32")
    assert (back.units, back.scale) == (3, 2.5)
    np.testing.assert_array_equal(back(x).numpy(), model(x).numpy())
    # the scoring helpers read a subclassed model's signature from its build shape
    from spark_keras.inference.predictor import predictor_for

    predictor = predictor_for(back)
    assert [(t.shape, t.dtype) for t in predictor.signature.inputs] == [((4,), "float32")]
    assert [t.shape for t in predictor.signature.outputs] == [(3,)]
    np.testing.assert_allclose(predictor([x])[0], model(x).numpy(), rtol=0, atol=1e-6)


def test_buckets_pad_a_masked_tf_keras_gru_and_refuse_an_unmasked_one(rng):
    from spark_keras.errors import ArgumentError
    from spark_keras.handle import ModelHandle
    from spark_keras.inference.buckets import checked

    inp = keras.Input((None, 3), name="sequence")
    masked = keras.Model(inp, keras.layers.Dense(2)(keras.layers.GRU(4)(keras.layers.Masking(0.0)(inp))))
    rows = np.empty(40, dtype=object)
    rows[:] = [rng.standard_normal((int(k), 3)).astype("float32") for k in rng.integers(1, 30, 40)]
    handle = ModelHandle("masked", 0, model=masked)
    predictor = handle.predictor
    got = predictor([rows], 64, None, buckets=checked(handle, 3))[0]
    want = np.array([masked(r[None], training=False).numpy()[0] for r in rows])
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert predictor.traces == 1
    unmasked = ModelHandle("plain", 0, model=keras.Model(inp, keras.layers.GRU(4)(inp)))
    with pytest.raises(ArgumentError, match=r"input 'sequence' feeds GRU, and no Masking layer"):
        checked(unmasked, 3)


def test_the_direct_call_gives_the_tf_function_s_bits_under_tf_keras(rng):
    """The compiled call goes to the traced concrete function under tf-keras too (dict
    inputs, two outputs): the tf.function's bits, one trace for every batch size."""
    from spark_keras.inference.predictor import Predictor

    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    model = keras.Model({"a": a, "b": b}, [keras.layers.Dense(2)(joined), keras.layers.Dense(1)(b)])
    predictor = Predictor(model)
    call = predictor._call
    inputs = [rng.standard_normal((300, 5)).astype("float32"),
              rng.standard_normal((300, 3)).astype("float32")]
    for rows in (1, 7, 64, 300):
        got = call([x[:rows] for x in inputs])
        want = [t.numpy() for t in call.function(*[x[:rows] for x in inputs])]
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want], rows
    assert call._concrete is not None and predictor.traces == 1


def test_keras3_model_is_refused_under_tf_keras():
    import keras as keras3  # Keras 3 imports fine beside tf-keras

    model = keras3.Sequential([keras3.Input((2,)), keras3.layers.Dense(1)])
    with pytest.raises(PayloadError, match="expected a tf-keras Model"):
        sk.dumps(model)


def _in_keras3_process(script: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_USE_LEGACY_KERAS="0")
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


def test_cross_flavour_payloads_are_refused_both_ways(rng, tmp_path):
    ours = tmp_path / "tf_keras.skp"
    sk.save(seed_model(rng, fit=False), ours)
    theirs = tmp_path / "keras3.skp"
    proc = _in_keras3_process(
        "import keras, spark_keras as sk\n"
        "m = keras.Sequential([keras.Input((42,)), keras.layers.Dense(1)])\n"
        f"sk.save(m, {str(theirs)!r})\n"
        "try:\n"
        f"    sk.load({str(ours)!r})\n"
        "except sk.PayloadError as e:\n"
        "    print('REFUSED:', e)\n", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a tf-keras payload in a Keras 3 process: says how to switch executors to tf-keras
    assert "REFUSED:" in proc.stdout and "'tf_keras'" in proc.stdout
    assert "spark.executorEnv.TF_USE_LEGACY_KERAS=1" in proc.stdout
    # a Keras 3 payload here
    with pytest.raises(PayloadError, match=r"'keras3' 3\..*TF_USE_LEGACY_KERAS"):
        sk.load(theirs)


# --- Spark: the seed 001 story ------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(build_log):
    session = make_spark("local-cluster[2,1,1024]", build_log,
                         **{"spark.executorEnv.TF_USE_LEGACY_KERAS": "1",
                            "spark.task.maxFailures": "1"})
    yield session
    session.stop()


def test_seed_001_broadcast_scores_on_executors(cluster, build_log):
    from pyspark.ml.linalg import Vectors, VectorUDT
    from pyspark.sql import types as T

    rng = np.random.default_rng(1)
    model = seed_model(rng)
    x = rng.standard_normal((600, 42)).astype("float32")
    expected = model.predict(x, verbose=0).ravel()
    df = cluster.createDataFrame(
        [(i, x[i].tolist(), Vectors.dense(x[i].astype("float64"))) for i in range(len(x))],
        T.StructType([T.StructField("id", T.LongType()),
                      T.StructField("features", T.ArrayType(T.FloatType())),
                      T.StructField("vec", VectorUDT())])).repartition(6)

    bm = sk.BroadcastModel(cluster, model)
    by_transform = {r.id: r.prediction for r in bm.transform(df, "features").collect()}
    by_udf = {r.id: r.p for r in df.select("id", bm.predict_udf()("vec").alias("p")).collect()}

    def score(part):  # (id, prediction, executor working directory) per row
        part = list(part)
        preds = bm.predict_partition([f for _, f in part])
        return [(i, p, os.getcwd()) for (i, _), p in zip(part, preds)]

    scored = df.rdd.map(lambda r: (r.id, r.features)).mapPartitions(score).collect()
    by_rows = {i: p for i, p, _ in scored}
    assert len({cwd for _, _, cwd in scored}) == 2  # tasks really ran in both executors

    for got in (by_transform, by_udf, by_rows):
        assert len(got) == len(x)
        np.testing.assert_allclose([got[i] for i in range(len(x))], expected, rtol=0, atol=1e-6)
    builds = builds_by_worker(build_log, bm.key)
    assert builds and all(n == 1 for n in builds.values()), builds
    assert len(builds) >= 2  # one build in each executor's Python worker, at least
    bm.destroy()
    if DAEMON == "spark_keras.executor.daemon":  # the workers forked from daemons with tf-keras loaded
        daemons = preloaded_daemons(cluster, build_log)
        assert len(daemons) == 2 and all(d["keras"].startswith("tf_keras 2.") for d in daemons), daemons


def test_executor_without_tf_keras_flag_fails_with_the_fix(cluster):
    rng = np.random.default_rng(2)
    model = seed_model(rng, fit=False)
    df = cluster.createDataFrame([(rng.standard_normal(42).tolist(),)], "features array<float>")
    bm = sk.BroadcastModel(cluster, model)
    env = cluster.sparkContext.environment  # what Python UDFs created from now on carry
    env["TF_USE_LEGACY_KERAS"] = "0"
    try:
        with pytest.raises(Exception) as failure:
            bm.transform(df, "features").collect()
    finally:
        env["TF_USE_LEGACY_KERAS"] = "1"
        bm.destroy()
    text = str(failure.value)
    assert "PayloadError" in text and "spark.executorEnv.TF_USE_LEGACY_KERAS=1" in text


# --- multiprocessing (spawn): the seed 003 story was legacy tf.keras too -------------------

SEED_003_SCRIPT = """
import multiprocessing as mp
import numpy as np
import tf_keras as keras
import spark_keras as sk

class Gate(keras.layers.Layer):              # a custom layer living in __main__
    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(shape[-1],), initializer="random_normal")
    def call(self, x):
        return x * keras.activations.sigmoid(self.w)

def act(model, x, results):
    results.put(np.asarray(model(x)))

if __name__ == "__main__":
    mp.set_start_method("spawn")
    model = keras.Sequential([keras.Input((8,)), Gate(), keras.layers.Dense(3)])
    model = sk.make_picklable(model)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    results = mp.Queue()
    child = mp.Process(target=act, args=(model, x, results))
    child.start()
    got = results.get(timeout=200)
    child.join(60)
    assert child.exitcode == 0, child.exitcode
    np.testing.assert_array_equal(got, np.asarray(model(x)))
    print("SPAWN-OK")
"""


def test_seed_003_spawned_process_receives_model_with_main_layer(tmp_path):
    from tests.conftest import run_script

    run_script(tmp_path, SEED_003_SCRIPT, "SPAWN-OK")  # inherits TF_USE_LEGACY_KERAS=1


def test_spawned_pool_scores_tf_keras_model(rng):
    from spark_keras.multiprocessing import pool_predict

    model = seed_model(rng, fit=False)
    x = rng.standard_normal((300, 42)).astype("float32")
    got = pool_predict(model, x, processes=2, batch_size=64)
    np.testing.assert_allclose(np.asarray(got).ravel(), model.predict(x, verbose=0).ravel(),
                               rtol=0, atol=1e-6)


# --- the spark-submit job ------------------------------------------------------------------

def test_score_job_runs_tf_keras_model(tmp_path):
    import pandas as pd

    from tests.conftest import submit_score_job

    rng = np.random.default_rng(3)
    model = seed_model(rng, fit=False)
    model.save(tmp_path / "seed.keras")  # tf-keras's own format, as a user would have it
    x = rng.standard_normal((120, 42)).astype("float32")
    pd.DataFrame({"id": np.arange(120), "features": list(x)}).to_parquet(tmp_path / "in.parquet")
    out = tmp_path / "scored.parquet"
    # conf/spark-defaults.conf does not pin the flavour: the job passes the driver's on
    proc = submit_score_job("--model", str(tmp_path / "seed.keras"), "--input",
                            str(tmp_path / "in.parquet"), "--output", str(out),
                            "--features", "features")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    scored = pd.read_parquet(out).sort_values("id")
    np.testing.assert_allclose(scored["prediction"].to_numpy(),
                               model.predict(x, verbose=0).ravel(), rtol=0, atol=1e-6)
