"""Model builders shared by tests (importable on workers: tests/ is on sys.path there too)."""

from __future__ import annotations

import keras
import numpy as np
from keras import layers


def seed_001_model() -> keras.Model:
    """The Spark broadcast story: 42 inputs, one sigmoid unit, compiled with Nadam."""
    model = keras.Sequential([keras.Input((42,)), layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="Nadam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def actor_cnn() -> keras.Model:
    """The multiprocessing story's 120x160x2 "actor" CNN."""
    inp = layers.Input(shape=(120, 160, 2))
    x = layers.Conv2D(32, (3, 3), activation="relu")(inp)
    x = layers.MaxPool2D((2, 2))(x)
    x = layers.Conv2D(64, (3, 3), activation="relu")(x)
    x = layers.MaxPool2D((2, 2))(x)
    x = layers.Conv2D(128, (3, 3), activation="relu")(x)
    x = layers.MaxPool2D((2, 2))(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.Dense(32, activation="relu")(x)
    actions = layers.Dense(5, activation="softmax")(x)
    return keras.Model(inp, actions, name="actor")


def mlp(n_features: int = 8, hidden: int = 16, outputs: int = 1, name: str = "mlp") -> keras.Model:
    return keras.Sequential([
        keras.Input((n_features,)),
        layers.Dense(hidden, activation="relu"),
        layers.Dense(outputs),
    ], name=name)


def multi_io() -> keras.Model:
    """Two inputs (a vector and an image-like tensor), two outputs (scalar, vector)."""
    a = keras.Input((4,), name="a")
    b = keras.Input((3, 2), name="b")
    h = layers.Concatenate()([layers.Dense(5, activation="relu")(a), layers.Flatten()(b)])
    score = layers.Dense(1, name="score")(h)
    probs = layers.Dense(3, activation="softmax", name="probs")(h)
    return keras.Model({"a": a, "b": b}, {"score": score, "probs": probs}, name="multi_io")


def random_like_inputs(model: keras.Model, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    def make(t):
        return rng.standard_normal((n, *t.shape[1:])).astype("float32")
    return keras.tree.map_structure(make, model.input)


SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "birds sing at dawn",
             "the quick brown fox", "rain falls on the roof", "stars shine at night"]


def text_classifier(shape: tuple = (1,), seed: int = 0) -> keras.Model:
    """A string input -> TextVectorization (adapted vocabulary) -> Embedding -> Dense."""
    keras.utils.set_random_seed(seed)
    vectorize = layers.TextVectorization(max_tokens=40, output_sequence_length=6)
    vectorize.adapt(SENTENCES)
    inp = keras.Input(shape, dtype="string", name="text")
    x = vectorize(inp if shape == () else keras.ops.reshape(inp, (-1,)))
    x = layers.Embedding(40, 8)(x)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inp, layers.Dense(3, activation="softmax")(x), name="text_classifier")


def text_labeller() -> keras.Model:
    """Strings in (StringLookup), a string label out (StringLookup(invert=True) on argmax)."""
    keras.utils.set_random_seed(1)
    words = ["cat", "dog", "bird", "fox"]
    inp = keras.Input((1,), dtype="string", name="word")
    ids = layers.StringLookup(vocabulary=words)(inp)
    x = layers.Flatten()(layers.Embedding(len(words) + 1, 4)(ids))
    logits = layers.Dense(len(words) + 1)(x)
    label = layers.StringLookup(vocabulary=words, invert=True)(keras.ops.argmax(logits, axis=-1))
    return keras.Model(inp, {"label": label, "logits": logits}, name="text_labeller")


@keras.saving.register_keras_serializable(package="spark_keras_tests")
class DecodeImage(layers.Layer):
    """Encoded image bytes (PNG or JPEG) -> (size, size, 3) floats in [0, 1], in the graph."""

    def __init__(self, size: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.size = size

    def call(self, data):
        import tensorflow as tf

        def one(b):
            image = tf.io.decode_image(b, channels=3, expand_animations=False)
            image = tf.image.resize(tf.cast(image, "float32") / 255.0, (self.size, self.size))
            return tf.ensure_shape(image, (self.size, self.size, 3))

        return tf.map_fn(one, tf.reshape(data, (-1,)), fn_output_signature=tf.float32)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.size, self.size, 3)

    def get_config(self):
        return {**super().get_config(), "size": self.size}


def image_bytes_model(size: int = 16) -> keras.Model:
    """PNG/JPEG bytes in, decoded in the graph, a small CNN, 4 class probabilities out."""
    keras.utils.set_random_seed(2)
    inp = keras.Input((), dtype="string", name="image")
    x = DecodeImage(size)(inp)
    x = layers.Conv2D(4, 3, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(4, activation="softmax")(x), name="image_bytes")


def png_bytes(n: int, size: int = 16, seed: int = 0) -> list[bytes]:
    """``n`` random RGB PNG images of ``size`` x ``size``, encoded."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    return [tf.io.encode_png(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).numpy()
            for _ in range(n)]


def sequence_model(masking: bool = False) -> keras.Model:
    """A GRU over sequences of any length (``Input((None, 3))``), zeros masked or not."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((None, 3), name="sequence")
    x = layers.Masking(0.0)(inp) if masking else inp
    return keras.Model(inp, layers.Dense(2)(layers.GRU(4)(x)), name=f"gru_{int(masking)}")


def attention_model(vocabulary: int = 30) -> keras.Model:
    """A Transformer-style model over token ids of any length, 0 the padding
    (``Embedding(mask_zero=True)``): self-attention (``MultiHeadAttention`` takes the mask
    Keras 3 passes on), a residual and a norm, averaged over the real steps -> 2 scores."""
    keras.utils.set_random_seed(7)
    inp = keras.Input((None,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary, 8, mask_zero=True)(inp)
    x = layers.LayerNormalization()(layers.Add()([x, layers.MultiHeadAttention(2, 4)(x, x)]))
    return keras.Model(inp, layers.Dense(2)(layers.GlobalAveragePooling1D()(x)), name="attention")


def tagger_model() -> keras.Model:
    """A masked GRU scoring every step of a sequence of any length (``(None, 2)`` per row)
    and the whole sequence, beside a vector of 2 features."""
    keras.utils.set_random_seed(8)
    seq, features = keras.Input((None, 3), name="sequence"), keras.Input((2,), name="features")
    steps = layers.GRU(4, return_sequences=True)(layers.Masking(0.0)(seq))
    whole = layers.Concatenate()([layers.GlobalAveragePooling1D()(steps), features])
    return keras.Model([seq, features], {"steps": layers.Dense(2)(steps), "whole": layers.Dense(1)(whole)},
                       name="tagger")


def fully_convolutional() -> keras.Model:
    """Images of any size (``Input((None, None, 3))``) to per-pixel scores and a pooled one."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((None, None, 3), name="image")
    pixels = layers.Conv2D(2, 3, padding="same", name="pixels")(inp)
    pooled = layers.Dense(1, name="pooled")(layers.GlobalAveragePooling2D()(pixels))
    return keras.Model(inp, {"pixels": pixels, "pooled": pooled}, name="fcn")


HUB_VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "a", "cat", "dog", "sat",
                  "on", "mat", "ran", "fast", "big", "small", "red", "blue", "and", "is"]


def _spread_weights(model: keras.Model, seed: int) -> None:
    """Random weights of unit scale, so that predictions depend visibly on the input (a
    fresh keras-hub task head gives nearly the same logits for any input)."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0.0, 0.5, w.shape).astype(w.dtype) for w in model.get_weights()])


def hub_text_classifier(num_classes: int = 3):
    """A tiny keras-hub ``BertTextClassifier`` with its preprocessor (a 20-word vocabulary,
    sequences of 8 tokens, 2 layers, hidden 16), built offline."""
    import keras_hub

    keras.utils.set_random_seed(5)
    tokenizer = keras_hub.tokenizers.BertTokenizer(vocabulary=HUB_VOCABULARY, lowercase=True)
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(HUB_VOCABULARY), num_layers=2, num_heads=2, hidden_dim=16,
        intermediate_dim=32, max_sequence_length=16)
    classifier = keras_hub.models.BertTextClassifier(backbone, num_classes, preprocessor=preprocessor)
    _spread_weights(classifier, 5)
    return classifier


def hub_image_classifier(num_classes: int = 3, size: int = 16):
    """A tiny keras-hub ``ResNetImageClassifier`` whose preprocessor resizes images of any
    size to ``size`` x ``size`` and scales them to [0, 1], built offline."""
    import keras_hub

    keras.utils.set_random_seed(6)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64],
        stackwise_num_blocks=[1], stackwise_num_strides=[1], block_type="basic_block",
        image_shape=(None, None, 3))
    converter = keras_hub.layers.ResNetImageConverter(image_size=(size, size), scale=1 / 255)
    preprocessor = keras_hub.models.ResNetImageClassifierPreprocessor(converter)
    classifier = keras_hub.models.ResNetImageClassifier(backbone, num_classes,
                                                        preprocessor=preprocessor)
    return classifier


