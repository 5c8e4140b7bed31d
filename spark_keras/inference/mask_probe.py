"""Check 3 of :mod:`.masking`: the probe. Rows a model blind to its mask cannot get right
(random steps, the same negated, one step repeated, and negated: a padded step moves a
maximum, a mean or a state over them; of an integer input, random ids below the smallest
vocabulary after it, never the pad value) must give the same outputs alone and padded by 1
and by :data:`PROBE_PADDING` steps: each value within :data:`TOLERANCE` of the largest at
its place over the probe rows (plus :data:`FLOOR`), so a small output beside a large one is
held to its own scale. :class:`Padded` says how each input is padded and its probe rows filled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from spark_keras.errors import ArgumentError
from spark_keras.inference.buckets import trimmed
from spark_keras.inference.isolation import reason_text
from spark_keras.inference.specs import Signature, TensorSpec

TOLERANCE = 1e-5  # of the probe: padded against alone, relative to each value's scale
FLOOR = 1e-7  # of the probe: the least difference it tells from none (values near 0)
INT_VALUES = 10  # a probe row of an integer input takes values below this (ids: its vocabulary)
PROBE_STEPS, PROBE_PADDING = 5, 4  # the probe rows' length, and the most steps padded to them


@dataclass(frozen=True)
class Padded:
    """How one input is padded, and how to fill probe rows of it: ``"values"`` (random
    numbers), ``"ids"`` (random ids in ``[1, ids)``), ``"mask"`` (ones) or ``"zeros"``."""

    pad: Any
    fill: str = "values"
    ids: int = 2


def probe(call: Callable[[Sequence[np.ndarray]], list[np.ndarray]], signature: Signature,
          found: dict[int, Padded], follows: Sequence[int | None]) -> None:
    """Refuse the padding unless ``call`` gives :func:`_probe_rows` of :data:`PROBE_STEPS`
    steps the same outputs alone and padded by 1 and by :data:`PROBE_PADDING` steps."""
    rng = np.random.default_rng(0)
    alone = [_probe_rows(s, found.get(j), rng) for j, s in enumerate(signature.inputs)]
    want = _called(call, alone, PROBE_STEPS)
    for extra in (1, PROBE_PADDING):
        steps = PROBE_STEPS + extra
        got = _called(call, [rows if j not in found else np.concatenate(
            [rows, np.full((len(rows), extra, *rows.shape[2:]), found[j].pad, rows.dtype)], axis=1)
            for j, rows in enumerate(alone)], steps)
        for spec, follow, w, g in zip(signature.outputs, follows, want, got):
            length = steps if follow is None else PROBE_STEPS
            by = _difference(w, [trimmed(row, spec, length, steps) for row in g])
            if by:
                raise ArgumentError(
                    f"padding rows of {PROBE_STEPS} steps to {steps} changes output {spec.name!r} "
                    f"{by}: the padded steps reach it (a layer changes them or mixes them with "
                    f"the others before the mask is made, or passes the mask on without heeding "
                    f"it, perhaps inside a nested model); leave buckets unset")


def _called(call: Callable[[Sequence[np.ndarray]], list[np.ndarray]], rows: list[np.ndarray],
            steps: int) -> list[np.ndarray]:
    """``call`` on probe rows of ``steps`` steps; an :class:`ArgumentError` if it raises."""
    try:
        return call(rows)
    except Exception as exc:
        raise ArgumentError(f"the model raised on probe rows of {PROBE_STEPS} steps "
                            f"(padded to {steps}): {reason_text(exc)}") from exc


def _difference(want: np.ndarray, got: list[np.ndarray]) -> str | None:
    """How the padded rows' outputs ``got`` differ from ``want`` (the rows' alone), or None
    where they agree: each number within :data:`TOLERANCE` of the largest of ``want``'s
    values at its place (over the probe rows) plus :data:`FLOOR` (a place whose values are
    all tiny, a relu's zeros)."""
    for w, g in zip(want, got):
        if g.shape != w.shape:
            return f"from shape {w.shape} to {g.shape}"
    if want.dtype.kind != "f":
        return None if all(np.array_equal(w, g) for w, g in zip(want, got)) else "in its values"
    w, g = want.astype(np.float64), np.stack(got).astype(np.float64)
    gap = np.where((w == g) | (np.isnan(w) & np.isnan(g)), 0.0, np.abs(g - w))
    gap = np.nan_to_num(gap, nan=np.inf)
    scale = np.max(np.abs(np.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)), axis=0,
                   initial=0.0)
    over = gap > TOLERANCE * scale + FLOOR
    if not over.any():
        return None
    at = np.unravel_index(int(np.argmax(np.where(over, gap, -1.0))), gap.shape)
    return f"by up to {float(gap[at]):.3g} (its values up to {float(scale[at[1:]]):.3g} there)"


def _probe_rows(spec: TensorSpec, padded: Padded | None, rng: np.random.Generator) -> np.ndarray:
    """Four rows (a batch) of ``spec``: a sequence input :data:`PROBE_STEPS` steps long,
    its other unknown dimensions 2, filled as ``padded`` says: random numbers, the same
    negated, one step repeated and negated (ids: random, reversed, the first and the last
    repeated); random numbers for an input that is not padded."""
    dims = list(spec.shape)
    if padded is not None:
        dims[0] = PROBE_STEPS
    shape = (4, *(2 if d is None else d for d in dims))
    fill, ids = (padded.fill, padded.ids) if padded is not None else ("values", 2)
    if spec.dtype == "string":
        return np.full(shape, b"a", dtype=object)
    if fill == "ids":
        tokens = rng.integers(1, max(2, ids), shape[1:])
        pad = padded.pad if padded is not None else 0
        tokens[tokens == pad] = 1 if pad != 1 else min(2, max(1, ids - 1))  # (never the pad)
        return np.stack([tokens, tokens[::-1], np.broadcast_to(tokens[:1], tokens.shape),
                         np.broadcast_to(tokens[-1:], tokens.shape)]).astype(spec.dtype)
    if fill in ("mask", "zeros") or spec.dtype == "bool" or spec.dtype.startswith(("int", "uint")):
        return np.full(shape, 1 if fill == "mask" else 0, dtype=spec.dtype)
    if padded is None:
        return rng.standard_normal(shape).astype(spec.dtype)
    row = rng.standard_normal(shape[1:])
    step = np.broadcast_to(row[:1], row.shape)
    return np.stack([row, -row, step, -step]).astype(spec.dtype)
