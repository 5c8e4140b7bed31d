"""The engine's compiled call (``flavour.TracedCall``) goes straight to the traced concrete
function once traced: the same bits as through the ``tf.function``, for every kind of
model; one trace for every batch size; past the ``tf.function``'s dispatch; inputs off
the signature, and ``run_functions_eagerly``, still go through the ``tf.function``."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from spark_keras.inference.predictor import Predictor

SIZES = (1, 7, 64, 300)  # rows per call


@keras.saving.register_keras_serializable(package="sk_traced_call_tests")
class Gate(layers.Layer):
    """A custom layer: ``x * sigmoid(x @ w)``; counts the Python calls of ``call``."""

    calls = 0

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], shape[-1]), initializer="glorot_uniform")

    def call(self, x):
        Gate.calls += 1
        return x * keras.ops.sigmoid(keras.ops.matmul(x, self.w))


def _models(rng) -> dict:
    """name -> (model, its inputs for 300 rows)."""
    a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
    two = keras.Model([a, b], [layers.Dense(2)(layers.Concatenate()([a, b])), layers.Dense(1)(b)])
    da, db = keras.Input((4,), name="left"), keras.Input((2,), name="right")
    named = keras.Model({"left": da, "right": db}, layers.Dense(3)(layers.Concatenate()([da, db])))
    h = keras.Input((6,), dtype="float16")
    half = keras.Model(h, layers.Dense(4, dtype="float16")(h))
    m = keras.Input((6,))
    mixed = keras.Model(m, layers.Dense(1, dtype="float32")(layers.Dense(8, dtype="mixed_float16")(m)))
    g = keras.Input((8,))
    custom = keras.Model(g, layers.Dense(2)(Gate()(g)))
    s = keras.Input((None, 3))
    steps = keras.Model(s, layers.GRU(4)(s))

    def x(*shape, dtype="float32"):
        return rng.standard_normal((300, *shape)).astype(dtype)

    return {"two inputs, two outputs": (two, [x(5), x(3)]),
            "dict input": (named, [x(4), x(2)]),
            "float16": (half, [x(6, dtype="float16")]),
            "mixed_float16": (mixed, [x(6)]),
            "custom layer": (custom, [x(8)]),
            "unknown steps": (steps, [x(11, 3)])}


@pytest.mark.parametrize("kind", ["two inputs, two outputs", "dict input", "float16",
                                  "mixed_float16", "custom layer", "unknown steps"])
def test_the_direct_call_gives_the_tf_function_s_bits(kind):
    model, inputs = _models(np.random.default_rng(7))[kind]
    predictor = Predictor(model)
    call = predictor._call
    for rows in SIZES:
        chunk = [x[:rows] for x in inputs]
        got = call(chunk)
        want = [t.numpy() for t in call.function(*chunk)]  # the call as it was
        assert [(g.dtype, g.shape) for g in got] == [(w.dtype, w.shape) for w in want]
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want)), (kind, rows)
    assert call._concrete is not None  # the calls after the first went to it
    whole = predictor(inputs, batch_size=64)
    want = [np.concatenate(c) for c in zip(*(
        [t.numpy() for t in call.function(*[x[i:i + 64] for x in inputs])]
        for i in range(0, 300, 64)))]
    assert all(g.tobytes() == w.tobytes() for g, w in zip(whole, want)), kind
    assert predictor.traces == 1  # every batch size: one trace


def test_a_call_after_the_first_skips_the_tf_function_s_dispatch():
    """Once traced, a call goes to the concrete function, not through the ``tf.function``
    (its dispatch was half a small call's fixed cost: ``python -m bench.call_cost`` times
    it; no timing here, where other processes share the cores)."""
    model = keras.Sequential([keras.Input((64,)), layers.Dense(256, activation="relu"),
                              layers.Dense(1)])
    call = Predictor(model)._call
    x = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    call([x])
    through, dispatched = call.function, []
    call.function = lambda *args: dispatched.append(args) or through(*args)
    direct = call([x])
    assert dispatched == []
    assert direct[0].tobytes() == through(x)[0].numpy().tobytes()


def test_inputs_off_the_signature_go_through_the_tf_function():
    """float64 rows are converted as the signature converts them (the same bits); rows of
    another width get the tf.function's own error."""
    model = keras.Sequential([keras.Input((4,)), layers.Dense(2)])
    call = Predictor(model)._call
    x = np.random.default_rng(1).standard_normal((9, 4))
    call([x.astype("float32")])
    assert call([x])[0].tobytes() == call([x.astype("float32")])[0].tobytes()
    with pytest.raises(TypeError) as through:
        call.function(np.zeros((3, 5), "float32"))
    with pytest.raises(TypeError) as direct:
        call([np.zeros((3, 5), "float32")])
    assert str(direct.value) == str(through.value)


def test_run_functions_eagerly_still_runs_the_model_eagerly():
    g = keras.Input((8,))
    call = Predictor(keras.Model(g, Gate()(g)))._call
    x = np.ones((3, 8), "float32")
    call([x])
    before = Gate.calls
    call([x])
    assert Gate.calls == before  # the traced graph: no Python
    tf.config.run_functions_eagerly(True)
    try:
        call([x])
    finally:
        tf.config.run_functions_eagerly(False)
    assert Gate.calls == before + 1
