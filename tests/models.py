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
