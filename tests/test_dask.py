"""spark_keras.dask on a real LocalCluster: two worker processes, one thread each."""

from __future__ import annotations

import os
import pickle
import socket
import textwrap

import keras
import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

import spark_keras as sk  # noqa: E402
from spark_keras.cache import read_build_log  # noqa: E402
from spark_keras.dask import PRELOAD_ENV, predict_dask, ship  # noqa: E402

from . import models  # noqa: E402
from .conftest import builds_by_worker, run_script  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@keras.saving.register_keras_serializable(package="sk_dask_tests")
class Scaler(keras.Model):
    """The Dask story's subclassed model (with get_config)."""

    def __init__(self, units: int = 3, scale: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.scale = units, scale
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.scale * self.dense(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "scale": self.scale}


@pytest.fixture(scope="module")
def client(build_log):
    # Workers preload spark_keras.dask, which imports this module (it registers Scaler).
    env = {"SPARK_KERAS_BUILD_LOG": build_log, PRELOAD_ENV: __name__, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      preload=["spark_keras.dask"], env=env) as cluster, Client(cluster) as c:
        yield c


def _predict(model, x):
    return np.asarray(model(x)), type(model).__name__


def _predict_shipped(handle, x):
    return _predict(handle.value, x)


def _train(model, x, y):
    model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    return model.get_weights()


def _scaler(rng, **kwargs) -> Scaler:
    model = Scaler(**kwargs)
    model(rng.standard_normal((2, 5)).astype("float32"))
    return model


def test_subclassed_model_in_20_tasks(client, build_log, rng):
    model = _scaler(rng, units=3, scale=1.5)
    xs = [rng.standard_normal((4, 5)).astype("float32") for _ in range(20)]
    expected = [np.asarray(model(x)) for x in xs]

    handle = ship(client, model)
    assert len(pickle.dumps(handle)) < 200  # tasks carry a key, not the weights
    shipped = client.gather(client.map(_predict_shipped, [handle] * 20, xs))
    sk.make_picklable(model)
    copied = client.gather(client.map(_predict, [model] * 20, xs, pure=False))

    for results in (shipped, copied):
        for (got, cls), want in zip(results, expected):
            assert cls == "Scaler"
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    builds = builds_by_worker(build_log, handle.key)
    assert builds and len(builds) <= 2 and set(builds.values()) == {1}, builds
    records = [r for r in read_build_log(build_log) if r["key"] == handle.key]
    assert all(r["shared"] and r["private_bytes"] == 0 for r in records), records

    def host_files(dask_worker):
        folder = os.path.join(os.path.dirname(dask_worker.local_directory), "spark_keras")
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    seen = client.run(host_files)  # both workers of this host see the same one file
    assert all(names == [f"{handle.key}.skp", f"{handle.key}.skp.lock"] for names in seen.values()), seen
    handle.release()
    assert all(handle.key not in " ".join(names) for names in client.run(host_files).values())


def test_training_on_a_worker_returns_new_weights(client, rng):
    model = _scaler(rng, units=2)
    model.compile(optimizer="sgd", loss="mse")
    sk.make_picklable(model)
    before = [w.copy() for w in model.get_weights()]
    x = rng.standard_normal((64, 5)).astype("float32")
    y = rng.standard_normal((64, 2)).astype("float32")

    trained = client.submit(_train, model, x, y, pure=False).result(timeout=120)

    assert [w.shape for w in trained] == [w.shape for w in before]
    assert any(not np.array_equal(a, b) for a, b in zip(before, trained))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_predict_dask_array_and_dataframe(client, build_log, rng):
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    mlp = models.mlp(8, 16, 3)
    x = rng.standard_normal((100, 8)).astype("float32")
    with ship(client, mlp) as handle:
        scored = predict_dask(handle, da.from_array(x, chunks=(30, 4)))
        assert scored.shape == (100, 3)
        np.testing.assert_allclose(scored.compute(), np.asarray(mlp(x)), atol=1e-5, rtol=0)
        key = handle.key
    assert set(builds_by_worker(build_log, key).values()) == {1}

    two = models.multi_io()
    inputs = models.random_like_inputs(two, 50, seed=3)
    columns = {"a": [f"a{i}" for i in range(4)], "b": [f"b{i}" for i in range(6)]}
    frame = pd.DataFrame(np.concatenate([inputs["a"], inputs["b"].reshape(50, 6)], axis=1),
                         columns=columns["a"] + columns["b"], index=np.arange(100, 150))
    with ship(client, two) as handle:
        scored = predict_dask(handle, dd.from_pandas(frame, npartitions=3), columns=columns)
        assert list(scored.columns) == ["score", "probs_0", "probs_1", "probs_2"]
        out = scored.compute()
    expected = two(inputs)
    assert list(out.index) == list(frame.index)
    np.testing.assert_allclose(out["score"].to_numpy(), np.asarray(expected["score"])[:, 0],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(out[["probs_0", "probs_1", "probs_2"]].to_numpy(),
                               np.asarray(expected["probs"]), atol=1e-5, rtol=0)


def test_workers_started_later_get_the_model_and_the_preload(client, build_log, rng):
    model = _scaler(rng, units=4)
    handle = ship(client, model)  # before the new worker exists
    old = set(client.scheduler_info()["workers"])
    client.cluster.scale(3)
    try:
        client.wait_for_workers(3, timeout=180)
        (new,) = set(client.scheduler_info()["workers"]) - old
        # Before any task ran there: the preload imported this module (registering Scaler)
        # and nothing else of the test suite.
        registered = client.run(keras.saving.get_registered_object, "sk_dask_tests>Scaler",
                                workers=[new])
        assert registered[new] is Scaler
        other = client.run(keras.saving.get_registered_object, "sk_pickle_tests>Doubler",
                           workers=[new])
        assert other[new] is None

        x = rng.standard_normal((3, 5)).astype("float32")
        got, _ = client.submit(_predict_shipped, handle, x, workers=[new],
                               allow_other_workers=False).result(timeout=120)
        np.testing.assert_allclose(got, np.asarray(model(x)), atol=1e-6, rtol=0)
        new_pid = client.run(os.getpid, workers=[new])[new]
        assert builds_by_worker(build_log, handle.key).get((socket.gethostname(), new_pid)) == 1
    finally:
        client.cluster.scale(2)
        client.wait_for_workers(2)


def test_loading_failures_raise_in_the_task(client, rng):
    unsafe = keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t * 2.0)])
    x = rng.standard_normal((2, 3)).astype("float32")

    with ship(client, unsafe) as handle:  # safe_mode=True: workers refuse the Lambda
        with pytest.raises(sk.PayloadError, match="safe_mode"):
            client.submit(_predict_shipped, handle, x).result(timeout=120)

    with pytest.raises(Exception) as info:  # the scheduler rebuilds submitted models first
        client.submit(_predict, sk.make_picklable(unsafe), x, pure=False).result(timeout=120)
    assert not isinstance(info.value, TimeoutError)

    good = ship(client, models.mlp(3, 4, 1))
    client.submit(_predict_shipped, good, x).result(timeout=120)
    good.release()
    with pytest.raises(sk.SparkKerasError, match="released"):
        client.submit(_predict_shipped, good, x, pure=False).result(timeout=120)
    assert all(good.key not in stats["keys"] for stats in client.run(sk.cache_info).values())


