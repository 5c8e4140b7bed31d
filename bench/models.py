"""The benchmarks' models, built here so the benchmarks need nothing from tests/."""

from __future__ import annotations

from typing import Any


def mlp_model() -> Any:
    """The scoring section's MLP: 64 features, two 256-unit layers, one output."""
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(1)],
                            name="mlp_64_256_256_1")


def big_mlp_model() -> Any:
    """A 100 MB MLP: the map does not grow with the weights, the copy and the write do."""
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(4096, activation="relu"),
                             keras.layers.Dense(4096, activation="relu"),
                             keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(1)],
                            name="mlp_100mb")


def actor_model() -> Any:
    """The multiprocessing story's 120x160x2 "actor" CNN (5 softmax actions)."""
    import keras
    from keras import layers

    inp = layers.Input(shape=(120, 160, 2))
    x = inp
    for filters in (32, 64, 128):
        x = layers.Conv2D(filters, (3, 3), activation="relu")(x)
        x = layers.MaxPool2D((2, 2))(x)
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    x = layers.Dense(32, activation="relu")(x)
    actions = layers.Dense(5, activation="softmax")(x)
    return keras.Model(inp, actions, name="actor")


# --- the inputs section's models: text, PNG bytes, variable-length sequences ----------------

WORDS = [a + b for a in ("ka", "lo", "mi", "nu", "pe", "ri", "so", "ta", "ve", "zu")
         for b in ("n", "r", "s", "t", "l", "m", "d", "k", "p", "x")]  # 100 short words


