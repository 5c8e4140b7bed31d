"""Runs a TensorFlow op when imported, which starts TensorFlow's runtime: a daemon must
not fork after preloading it."""

import tensorflow as tf

ONE = tf.constant(1.0) + 0.0
