"""The scoring engine, the engine review's cases (real Keras models, no Spark): a
TimeDistributed model's compiled call (D5), rows padded past a positional table tried at
their own length (D1), the first failing row named under "error" (D6), the probe of
``buckets`` comparing each value on its own scale (D2) and probing integer inputs with
values other than the pad (D3), and a layer with a compute_mask of its own making the
mask (D4). Each test fails with its fix reverted."""

from __future__ import annotations

import types

import keras
import numpy as np
import pyarrow as pa
import pytest
from keras import layers

from spark_keras.errors import ArgumentError, ModelCallError
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.predictor import Predictor
from spark_keras.inference.preprocess import Preprocess
from tests import models


def handle(model):
    """What the engine needs of a handle: a predictor (no preprocess function)."""
    return types.SimpleNamespace(predictor=Predictor(model), preprocess=Preprocess.of(None))


def sequences(rows):
    """An Arrow column of one list (of lists) of numbers per row."""
    leaf = pa.from_numpy_dtype(rows[0].dtype)
    return pa.array([r.tolist() for r in rows],
                    pa.list_(leaf) if rows[0].ndim == 1 else pa.list_(pa.list_(leaf)))


def alone(model, row):
    """The model's own output on one row, called eagerly (its shape known)."""
    return np.asarray(model(row[None], training=False))[0]


# --- D5: TimeDistributed traced with its steps unknown ------------------------------------------

def time_distributed(masking: bool) -> keras.Model:
    keras.utils.set_random_seed(6)
    i = keras.Input((None, 3), name="seq")
    x = layers.Masking(0.0)(i) if masking else i
    x = layers.TimeDistributed(layers.Dense(3, bias_initializer="ones"))(x)
    return keras.Model(i, layers.Dense(2, name="cls")(layers.GlobalAveragePooling1D()(x)))


@pytest.mark.parametrize("masking", [False, True], ids=["bare", "masked"])
def test_a_time_distributed_model_is_scored_as_keras_calls_it(masking):
    """Traced with the steps unknown, Keras 3's TimeDistributed looped over the batch's
    rows in place of the steps: wrong by up to 1.2 (or raising) unless batch == steps."""
    model = time_distributed(masking)
    predictor = Predictor(model)
    rng = np.random.default_rng(1)
    for shape in [(1, 5, 3), (4, 5, 3), (3, 3, 3), (2, 7, 3)]:
        x = rng.standard_normal(shape).astype("float32")
        np.testing.assert_allclose(predictor._call([x])[0], model(x, training=False),
                                   rtol=0, atol=1e-6)
    rows = [rng.standard_normal((k, 3)).astype("float32") for k in (5, 5, 5, 2, 7)]
    out = score(handle(model), from_arrow(["seq"], [sequences(rows)]), batch_size=8,
                on_invalid="null")
    assert out.invalid is None or not out.invalid.any()
    for k, row in enumerate(rows):
        np.testing.assert_allclose(out.outputs[0][k], alone(model, row), rtol=0, atol=1e-6)
    assert predictor.traces == 3  # one per shape of the rows (5, 2, 7 steps), no more


def test_bidirectional_then_time_distributed_takes_buckets():
    """The probe of ``buckets`` called the model and met the same error: refused."""
    keras.utils.set_random_seed(6)
    i = keras.Input((None, 3), name="seq")
    x = layers.Bidirectional(layers.GRU(4, return_sequences=True))(layers.Masking(0.0)(i))
    x = layers.TimeDistributed(layers.Dense(3))(x)
    model = keras.Model(i, layers.Dense(2, name="cls")(layers.GlobalAveragePooling1D()(x)))
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal((k, 3)).astype("float32") for k in (2, 5, 3, 9, 4, 6)]
    out = score(handle(model), from_arrow(["seq"], [sequences(rows)]), batch_size=8,
                on_invalid="error", buckets=2)
    for k, row in enumerate(rows):
        np.testing.assert_allclose(out.outputs[0][k], alone(model, row), rtol=0, atol=1e-5)


# --- D1: a row fine alone, bucketed with a longer one past a positional table ------------------

class Positions(layers.Layer):
    """A learned table of ``max_length`` positions added to each step (masks pass through):
    a longer row gathers past the table and raises."""

    def __init__(self, max_length: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.max_length, self.supports_masking = max_length, True

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.max_length, input_shape[-1]), name="table")

    def call(self, x):
        import tensorflow as tf

        return x + tf.gather(self.table, tf.range(tf.shape(x)[1]))[None]


