"""Payload round-trips: every model kind comes back with identical predictions."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
from keras import layers

import spark_keras as sk
from spark_keras.payload import format as fmt
from spark_keras.payload.codec import load_mapped
from tests import models


def predict(model, x):
    return keras.tree.map_structure(lambda t: keras.ops.convert_to_numpy(t),
                                    model(x, training=False))


def assert_same_predictions(a, b, x, atol=1e-6):
    pa, pb = keras.tree.flatten(predict(a, x)), keras.tree.flatten(predict(b, x))
    assert len(pa) == len(pb)
    for u, v in zip(pa, pb):
        assert u.shape == v.shape and u.dtype == v.dtype
        np.testing.assert_allclose(u, v, atol=atol, rtol=0)


def names(variables):
    """Variable names, auto-numbered ones ("variable_7") without their number."""
    return [re.sub(r"^variable_\d+$", "variable", v.name) for v in variables]


def round_trip(model, x, **kwargs):
    dump_kw = {k: kwargs.pop(k) for k in ("include_optimizer",) if k in kwargs}
    data = sk.dumps(model, **dump_kw)
    assert isinstance(data, bytes) and sk.is_payload(data)
    clone = sk.loads(data, **kwargs)
    assert clone is not model
    assert_same_predictions(model, clone, x)
    # (paths are not compared: Keras's own loader drops the model-name prefix too)
    assert names(clone.weights) == names(model.weights)
    for v1, v2 in zip(model.weights, clone.weights):
        assert v1.dtype == v2.dtype and v1.shape == v2.shape
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v1), keras.ops.convert_to_numpy(v2))
    return clone


def test_sequential(rng):
    model = models.mlp()
    round_trip(model, rng.standard_normal((7, 8)).astype("float32"))


def test_functional_multi_input_multi_output():
    model = models.multi_io()
    round_trip(model, models.random_like_inputs(model, 6))


@keras.saving.register_keras_serializable(package="sk_tests")
class Residual(keras.Model):
    def __init__(self, units=4, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.units, self.activation = units, activation
        self.inner = layers.Dense(units, activation=activation)
        self.out = layers.Dense(2)

    def call(self, x):
        return self.out(x[..., : self.units] + self.inner(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation}


def test_subclassed_model_with_get_config(rng):
    model = Residual(units=3, activation="tanh")
    x = rng.standard_normal((5, 3)).astype("float32")
    model(x)
    clone = round_trip(model, x)
    assert isinstance(clone, Residual) and clone.activation == "tanh"


class AutoConfigModel(keras.Model):
    def __init__(self, units=4, act="relu", **kwargs):
        super().__init__(**kwargs)
        self.d = layers.Dense(units, activation=act)

    def call(self, x):
        return self.d(x)


def test_auto_config_model_that_loses_arguments_is_refused(rng):
    model = AutoConfigModel(units=4, act="tanh")  # auto-config records act="relu"
    model(rng.standard_normal((2, 5)).astype("float32"))
    with pytest.raises(sk.PayloadError, match="get_config"):
        sk.dumps(model)


def test_auto_config_model_with_wrong_shape_is_refused(rng):
    model = AutoConfigModel(units=3)  # comes back with units=4: weights do not fit
    model(rng.standard_normal((2, 5)).astype("float32"))
    with pytest.raises(sk.PayloadError, match="get_config"):
        sk.dumps(model)


@keras.saving.register_keras_serializable(package="sk_tests")
class ScaledDense(layers.Layer):
    def __init__(self, units, scale=2.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.scale = units, scale

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units), initializer="glorot_uniform")
        self.counter = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int32")

    def call(self, x):
        return self.scale * keras.ops.matmul(x, self.kernel)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "scale": self.scale}


class UnregisteredScale(layers.Layer):
    def __init__(self, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="random_normal")

    def call(self, x):
        return x * self.w * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


def test_registered_custom_layer(rng):
    model = keras.Sequential([keras.Input((6,)), ScaledDense(3, scale=0.5)])
    model.layers[0].counter.assign(7)
    clone = round_trip(model, rng.standard_normal((4, 6)).astype("float32"))
    assert int(clone.layers[0].counter.numpy()) == 7


def test_unregistered_custom_layer_needs_custom_objects(rng):
    model = keras.Sequential([keras.Input((6,)), UnregisteredScale(3.0), layers.Dense(2)])
    x = rng.standard_normal((4, 6)).astype("float32")
    data = sk.dumps(model)
    with pytest.raises(sk.PayloadError, match="custom_objects"):
        sk.loads(data)
    clone = sk.loads(data, custom_objects={"UnregisteredScale": UnregisteredScale})
    assert_same_predictions(model, clone, x)


def test_nested_models(rng):
    inner = keras.Sequential([keras.Input((5,)), layers.Dense(4, activation="relu")], name="inner")
    inp = keras.Input((5,))
    outer = keras.Model(inp, layers.Dense(2)(inner(inp) + inner(inp)), name="outer")
    wrapper = keras.Sequential([keras.Input((5,)), outer, layers.Dense(1)])
    round_trip(wrapper, rng.standard_normal((3, 5)).astype("float32"))


def test_batchnorm_embedding_lstm_conv(rng):
    tokens = keras.Input((7,), dtype="int32")
    e = layers.Embedding(50, 8)(tokens)
    s = layers.LSTM(6)(e)
    image = keras.Input((10, 10, 3))
    c = layers.Conv2D(4, 3)(image)
    c = layers.BatchNormalization()(c)
    c = layers.GlobalAveragePooling2D()(c)
    out = layers.Dense(1)(layers.Concatenate()([s, c]))
    model = keras.Model([tokens, image], out)
    model.compile("adam", "mse")
    xs = [rng.integers(0, 50, (16, 7)).astype("int32"), rng.standard_normal((16, 10, 10, 3)).astype("float32")]
    model.fit(xs, rng.standard_normal((16, 1)), epochs=2, verbose=0)
    bn = [lay for lay in model.layers if isinstance(lay, layers.BatchNormalization)][0]
    assert np.abs(bn.moving_mean.numpy()).sum() > 0  # non-trainable state really moved
    round_trip(model, xs)


def test_compiled_model_restores_compile_config_when_asked(tmp_path, rng):
    model = models.seed_001_model()
    x = rng.standard_normal((64, 42)).astype("float32")
    model.fit(x, rng.integers(0, 2, (64, 1)), epochs=2, verbose=0)
    plain = round_trip(model, x)
    assert not plain.compiled
    full = round_trip(model, x, include_optimizer=True)
    assert full.compiled and type(full.optimizer).__name__ == "Nadam"
    assert int(full.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) > 0
    # the same slots as Keras's own loader gives (names hold the variable path, which
    # loses the model-name prefix on any reload), in the same order, with the same values
    model.save(tmp_path / "m.keras")
    reference = keras.saving.load_model(tmp_path / "m.keras")
    assert len(full.optimizer.variables) == len(model.optimizer.variables) == 7
    assert names(full.optimizer.variables) == names(reference.optimizer.variables)
    for v1, v2 in zip(model.optimizer.variables, full.optimizer.variables):
        assert v1.dtype == v2.dtype and v1.shape == v2.shape
        np.testing.assert_array_equal(np.asarray(v1), np.asarray(v2))
    assert full.loss == "binary_crossentropy"
    full.fit(x, rng.integers(0, 2, (64, 1)), epochs=1, verbose=0)  # can go on training
    # include_optimizer stores the optimizer state: a bigger payload
    assert len(sk.dumps(model, include_optimizer=True)) > len(sk.dumps(model))


def test_seed_actor_cnn(rng):
    model = models.actor_cnn()
    round_trip(model, rng.standard_normal((2, 120, 160, 2)).astype("float32"))


@pytest.mark.parametrize("name", ["MobileNetV2", "EfficientNetB0", "DenseNet121"])
def test_keras_applications(name, rng):
    build = getattr(keras.applications, name)
    model = build(weights=None, input_shape=(64, 64, 3), classes=10)
    round_trip(model, rng.uniform(0, 255, (2, 64, 64, 3)).astype("float32"))


def test_bfloat16_and_mixed_precision(rng):
    model = keras.Sequential([
        keras.Input((6,)),
        layers.Dense(8, dtype="bfloat16"),
        layers.Dense(4, dtype="mixed_float16"),
        layers.Dense(1, dtype="float32"),
    ])
    clone = round_trip(model, rng.standard_normal((3, 6)).astype("float32"))
    assert clone.layers[0].kernel.dtype == "bfloat16"
    assert clone.layers[1].dtype_policy.name == "mixed_float16"


def test_adapted_preprocessing_state_matches_keras_saving(tmp_path, rng):
    """Vocabularies (assets) and adapted statistics (finalize_state) survive."""
    words = np.array(["red fox", "blue fox jumps", "red dog", "green", "dog dog fox"])
    vectorizer = layers.TextVectorization(max_tokens=20, output_mode="tf_idf")
    vectorizer.adapt(words)
    lookup = layers.StringLookup(output_mode="one_hot")
    lookup.adapt(np.array(["a", "b", "c", "a"]))
    norm = layers.Normalization()
    norm.adapt(rng.standard_normal((50, 3)) * 4 + 2)
    text, cat, num = keras.Input((), dtype="string"), keras.Input((1,), dtype="string"), keras.Input((3,))
    out = layers.Concatenate()([vectorizer(text), layers.Flatten()(lookup(cat)), norm(num)])
    model = keras.Model([text, cat, num], layers.Dense(2)(out))
    x = [np.array(["red fox jumps", "dog", "purple"]), np.array([["a"], ["c"], ["zzz"]]),
         rng.standard_normal((3, 3)).astype("float32")]
    clone = sk.loads(sk.dumps(model))
    path = tmp_path / "m.keras"
    model.save(path)
    reference = keras.saving.load_model(path)
    assert_same_predictions(reference, clone, x, atol=0)
    assert_same_predictions(model, clone, x, atol=0)
    cloned_vectorizer = [lay for lay in clone.layers if isinstance(lay, layers.TextVectorization)][0]
    assert cloned_vectorizer.get_vocabulary() == vectorizer.get_vocabulary()


def test_seed_generator_layers_round_trip(rng):
    model = keras.Sequential([keras.Input((4,)), layers.Dropout(0.5, seed=3), layers.GaussianNoise(0.1),
                              layers.Dense(2)])
    round_trip(model, rng.standard_normal((3, 4)).astype("float32"))


def test_save_load_file_and_buffer_types(tmp_path, rng):
    model = models.mlp()
    x = rng.standard_normal((4, 8)).astype("float32")
    path = tmp_path / "model.skp"
    sk.save(model, path)
    assert_same_predictions(model, sk.load(path), x)
    data = sk.dumps(model)
    for buf in (bytearray(data), memoryview(data), memoryview(bytearray(data))):
        assert_same_predictions(model, sk.loads(buf), x)


def test_payload_weights_are_aligned_and_raw():
    model = models.mlp(hidden=33)
    data = sk.dumps(model)
    unpacked = fmt.unpack(data)
    tensors = [s for s in unpacked.sections if s.kind == "tensor"]
    assert len(tensors) == len(model.weights)
    body_start = len(data) - unpacked.body.nbytes
    assert body_start % 64 == 0
    for section, weight in zip(tensors, model.weights):
        assert section.offset % 64 == 0
        np.testing.assert_array_equal(unpacked.array(section), np.asarray(weight))
    # everything that is not raw tensor bytes is JSON: no pickle stream anywhere
    import json
    for section in unpacked.sections:
        if section.kind in ("config", "compile_config"):
            json.loads(bytes(unpacked.section_bytes(section)))
    assert unpacked.header["keras"]["flavour"] == "keras3"


def test_lambda_layer_refused_in_safe_mode(rng):
    model = keras.Sequential([keras.Input((3,)), layers.Lambda(lambda t: t * 2.0), layers.Dense(1)])
    data = sk.dumps(model)
    with pytest.raises(sk.PayloadError, match="safe_mode=False"):
        sk.loads(data)
    clone = sk.loads(data, safe_mode=False)
    assert_same_predictions(model, clone, rng.standard_normal((2, 3)).astype("float32"))


def test_initializers_are_skipped_but_uncovered_variables_initialized(monkeypatch, rng):
    """Rebuilding must not run initializers for variables the payload overwrites."""
    calls = []
    original = keras.initializers.GlorotUniform.__call__

    def counting(self, shape, dtype=None):
        calls.append(shape)
        return original(self, shape, dtype=dtype)

    model = models.mlp()
    data = sk.dumps(model)
    monkeypatch.setattr(keras.initializers.GlorotUniform, "__call__", counting)
    clone = sk.loads(data)
    assert calls == []
    # outside a rebuild, initializers run as usual
    models.mlp()
    assert len(calls) == 2
    assert_same_predictions(model, clone, rng.standard_normal((2, 8)).astype("float32"))


@keras.saving.register_keras_serializable(package="sk_tests")
class WithScratch(layers.Layer):
    """Saves its kernel but not its scratch variable (as a layer may for a cache)."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 2), name="kernel")
        self.scratch = self.add_weight(shape=(3,), initializer="ones", trainable=False,
                                       name="scratch")

    def call(self, x):
        return keras.ops.matmul(x, self.kernel) * self.scratch[0]

    def save_own_variables(self, store):
        store["0"] = self.kernel.numpy()

    def load_own_variables(self, store):
        self.kernel.assign(store["0"])