MAIN_DRIVER = textwrap.dedent('''
    import dask, numpy as np, keras
    from distributed import Client, LocalCluster
    import spark_keras as sk
    from spark_keras.dask import ship

    def predict(model, x):
        return np.asarray(model(x))

    def predict_shipped(handle, x):
        return np.asarray(handle.value(x))

    if __name__ == "__main__":
        # Defined under the guard: spawned workers re-import this script as __mp_main__
        # without it, so the class exists only in the driver's __main__.
        class Squash(keras.layers.Layer):
            def __init__(self, power=2.0, **kwargs):
                super().__init__(**kwargs)
                self.power = power
            def build(self, shape):
                self.scale = self.add_weight(shape=(shape[-1],), initializer="random_normal")
            def call(self, x):
                return keras.ops.tanh(x * self.scale) ** self.power
            def get_config(self):
                return {**super().get_config(), "power": self.power}

        model = keras.Sequential([keras.Input((4,)), Squash(3.0), keras.layers.Dense(2)])
        sk.make_picklable(model)                  # no custom_objects anywhere
        x = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")
        expected = np.asarray(model(x))
        dask.config.set({"distributed.scheduler.allowed-failures": 0})  # fail, don't retry
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            got = client.submit(predict, model, x, pure=False).result(timeout=150)
            np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
            got = client.submit(predict_shipped, ship(client, model), x).result(timeout=150)
            np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
        print("MAIN-OBJECTS-OK")
''')


def test_custom_layer_from_main_reaches_workers(tmp_path):
    run_script(tmp_path, MAIN_DRIVER, "MAIN-OBJECTS-OK")