def positional_tokens() -> keras.Model:
    keras.utils.set_random_seed(3)
    i = keras.Input((None,), dtype="int32", name="tokens")
    x = Positions(16)(layers.Embedding(50, 8, mask_zero=True)(i))
    return keras.Model(i, layers.Dense(2)(layers.GlobalAveragePooling1D()(x)))


LENGTHS = [3, 4, 12, 5, 14, 20, 11, 3, 13, 4]  # row 5 only is past the table of 16


@pytest.mark.parametrize("buckets", [2, (8, 12)], ids=["2", "(8, 12)"])
def test_rows_padded_past_a_positional_table_are_tried_at_their_own_length(buckets):
    """Rows of 11-14 tokens shared row 5's bucket of 20 and were null with it (or blamed:
    "error" named row 2), though each scores alone: only row 5 fails, named."""
    model = positional_tokens()
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 50, k).astype("int32") for k in LENGTHS]
    columns = from_arrow(["tokens"], [sequences(rows)])
    out = score(handle(model), columns, batch_size=64, buckets=buckets, on_invalid="null",
                reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [5]
    assert "indices[16] = 16 is not in [0, 16)" in out.reasons[5]
    for k, row in zip([r for r in range(len(rows)) if r != 5], out.outputs[0]):
        np.testing.assert_allclose(row, alone(model, rows[k]), rtol=0, atol=1e-5)
    with pytest.raises(ModelCallError, match="row 5 of this batch"):
        score(handle(model), columns, batch_size=64, buckets=buckets, on_invalid="error")


# --- D6: under "error", the first failing row is named -------------------------------------------

@pytest.mark.parametrize("buckets", [None, 2], ids=["exact", "buckets=2"])
def test_the_first_failing_row_is_named_whatever_its_group(buckets):
    """Rows 3 (9 steps) and 8 (3 steps) raise: row 8's group (of 3 steps, first seen, or
    the shortest bucket) was scored first and named."""
    model = models.asserting_sequence_model()
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((k, 3)).astype("float32") for k in [3, 9, 3, 9, 3, 3, 3, 3, 3, 2]]
    rows[3][0, 0] = rows[8][0, 0] = 50.0
    columns = from_arrow(["sequence"], [sequences(rows)])
    with pytest.raises(ModelCallError, match="row 3 of this batch"):
        score(handle(model), columns, batch_size=64, buckets=buckets)
    out = score(handle(model), columns, batch_size=64, buckets=buckets, on_invalid="null")
    assert np.flatnonzero(out.invalid).tolist() == [3, 8]


# --- D2, D3: the probe of buckets ------------------------------------------------------------------

class MaxOverTime(layers.Layer):
    """The maximum over the steps; says it supports masking, and ignores the mask."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x):
        return keras.ops.max(x, axis=1)

    def compute_mask(self, x, mask=None):
        return None


class MeanOverTime(MaxOverTime):
    """The mean over the steps, ignoring the mask."""

    def call(self, x):
        return keras.ops.mean(keras.ops.cast(x, "float32"), axis=1)


class Centered(layers.Layer):
    """Each step minus the row's mean over its steps (before the mask: padding moves it)."""

    def call(self, x):
        x = keras.ops.cast(x, "float32")
        return x - keras.ops.mean(x, axis=1, keepdims=True) + 100.0 * keras.ops.cast(
            keras.ops.not_equal(x, 0), "float32")


def two_scales(pool) -> keras.Model:
    """Masking -> Dense(relu) -> ``pool`` -> Dense(2), its first output ~1e4, its second ~0.1."""
    keras.utils.set_random_seed(0)
    i = keras.Input((None, 3), name="seq")
    x = layers.Dense(4, activation="relu", bias_initializer=keras.initializers.Constant(0.5))(
        layers.Masking(0.0)(i))
    return keras.Model(i, layers.Dense(2, kernel_initializer=keras.initializers.Constant(0.05),
                                       bias_initializer=keras.initializers.Constant([1e4, 0.0]))(
        pool(x)))