def test_variables_missing_from_the_payload_get_their_initializers(tmp_path, rng):
    """State Keras does not save (SeedGenerator states, a layer's unsaved variable) is
    absent from the payload; the rebuild gives it its real initial value, exactly as
    keras.saving.load_model does, instead of leaving it unmaterialized (zeros)."""
    model = keras.Sequential([keras.Input((4,)), layers.Dropout(0.5, seed=3),
                              layers.GaussianNoise(0.1, seed=5), WithScratch()])
    x = rng.standard_normal((8, 4)).astype("float32")
    model(x, training=True)  # advances the seed states
    model.layers[-1].scratch.assign(np.full(3, 5.0, "float32"))
    data = sk.dumps(model)
    stored = [s.name for s in fmt.unpack(data).sections if s.kind == "tensor"]
    assert stored == ["layers/with_scratch/0"]  # the payload lacks the other three variables

    clone = sk.loads(data)
    model.save(tmp_path / "m.keras")
    reference = keras.saving.load_model(tmp_path / "m.keras")

    def unsaved(m):
        return [keras.ops.convert_to_numpy(v) for v in m.variables
                if v.name in ("seed_generator_state", "scratch")]

    found = unsaved(clone)
    assert len(found) == 3 and all(u.dtype == v.dtype for u, v in zip(found, unsaved(reference)))
    for mine, theirs in zip(found, unsaved(reference)):
        np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(found[0], [3, 0])  # Dropout's seed, not zeros
    np.testing.assert_array_equal(found[2], np.ones(3))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(clone.layers[-1].kernel),
                                  keras.ops.convert_to_numpy(model.layers[-1].kernel))
    assert_same_predictions(reference, clone, x)
    np.testing.assert_array_equal(  # same random streams as Keras's own loader
        keras.ops.convert_to_numpy(clone(x, training=True)),
        keras.ops.convert_to_numpy(reference(x, training=True)))


