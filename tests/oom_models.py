"""Models for the size of model calls (importable on workers: tests/ is on sys.path there
too): one that runs out of memory for real (numpy refuses an array of 2**60 bytes, more
than any address space, with its ``MemoryError``: nothing is allocated; asked for in the
model's graph, a ``tf.numpy_function``, it is TensorFlow's own
``tf.errors.ResourceExhaustedError``), image rows whose conversion does, and one that says
how many rows each call held.

(Not TensorFlow's allocator: with oneDNN on, its CPU allocator waits 10 s for memory to be
freed before it refuses, each time: a test of a few calls that run out took minutes.)"""

from __future__ import annotations

import keras
import numpy as np
from keras import layers

from spark_keras.inference.images import ImageRows

HUGE = 2**60  # bytes


def allocated(over: np.ndarray) -> np.float32:
    """0, after allocating :data:`HUGE` bytes if ``over`` (numpy's ``MemoryError``)."""
    np.empty(HUGE if over else 1, np.uint8)
    return np.float32(0)


@keras.saving.register_keras_serializable(package="spark_keras_tests")
class OutOfMemoryAbove(layers.Layer):
    """Its input unchanged, but a call of more than ``limit`` rows, or holding a row whose
    first value is ``hungry`` or more, allocates :data:`HUGE` bytes in the graph: the
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
            zero = tf.numpy_function(allocated, [over], tf.float32, stateful=True)
        return x + tf.cast(tf.reshape(zero, []), x.dtype)

    def get_config(self):
        return {**super().get_config(), "limit": self.limit, "hungry": self.hungry}


@keras.saving.register_keras_serializable(package="spark_keras_tests")
class RefusesNegative(layers.Layer):
    """Its input unchanged, but a call holding a row whose first value is negative raises
    TensorFlow's ``InvalidArgumentError`` (a failed assertion): a row the model cannot
    take, not a call too large. Put before :class:`OutOfMemoryAbove`, it raises first."""

    def call(self, x):
        import tensorflow as tf

        check = tf.debugging.assert_non_negative(x[:, 0], message="a negative first value")
        with tf.control_dependencies([check]):
            return tf.identity(x)


def hungry_mlp(limit: int = 8, hungry: float = 1e6, features: int = 4,
               refuse_negative: bool = False) -> keras.Model:
    """An MLP over ``features`` values whose calls of more than ``limit`` rows (or with a
    row whose first value is ``hungry`` or more) run out of memory; with
    ``refuse_negative``, a call with a row whose first value is negative raises first."""
    keras.utils.set_random_seed(11)
    inp = keras.Input((features,), name="features")
    x = RefusesNegative(name="refuse")(inp) if refuse_negative else inp
    x = layers.Dense(8, activation="relu")(OutOfMemoryAbove(limit, hungry, name="oom")(x))
    return keras.Model(inp, layers.Dense(2)(x), name="hungry_mlp")


class HungryImageRows(ImageRows):
    """Image rows (:class:`ImageRows`, its conversion) whose conversion of more than
    ``limit`` rows at once, or of a row in ``hungry``, first asks numpy for :data:`HUGE`
    bytes: numpy's own ``MemoryError``."""

    def __init__(self, pixels: np.ndarray, limit: int, hungry: tuple[int, ...] = ()) -> None:
        """``pixels``: (n, H, W, C) uint8, as stored (BGR(A))."""
        n, h, w, c = pixels.shape
        super().__init__(np.ascontiguousarray(pixels).reshape(-1),
                         np.arange(n, dtype=np.int64) * (h * w * c), (h, w, c), "float32")
        self.limit, self._hungry = limit, np.asarray(hungry, np.int64) * (h * w * c)

    def _made(self, starts: np.ndarray) -> np.ndarray:
        if len(starts) > self.limit or np.isin(starts, self._hungry).any():
            np.empty(HUGE, np.uint8)
        return super()._made(starts)


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