# --- models that raise on some rows (row isolation) -----------------------------------

@keras.saving.register_keras_serializable(package="spark_keras_tests")
class AssertBelow(layers.Layer):
    """Its input unchanged, after a ``tf.debugging.assert_less`` of every value against
    ``limit`` (a model that refuses some rows in its graph)."""

    def __init__(self, limit: float = 10.0, **kwargs):
        super().__init__(**kwargs)
        self.limit = limit

    def call(self, x):
        import tensorflow as tf

        tf.debugging.assert_less(x, tf.cast(self.limit, x.dtype), message="value over the limit")
        return x

    def get_config(self):
        return {**super().get_config(), "limit": self.limit}


@keras.saving.register_keras_serializable(package="spark_keras_tests")
class PositionalEmbedding(layers.Layer):
    """Token ids of any length plus a learned embedding of each position, up to
    ``max_length`` positions: a longer row gathers past the table (the error a
    Transformer-style model gives on a too-long sequence)."""

    def __init__(self, max_length: int = 16, width: int = 4, **kwargs):
        super().__init__(**kwargs)
        self.max_length, self.width = max_length, width

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.max_length, self.width), name="positions")

    def call(self, ids):
        import tensorflow as tf

        positions = tf.gather(self.table, tf.range(tf.shape(ids)[1]))
        return tf.cast(ids, "float32")[..., None] + positions[None]

    def compute_output_shape(self, input_shape):
        return (*input_shape, self.width)

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length, "width": self.width}


