"""make_picklable: pickle, cloudpickle and spawned processes receive working, independent models."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import subprocess
import sys
import textwrap

import cloudpickle
import keras
import numpy as np
import pytest

import spark_keras as sk
from tests import models


def _child_predict(model, x, conn):
    conn.send(np.asarray(model(x, training=False)))
    conn.close()


def test_pickle_and_cloudpickle_round_trip(rng):
    model = sk.make_picklable(models.actor_cnn())
    x = rng.standard_normal((2, 120, 160, 2)).astype("float32")
    expected = np.asarray(model(x))
    for dumps, loads in ((pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)):
        data = dumps(model)
        assert sk.dumps(model)[:8] in data  # the payload travels, not a .keras zip
        clone = loads(data)
        np.testing.assert_allclose(np.asarray(clone(x)), expected, atol=1e-6, rtol=0)


def test_make_picklable_is_idempotent_and_returns_its_argument():
    model = models.mlp()
    assert sk.make_picklable(sk.make_picklable(model)) is model
    assert isinstance(pickle.loads(pickle.dumps(model)), keras.Model)


def test_unpickled_model_is_independent(rng):
    model = models.seed_001_model()
    sk.make_picklable(model)
    before = [w.copy() for w in model.get_weights()]
    clone = pickle.loads(pickle.dumps(model))
    assert clone.compiled  # make_picklable keeps the compile config by default
    x = rng.standard_normal((64, 42)).astype("float32")
    clone.fit(x, rng.integers(0, 2, (64, 1)), epochs=3, verbose=0)
    assert any(not np.array_equal(a, b) for a, b in zip(before, clone.get_weights()))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@keras.saving.register_keras_serializable(package="sk_pickle_tests")
class Doubler(keras.Model):
    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return 2.0 * self.dense(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units}


def test_make_picklable_on_a_class_covers_every_instance(rng):
    sk.make_picklable(Doubler)
    x = rng.standard_normal((3, 4)).astype("float32")
    a, b = Doubler(units=2), Doubler(units=5)
    a(x), b(x)
    for model in (a, b):
        clone = pickle.loads(pickle.dumps(model))
        assert isinstance(clone, Doubler) and clone.units == model.units
        np.testing.assert_allclose(np.asarray(clone(x)), np.asarray(model(x)), atol=1e-6)


@pytest.mark.slow  # 9 s of make test's 15 min
def test_spawned_process_receives_the_model(rng):
    """The multiprocessing story (seed 003): pass the model in Process(args=...) under spawn."""
    model = sk.make_picklable(models.actor_cnn())
    x = rng.standard_normal((2, 120, 160, 2)).astype("float32")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_predict, args=(model, x, child))
    proc.start()
    got = parent.recv() if parent.poll(240) else None
    proc.join(60)
    assert proc.exitcode == 0 and got is not None
    np.testing.assert_array_equal(got, np.asarray(model(x)))


MAIN_SCRIPT = textwrap.dedent('''
    import sys, cloudpickle, numpy as np, keras
    import spark_keras as sk

    class TimesW(keras.layers.Layer):          # defined in __main__ only
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1],), initializer="random_normal")
        def call(self, x):
            return x * self.w

    model = keras.Sequential([keras.Input((3,)), TimesW(), keras.layers.Dense(2)])
    sk.make_picklable(model)
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.save(sys.argv[2], np.asarray(model(x)))
    with open(sys.argv[1], "wb") as f:
        cloudpickle.dump(model, f)
''')

LOAD_SCRIPT = textwrap.dedent('''
    import sys, pickle, numpy as np
    with open(sys.argv[1], "rb") as f:
        model = pickle.load(f)     # no custom_objects, no access to the script's classes
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(model(x)), np.load(sys.argv[2]))
    print("OK", type(model.layers[0]).__name__)
''')


@pytest.mark.slow  # 13 s of make test's 15 min
def test_classes_defined_in_main_travel_by_value_with_cloudpickle(tmp_path):
    (tmp_path / "make.py").write_text(MAIN_SCRIPT)
    (tmp_path / "use.py").write_text(LOAD_SCRIPT)
    pkl, npy = str(tmp_path / "m.pkl"), str(tmp_path / "y.npy")
    subprocess.run([sys.executable, str(tmp_path / "make.py"), pkl, npy], check=True, cwd=tmp_path,
                   capture_output=True, timeout=240)
    out = subprocess.run([sys.executable, str(tmp_path / "use.py"), pkl, npy], cwd=tmp_path,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK TimesW" in out.stdout
