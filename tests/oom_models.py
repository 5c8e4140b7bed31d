"""Models for the size of model calls (importable on workers: tests/ is on sys.path there
too): one that runs out of memory for real (TensorFlow's CPU allocator refuses a tensor
of 2**60 bytes, more than any address space, with ``tf.errors.ResourceExhaustedError``:
nothing is allocated), and one that says how many rows each call held."""

from __future__ import annotations

import keras
from keras import layers

HUGE = 2**58  # float32 values: 2**60 bytes


@keras.saving.register_keras_serializable(package="spark_keras_tests")
class OutOfMemoryAbove(layers.Layer):
    """Its input unchanged, but a call of more than ``limit`` rows, or holding a row whose
    first value is ``hungry`` or more, allocates :data:`HUGE` values in the graph: the
    call raises TensorFlow's own ``ResourceExhaustedError``. ``counted`` holds the calls
    made and those that ran out of memory (updated before the allocation)."""

    def __init__(self, limit: int = 8, hungry: float = 1e6, **kwargs):
        super().__init__(**kwargs)
        self.limit, self.hungry = limit, hungry

    def build(self, input_shape):
        import tensorflow as tf

        # a plain TensorFlow variable, not a Keras weight: not in the payload, and made
        # eagerly (assigning to a Keras weight in ``call`` breaks spark_keras's rebuild)
        with tf.init_scope():
            self.counted = tf.Variable([0, 0], dtype=tf.int64, trainable=False)

    def call(self, x):
        import tensorflow as tf

        over = tf.logical_or(tf.shape(x, out_type=tf.int64)[0] > self.limit,
                             tf.reduce_any(x[:, 0] >= self.hungry))
        counted = self.counted.assign_add(tf.stack([tf.constant(1, tf.int64),
                                                    tf.cast(over, tf.int64)]))
        with tf.control_dependencies([counted]):
            size = tf.where(over, tf.constant(HUGE, tf.int64), tf.constant(1, tf.int64))
            scratch = tf.zeros(tf.reshape(size, [1]), x.dtype)
        return x + scratch[:1] * 0

    def get_config(self):
        return {**super().get_config(), "limit": self.limit, "hungry": self.hungry}


def hungry_mlp(limit: int = 8, hungry: float = 1e6, features: int = 4) -> keras.Model:
    """An MLP over ``features`` values whose calls of more than ``limit`` rows (or with a
    row whose first value is ``hungry`` or more) run out of memory."""
    keras.utils.set_random_seed(11)
    inp = keras.Input((features,), name="features")
    x = layers.Dense(8, activation="relu")(OutOfMemoryAbove(limit, hungry, name="oom")(inp))
    return keras.Model(inp, layers.Dense(2)(x), name="hungry_mlp")


def counts(model: keras.Model) -> tuple[int, int]:
    """(calls made, calls that ran out of memory) of ``model``'s layer."""
    calls, failed = model.get_layer("oom").counted.numpy().tolist()
    return calls, failed


@keras.saving.register_keras_serializable(package="spark_keras_tests")
class CallRows(layers.Layer):
    """For each row, how many rows the call it came in held (as a float)."""

    def call(self, x):
        import tensorflow as tf

        return tf.fill(tf.stack([tf.shape(x)[0], 1]), tf.cast(tf.shape(x)[0], "float32"))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)


def call_rows_model(features: int) -> keras.Model:
    """Rows of ``features`` values -> the number of rows of the call each came in."""
    inp = keras.Input((features,), name="features")
    return keras.Model(inp, CallRows(name="rows")(inp), name="call_rows")
