"""Lists TensorFlow's devices when imported (on a GPU host that initializes CUDA): a
daemon must not fork after preloading it."""

import tensorflow as tf

DEVICES = tf.config.list_physical_devices()