def text_model(sequence_length: int = 16) -> Any:
    """Strings in (one sentence per row, ``Input(())``), TextVectorization over
    :data:`WORDS` (given, not adapted, so the vocabulary is in the config) -> Embedding ->
    Dense, 4 class probabilities out."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(7)
    inp = keras.Input((), dtype="string", name="text")
    ids = layers.TextVectorization(vocabulary=WORDS, output_sequence_length=sequence_length)(inp)
    spread = keras.initializers.RandomNormal(stddev=1.0)  # predictions visibly differ by input
    x = layers.Embedding(len(WORDS) + 2, 32, embeddings_initializer=spread)(ids)
    x = layers.Dense(32, activation="relu")(layers.GlobalAveragePooling1D()(x))
    out = layers.Dense(4, activation="softmax", kernel_initializer=spread)(x)
    return keras.Model(inp, out, name="text_vectorize_embed_dense")


def _decode_png_class() -> type:
    """The layer decoding PNG bytes in the graph, built (and registered with Keras) on
    first use: importing this module must not import Keras, since the cold-start section
    times that import in workers that unpickle bench functions."""
    import keras

    @keras.saving.register_keras_serializable(package="spark_keras_bench")
    class DecodePng(keras.layers.Layer):
        """PNG bytes (one string per row) -> (size, size, 3) float32 in [0, 1]."""

        def __init__(self, size: int = 64, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.size = size

        def call(self, data: Any) -> Any:
            import tensorflow as tf

            def one(png: Any) -> Any:
                return tf.ensure_shape(tf.io.decode_png(png, channels=3), (self.size, self.size, 3))

            images = tf.map_fn(one, tf.reshape(data, (-1,)), fn_output_signature=tf.uint8)
            return tf.cast(images, "float32") / 255.0

        def compute_output_shape(self, input_shape: Any) -> tuple:
            return (input_shape[0], self.size, self.size, 3)

        def get_config(self) -> dict:
            return {**super().get_config(), "size": self.size}

    DecodePng.__module__, DecodePng.__qualname__ = __name__, "DecodePng"  # importable by name
    return DecodePng


def _assert_below_class() -> type:
    """A layer passing its input through after ``tf.debugging.assert_less(x, limit)``: a
    model that raises in its graph on a row holding a value over the limit (the row
    isolation section's failing rows). Made on first use, as DecodePng."""
    import keras

    @keras.saving.register_keras_serializable(package="spark_keras_bench")
    class AssertBelow(keras.layers.Layer):
        """Its input, after checking every value is below ``limit``."""

        def __init__(self, limit: float = 10.0, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.limit = limit

        def call(self, x: Any) -> Any:
            import tensorflow as tf

            tf.debugging.assert_less(x, tf.cast(self.limit, x.dtype), message="over the limit")
            return x

        def get_config(self) -> dict:
            return {**super().get_config(), "limit": self.limit}

    AssertBelow.__module__, AssertBelow.__qualname__ = __name__, "AssertBelow"
    return AssertBelow


# the layers made (and registered with Keras) on first use, by name
_LAYERS = {"DecodePng": _decode_png_class, "AssertBelow": _assert_below_class}


def layer_class(name: str) -> type:
    """The layer ``name`` of :data:`_LAYERS`, made and registered on the first call in
    this process."""
    cls = globals().get(name)
    if cls is None:
        cls = globals()[name] = _LAYERS[name]()
    return cls


def decode_png_class() -> type:
    """``DecodePng``, made and registered with Keras on the first call in this process."""
    return layer_class("DecodePng")


def __getattr__(name: str) -> Any:
    """``bench.models.DecodePng`` / ``AssertBelow`` (made on first access): how a worker
    unpickling a model that uses the layer finds it, by reference."""
    if name in _LAYERS:
        return layer_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def png_model(size: int = 64) -> Any:
    """PNG bytes in (``Input(())``, ``tf.string``), decoded in the graph (DecodePng), a
    small CNN, 10 class probabilities out."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(8)
    inp = keras.Input((), dtype="string", name="png")
    x = decode_png_class()(size)(inp)
    x = layers.Conv2D(16, 3, strides=2, activation="relu")(x)
    x = layers.Conv2D(32, 3, strides=2, activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    spread = keras.initializers.RandomNormal(stddev=4.0)  # predictions visibly differ by input
    out = layers.Dense(10, activation="softmax", kernel_initializer=spread)(x)
    return keras.Model(inp, out, name="png_decode_cnn")


def gru_model() -> Any:
    """A GRU over sequences of any length (``Input((None, 3))``), 2 outputs, its all-zero
    steps masked (``Masking(0.0)``), so that rows padded with zeros (``buckets``) score as
    they do alone."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(9)
    inp = keras.Input((None, 3), name="sequence")
    x = layers.GRU(16)(layers.Masking(0.0)(inp))
    return keras.Model(inp, layers.Dense(2)(x), name="gru_any_length")


def asserting_mlp_model(features: int = 64, width: int = 256, limit: float = 10.0) -> Any:
    """The scoring MLP's shape behind an AssertBelow(limit): raises on a row holding a
    value of ``limit`` or more."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(10)
    inp = keras.Input((features,), name="features")
    x = layers.Dense(width, activation="relu")(layer_class("AssertBelow")(limit)(inp))
    x = layers.Dense(width, activation="relu")(x)
    return keras.Model(inp, layers.Dense(8)(x), name="asserting_mlp")


def small_mlp_model(features: int = 16) -> Any:
    """A small MLP (``features``-64-64-4): the commits section's, where a job's fixed costs
    (commits, progress) weigh most against its scoring."""
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)],
                            name=f"mlp_{features}_64_64_4")


def mobilenet_model(size: int = 224) -> Any:
    """MobileNetV2 (random weights, seeded: no download), its own preprocessing in front
    (``Rescaling(1/127.5, offset=-1)``, ``preprocess_input``'s): ``(size, size, 3)``
    floats in 0-255 (an image's RGB levels) in, 1,000 logits out (no softmax: random
    weights give a flat one, and the predictions check needs them to differ)."""
    import keras
    from keras import layers

    keras.utils.set_random_seed(5)
    inp = keras.Input((size, size, 3), name="image")
    core = keras.applications.MobileNetV2(weights=None, input_shape=(size, size, 3),
                                          classifier_activation=None)
    return keras.Model(inp, core(layers.Rescaling(1 / 127.5, offset=-1)(inp)), name="mobilenet_v2")


def png_mobilenet_model(image_model: Any) -> Any:
    """``image_model`` (:func:`mobilenet_model`, its weights) behind PNG bytes decoded in
    the graph (``Input(())``, ``tf.string``; DecodePng gives levels / 255: scaled back)."""
    import keras
    from keras import layers

    size = image_model.inputs[0].shape[1]
    inp = keras.Input((), dtype="string", name="png")
    levels = layers.Rescaling(255.0)(decode_png_class()(size)(inp))
    return keras.Model(inp, image_model(levels), name="png_mobilenet_v2")