@keras.saving.register_keras_serializable(package="sk_tests")
class CallCounter(layers.Layer):
    """Counts its calls in a Keras weight it assigns inside ``call`` (as a stateful
    custom layer does): Keras traces ``call`` to infer shapes while the model is rebuilt."""

    def build(self, input_shape):
        self.count = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="count")
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        self.count.assign_add(1.0)
        return x * self.scale


@pytest.mark.parametrize("share_weights", [False, True])
def test_a_layer_assigning_its_state_in_call_round_trips(tmp_path, rng, share_weights):
    """A layer whose ``call`` assigns one of its weights rebuilds (it raised "could not be
    lifted out of a tf.function": the skipped initializer met a symbolic value), with the
    weights and predictions of keras.saving.load_model."""
    model = keras.Sequential([keras.Input((3,)), CallCounter(), layers.Dense(2)])
    x = rng.standard_normal((5, 3)).astype("float32")
    model.layers[0].scale.assign(rng.standard_normal(3).astype("float32"))
    model(x)
    model(x)
    sk.save(model, tmp_path / "m.skm")
    clone, _ = load_mapped(tmp_path / "m.skm", share_weights=share_weights)
    model.save(tmp_path / "m.keras")
    reference = keras.saving.load_model(tmp_path / "m.keras")
    for mine, theirs in zip(clone.variables, reference.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine),
                                      keras.ops.convert_to_numpy(theirs))
    assert float(keras.ops.convert_to_numpy(clone.layers[0].count)) == 2.0
    assert_same_predictions(reference, clone, x)
