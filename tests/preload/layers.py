"""A registered custom layer, preloaded by workers instead of shipped by value."""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable("spark_keras_tests")
class Scale(keras.layers.Layer):
    def __init__(self, factor: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}
