"""The differential oracle: what every row's outcome must be, computed the slow, obvious
way, one row at a time, with none of the engine's code.

For each row: the preprocess function (if any) on a fresh one-row batch (it raises:
stage ``preprocess``); each model input's cell checked by the rules the docs state
(null, a null or NaN/infinite value anywhere, a wrong width, an empty sequence: stage
``input``, naming the columns at fault in input order); the model on that row alone,
``model(row[None])`` (it raises: stage ``model``); a string output that is not UTF-8
text (stage ``output``). Every other row is scored, with the model's outputs on it alone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.differential.cases import PREPROCESS, Case, column_array
from tests.differential.recipes import Recipe, build

STAGES = ("preprocess", "input", "model", "output")  # in the order the engine meets them


@dataclass
class Outcome:
    """One row's outcome: ``stage`` None (scored, ``values``: output name -> the row's
    value) or the stage at fault; ``columns``: at stage ``input``, every input column at
    fault, in input order."""

    stage: str | None
    values: dict[str, Any] | None = None
    columns: tuple[str, ...] = ()
    why: str = ""


def expected(case: Case) -> list[Outcome]:
    """Every row's :class:`Outcome` (see the module's text)."""
    return [_row_outcome(case, i) for i in range(case.n)]


def _row_outcome(case: Case, i: int) -> Outcome:
    recipe = case.recipe
    cells = list(case.rows[i])
    if case.preprocess is not None:
        try:
            cells = _preprocessed(case, i)
        except Exception as exc:  # the user's function refused the row
            return Outcome("preprocess", why=f"{type(exc).__name__}: {exc}")
    wrong = tuple(name for (name, kind), cell in zip(recipe.inputs, cells)
                  if not valid_cell(cell, kind, recipe.width))
    if wrong:
        return Outcome("input", columns=wrong)
    try:
        values = alone(recipe, cells)
    except Exception as exc:  # the model raised on this row alone
        return Outcome("model", why=f"{type(exc).__name__}: {str(exc)[:200]}")
    for name, value in values.items():
        if isinstance(value, (bytes, np.bytes_)):
            try:
                values[name] = bytes(value).decode()
            except UnicodeDecodeError as exc:
                return Outcome("output", why=str(exc))
    return Outcome(None, values)


def _preprocessed(case: Case, i: int) -> list[Any]:
    """The model inputs' cells the preprocess function makes of row ``i`` alone, given a
    fresh batch of that one row, as a user's function receives it (arrays as numpy
    arrays, null as None)."""
    import pandas as pd

    (name, kind), = case.columns()
    batch = pd.DataFrame({name: column_array([case.rows[i][0]], kind).to_pandas()})
    made = PREPROCESS[case.preprocess](batch)  # type: ignore[index]
    made = made if isinstance(made, (list, tuple)) else [made]
    return [np.asarray(m)[0] for m in made]


def valid_cell(cell: Any, kind: str, width: int) -> bool:
    """Whether a model input's cell can be scored (the docs' input checks)."""
    if cell is None:
        return False
    if kind == "text":
        return isinstance(cell, (str, bytes))
    value = cell.tolist() if isinstance(cell, np.ndarray) else cell
    if kind in ("vector", "features"):
        return _numbers(value, width if kind == "vector" else 2)
    if kind in ("sequence", "steps2"):
        steps = width if kind == "sequence" else 2
        return isinstance(value, list) and len(value) > 0 and all(_numbers(s, steps) for s in value)
    if kind == "tokens":
        return isinstance(value, list) and len(value) > 0 \
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    raise AssertionError(kind)


def _numbers(value: Any, width: int) -> bool:
    return isinstance(value, list) and len(value) == width and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)


def alone(recipe: Recipe, cells: list[Any]) -> dict[str, Any]:
    """The model on one row alone (a batch of one), each output's value for that row."""
    arrays = []
    for (_, kind), cell in zip(recipe.inputs, cells):
        if kind == "text":
            arrays.append(np.array([cell if isinstance(cell, bytes) else cell.encode()], dtype=object))
        else:
            arrays.append(np.asarray(cell, dtype="int32" if kind == "tokens" else "float32")[None])
    return {name: out[0] for name, out in _call(recipe)(arrays).items()}


@functools.lru_cache(maxsize=None)
def _call(recipe: Recipe) -> Any:
    """``model(x, training=False)`` on numpy inputs, in a ``tf.function`` (an eager GRU
    takes about a second a row): output name -> numpy array. A single output is named
    ``prediction``."""
    import tensorflow as tf

    model = build(recipe)
    specs = {name: tf.TensorSpec((None, *shape_of(kind, recipe.width)),
                                 {"tokens": tf.int32, "text": tf.string}.get(kind, tf.float32))
             for name, kind in recipe.inputs}
    single = len(specs) == 1

    def call(x: Any) -> Any:
        return model(next(iter(x.values())) if single else x, training=False)

    function = tf.function(call, input_signature=[specs], autograph=False)

    def run(arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        out = function(dict(zip(specs, arrays)))
        if isinstance(out, dict):
            return {k: np.asarray(v) for k, v in out.items()}
        return {"prediction": np.asarray(out)}

    return run


def shape_of(kind: str, width: int) -> tuple[int | None, ...]:
    """An input's shape per row."""
    return {"vector": (width,), "features": (2,), "sequence": (None, width), "steps2": (None, 2),
            "tokens": (None,), "text": ()}[kind]
