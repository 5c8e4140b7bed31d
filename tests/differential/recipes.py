"""Small Keras models from a grammar: a :class:`Recipe` says what to build, :func:`build`
builds it once per process (models are the slow part of a generated case).

Families: ``dense`` (a Dense stack over a vector), ``seq`` (a sequence of any length
through a GRU or per-step Dense layers), ``tokens`` (token ids through an Embedding and a
Transformer-style block), ``text`` (strings through a StringLookup, and optionally the
string itself back as an output), ``pair`` (two sequences of independent lengths, a
value per step of the first). Each may be masked or not, pool its steps by a masked
average, a maximum (which drops the mask) or a GRU's last state, or give a value per
step; take a second input; give two outputs; and carry a guard: ``assert`` (a
``tf.debugging`` assertion that raises on a row holding :data:`HOT` values), ``together``
(raises on a call holding two or more such rows: a failure that depends on the batch's
composition, never on one row alone) or ``table`` (a positional table of :data:`TABLE`
rows: a longer sequence gathers past it). Token ids of :data:`VOCABULARY` or more gather
past the Embedding's table with any guard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
from keras import layers

from tests.models import AssertBelow

HOT = 50.0  # a value the guards react to (ordinary values lie in [-2, 2])
LIMIT = 10.0  # AssertBelow's limit and Together's mark, for numbers
VOCABULARY = 30  # ids the Embedding holds: 30 and more gather past its table
ID_LIMIT = 20  # the guards' limit for token ids (ordinary ids lie in [1, 19])
HOT_ID = 25  # an id the guards react to, still inside the Embedding's table
TABLE = 10  # positions the positional table holds (``table``): longer rows gather past it
WORDS = ("cat", "dog", "bird", "fox", "owl")

FAMILIES = ("dense", "seq", "tokens", "text", "pair")
HEADS = ("mean", "max", "last", "steps")
GUARDS = ("none", "assert", "together", "table")


@dataclass(frozen=True)
class Recipe:
    """What model to build (see the module's text). ``width``: values per row (``dense``)
    or per step (``seq``, ``pair``); ``units`` <= 8; ``depth``: Dense layers;
    ``body``: ``"gru"`` or ``"dense"`` (``seq``), ``"attention"`` or ``"dense"``
    (``tokens``); ``extra``: a second input of 2 features; ``outputs``: 1 or 2;
    ``seed``: of the weights."""

    family: str
    width: int = 3
    units: int = 4
    depth: int = 1
    body: str = "dense"
    head: str = "mean"
    masked: bool = True
    extra: bool = False
    outputs: int = 1
    guard: str = "none"
    seed: int = 0

    @property
    def inputs(self) -> tuple[tuple[str, str], ...]:
        """``(name, kind)`` of each input, in the model's order; kinds: ``vector``
        (``width`` floats), ``features`` (2 floats), ``sequence`` (steps of ``width``
        floats), ``steps2`` (steps of 2 floats), ``tokens`` (int ids), ``text``."""
        first = {"dense": ("a", "vector"), "seq": ("s", "sequence"), "tokens": ("t", "tokens"),
                 "text": ("w", "text"), "pair": ("s", "sequence")}[self.family]
        second = ("u", "steps2") if self.family == "pair" else ("b", "features") if self.extra else None
        return (first,) if second is None else (first, second)

    @property
    def variable(self) -> bool:
        """Whether an input has rows of any length (what ``buckets`` pads)."""
        return self.family in ("seq", "tokens", "pair")

    @property
    def pads_exactly(self) -> bool:
        """Whether padded steps cannot change a row's prediction: every sequence input is
        masked and the mask reaches every output (a maximum over the steps drops it)."""
        return self.variable and self.masked and self.head != "max"

    @property
    def drops_mask(self) -> bool:
        """Whether a masked sequence input's mask is dropped on the way to an output (a
        maximum over the steps, GlobalMaxPooling1D): ``buckets`` must then be refused."""
        return self.variable and self.masked and self.head == "max" and self.family != "pair"

    @property
    def probe_may_raise(self) -> bool:
        """Whether the model may raise on the engine's probe of ``buckets`` (random ids
        in ``[1, VOCABULARY)``, which the guards of token ids refuse from :data:`ID_LIMIT`
        on, in one row or two): a refusal naming the probe is then no fault."""
        return self.family == "tokens" and self.guard in ("assert", "together")

    @property
    def composition(self) -> bool:
        """Whether a call can raise on rows none of which raises alone."""
        return self.guard == "together"

    @property
    def string_output(self) -> bool:
        return self.family == "text" and self.outputs == 2


_SERIALIZABLE = keras.saving.register_keras_serializable(package="spark_keras_differential")


@_SERIALIZABLE
class Together(layers.Layer):
    """Its input unchanged, after an assertion that fewer than two rows of the call hold a
    value of ``mark`` or more: a failure of the batch's composition, never of one row."""

    def __init__(self, mark: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mark = mark
        self.supports_masking = True

    def call(self, x):
        import tensorflow as tf

        hot = tf.cast(x >= tf.cast(self.mark, x.dtype), "int32")
        rows = tf.reduce_max(tf.reshape(hot, (tf.shape(x)[0], -1)), axis=1)
        tf.debugging.assert_less(tf.reduce_sum(rows), 2, message="two hot rows in one call")
        return x

    def get_config(self):
        return {**super().get_config(), "mark": self.mark}


@_SERIALIZABLE
class Positions(layers.Layer):
    """A learned vector per position added to each step, ``length`` positions: a longer
    row gathers past the table (the error of a Transformer's positional embedding)."""

    def __init__(self, length: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.length = length
        self.supports_masking = True

    def build(self, input_shape):
        self.table = self.add_weight(shape=(self.length, input_shape[-1]), name="positions")

    def call(self, x):
        import tensorflow as tf

        return x + tf.gather(self.table, tf.range(tf.shape(x)[1]))[None]

    def get_config(self):
        return {**super().get_config(), "length": self.length}


@_SERIALIZABLE
class AssertKnown(layers.Layer):
    """Its input (StringLookup ids) unchanged, after an assertion that none is 0 (an
    unknown word)."""

    def call(self, ids):
        import tensorflow as tf

        tf.debugging.assert_positive(ids, message="unknown word")
        return ids


@_SERIALIZABLE
class Echo(layers.Layer):
    """Its string input, as an output (bytes that are not UTF-8 come back as they are)."""

    def call(self, x):
        import tensorflow as tf

        return tf.identity(x)

    def compute_output_spec(self, x):
        return keras.KerasTensor(x.shape, dtype="string")


def _guarded(x: Any, recipe: Recipe, limit: float) -> Any:
    if recipe.guard == "assert":
        return AssertBelow(limit)(x)
    if recipe.guard == "together":
        return Together(limit)(x)
    return x


def _steps(x: Any, recipe: Recipe) -> Any:
    """The per-step body of ``seq`` and ``tokens``."""
    if recipe.body == "gru":
        last = recipe.head == "last" and recipe.family != "pair"
        return layers.GRU(recipe.units, return_sequences=not last)(x)
    if recipe.body == "attention":
        return layers.LayerNormalization()(layers.Add()([x, layers.MultiHeadAttention(2, 4)(x, x)]))
    for _ in range(recipe.depth):  # (tanh: a step of padding gives 0, inside a row's range)
        x = layers.Dense(recipe.units, activation="tanh")(x)
    return x


def _pooled(x: Any, recipe: Recipe) -> Any:
    if recipe.head == "max":
        return layers.GlobalMaxPooling1D()(x)
    if recipe.head == "last" and recipe.body == "gru":
        return x
    return layers.GlobalAveragePooling1D()(x)


@functools.lru_cache(maxsize=None)
def build(recipe: Recipe) -> keras.Model:
    """The model ``recipe`` describes, built once per process (weights seeded)."""
    keras.utils.set_random_seed(recipe.seed)
    kind = dict(recipe.inputs)
    inputs: dict[str, Any] = {}
    outputs: dict[str, Any] = {}
    if recipe.family == "dense":
        x = inputs["a"] = keras.Input((recipe.width,), name="a")
        x = _guarded(x, recipe, LIMIT)
        for _ in range(recipe.depth):
            x = layers.Dense(recipe.units, activation="relu")(x)
        pooled = x
    elif recipe.family == "text":
        w = inputs["w"] = keras.Input((), dtype="string", name="w")
        ids = layers.StringLookup(vocabulary=list(WORDS))(w)
        if recipe.guard == "assert":
            ids = AssertKnown()(ids)
        pooled = layers.Embedding(len(WORDS) + 1, recipe.units)(ids)
        if recipe.outputs == 2:
            outputs["echo"] = Echo()(w)
    else:
        if recipe.family == "tokens":
            x = inputs["t"] = keras.Input((None,), dtype="int32", name="t")
            x = layers.Embedding(VOCABULARY, recipe.units, mask_zero=recipe.masked)(
                _guarded(x, recipe, ID_LIMIT))
            if recipe.guard == "table":
                x = Positions(TABLE)(x)
        else:
            x = inputs["s"] = keras.Input((None, recipe.width), name="s")
            x = _guarded(x, recipe, LIMIT)
            if recipe.masked:
                x = layers.Masking(0.0)(x)
        x = _steps(x, recipe)
        if recipe.head == "steps" or recipe.family == "pair":
            outputs["steps"] = layers.Dense(2)(x)
            pooled = layers.GlobalAveragePooling1D()(x)
        else:
            pooled = _pooled(x, recipe)
        if recipe.family == "pair":
            u = inputs["u"] = keras.Input((None, 2), name="u")
            u_x = layers.Masking(0.0)(u) if recipe.masked else u
            pooled = layers.Concatenate()([pooled, layers.GRU(recipe.units)(u_x)])
    if "b" in kind:
        inputs["b"] = keras.Input((2,), name="b")
        pooled = layers.Concatenate()([pooled, inputs["b"]])
    if not outputs or recipe.outputs == 2 or "b" in kind or recipe.family == "pair":
        outputs["y"] = layers.Dense(1)(pooled)
    if recipe.outputs == 2 and len(outputs) < 2:
        outputs["p"] = layers.Dense(3, activation="softmax")(pooled)
    model_in = inputs if len(inputs) > 1 else next(iter(inputs.values()))
    model_out = outputs if len(outputs) > 1 else next(iter(outputs.values()))
    return keras.Model(model_in, model_out, name=f"{recipe.family}_{recipe.head}_{recipe.guard}")


def input_dtype(kind: str) -> Any:
    return {"tokens": np.int32, "text": object}.get(kind, np.float32)