def asserting_mlp(limit: float = 10.0) -> keras.Model:
    """An MLP over 4 features that raises (in its graph) on a row holding a value >= limit."""
    keras.utils.set_random_seed(5)
    inp = keras.Input((4,), name="features")
    x = layers.Dense(8, activation="relu")(AssertBelow(limit)(inp))
    return keras.Model(inp, layers.Dense(1)(x), name="asserting_mlp")


def asserting_sequence_model(limit: float = 10.0) -> keras.Model:
    """The masked GRU of :func:`sequence_model`, raising (in its graph) on a row holding a
    value of ``limit`` or more."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((None, 3), name="sequence")
    x = layers.GRU(4)(layers.Masking(0.0)(AssertBelow(limit)(inp)))
    return keras.Model(inp, layers.Dense(2)(x), name="asserting_gru")


def positional_model(max_length: int = 16) -> keras.Model:
    """Sequences of token ids of any length up to ``max_length`` (longer: a gather out of
    range) -> 2 scores."""
    keras.utils.set_random_seed(6)
    inp = keras.Input((None,), dtype="int32", name="tokens")
    x = layers.GlobalAveragePooling1D()(PositionalEmbedding(max_length)(inp))
    return keras.Model(inp, layers.Dense(2)(x), name="positional")


# --- a model that tells how it was called ---------------------------------------------

@keras.saving.register_keras_serializable(package="spark_keras_tests")
class CallRows(layers.Layer):
    """For each row, the number of rows of the model call it came in (the call's batch
    dimension): a real model that shows how a scorer cut its rows into calls."""

    def call(self, x):
        from keras import ops

        return ops.ones_like(x[:, :1]) * ops.cast(ops.shape(x)[0], x.dtype)


def call_rows_mlp(n_features: int = 4, seed: int = 0, name: str = "call_rows_mlp") -> keras.Model:
    """An MLP's prediction, then the rows of the call that made it: outputs ``[y, m]``."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((n_features,))
    y = layers.Dense(1)(layers.Dense(8, activation="relu")(inp))
    return keras.Model(inp, layers.Concatenate()([y, CallRows()(inp)]), name=name)