def test_the_probe_compares_each_value_on_its_own_scale():
    """Beside a value of 1e4, the second output's error (0.10 for 0.12) was within 1e-5 of
    the largest value of the whole output: buckets were taken, and rows scored wrong."""
    with pytest.raises(ArgumentError, match="changes output"):
        Predictor(two_scales(MaxOverTime())).padding  # noqa: B018
    model = two_scales(layers.GRU(3))  # masked: the padding changes nothing
    assert Predictor(model).padding == (0.0,)
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((k, 3)).astype("float32") for k in (2, 9, 3, 9, 2, 4)]
    out = score(handle(model), from_arrow(["seq"], [sequences(rows)]), batch_size=8, buckets=1)
    for k, row in enumerate(rows):
        np.testing.assert_allclose(out.outputs[0][k], alone(model, row), rtol=1e-6)


def int_counts(body) -> keras.Model:
    """Counts per step (int32, 2 a step) masked by Masking(0), then ``body``, then Dense(2)."""
    keras.utils.set_random_seed(1)
    i = keras.Input((None, 2), dtype="int32", name="counts")
    return keras.Model(i, layers.Dense(2)(body(i)))


@pytest.mark.parametrize("body", [
    lambda i: layers.GRU(4)(layers.Masking(0.0)(Centered()(i))),
    lambda i: MeanOverTime()(layers.Dense(4, bias_initializer="ones")(layers.Masking(0)(i))),
], ids=["mixing steps before the mask", "ignoring the mask"])
def test_the_probe_of_an_integer_input_is_not_all_padding(body):
    """Probe rows of zeros, the pad value, were all masked: the probe saw nothing, and
    took models whose predictions the padding changes (with float32 inputs, refused)."""
    with pytest.raises(ArgumentError, match="changes output"):
        Predictor(int_counts(body)).padding  # noqa: B018


def test_an_integer_input_masked_by_value_takes_buckets():
    model = int_counts(lambda i: layers.GRU(4)(layers.Masking(0)(i)))
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 9, (k, 2)).astype("int32") for k in (2, 7, 3, 7, 5)]
    out = score(handle(model), from_arrow(["counts"], [sequences(rows)]), batch_size=8, buckets=1)
    for k, row in enumerate(rows):
        np.testing.assert_allclose(out.outputs[0][k], alone(model, row), rtol=0, atol=1e-6)


# --- D4: a layer with a compute_mask of its own makes the mask -------------------------------------

class TokenAndPosition(layers.Layer):
    """keras.io's seq2seq Transformer PositionalEmbedding: token plus position embeddings,
    its mask ``inputs != masked`` (0 there)."""

    def __init__(self, masked: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.masked = masked
        self.tokens, self.positions = layers.Embedding(40, 8), layers.Embedding(32, 8)

    def call(self, inputs):
        return self.tokens(inputs) + self.positions(keras.ops.arange(keras.ops.shape(inputs)[-1]))

    def compute_mask(self, inputs, mask=None):
        return keras.ops.not_equal(inputs, self.masked)


def attention_over(embedding) -> keras.Model:
    keras.utils.set_random_seed(4)
    i = keras.Input((None,), dtype="int32", name="tokens")
    x = embedding(i)
    x = layers.LayerNormalization()(layers.Add()([x, layers.MultiHeadAttention(2, 4)(x, x)]))
    return keras.Model(i, layers.Dense(2)(layers.GRU(6)(x)))


def test_a_layer_masking_with_its_own_compute_mask_takes_buckets():
    """Refused: "no Masking layer or Embedding(mask_zero=True) after it marks padded steps",
    though padding with 0 changes nothing (8.9e-08)."""
    model = attention_over(TokenAndPosition())
    assert Predictor(model).padding == (0,)
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 40, k).astype("int32") for k in (2, 9, 5, 3, 12, 7)]
    out = score(handle(model), from_arrow(["tokens"], [sequences(rows)]), batch_size=8, buckets=2)
    for k, row in enumerate(rows):
        np.testing.assert_allclose(out.outputs[0][k], alone(model, row), rtol=0, atol=1e-5)


def test_a_mask_of_another_pad_value_than_zero_is_refused_by_the_probe():
    """Padded with 0, a mask of ``inputs != 39`` leaves the padded steps in: refused."""
    with pytest.raises(ArgumentError, match="changes output"):
        Predictor(attention_over(TokenAndPosition(masked=39))).padding  # noqa: B018
