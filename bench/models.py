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
