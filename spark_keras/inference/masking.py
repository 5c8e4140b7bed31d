"""Which of a model's variable-length inputs it masks, and the value to pad each with
(:func:`padding_of`): what ``buckets`` (:mod:`.buckets`) needs to call the model on rows of
several lengths padded to one, each row's prediction staying the model's on that row alone.

An input with an unknown first dimension (a sequence) is masked when what it feeds makes
a mask of its padded steps: a ``Masking`` layer (padded with its ``mask_value``), an
``Embedding(mask_zero=True)`` (padded with 0), or, in a keras-hub model, the input
``padding_mask`` beside it (``token_ids``, ``segment_ids`` and the mask itself padded with
0, i.e. False). A mask made is not a mask kept up to the outputs (a ``Conv1D`` or a
``Flatten`` drops it), so the model is also called on one random row alone and on the same
row padded (:func:`_probe`), and the padding refused unless the outputs agree within
:data:`TOLERANCE`. Every refusal is an :class:`~spark_keras.errors.ArgumentError` saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import flavour
from ..errors import ArgumentError
from .buckets import trimmed
from .isolation import reason_text
from .signature import graph_of, input_tensors
from .specs import Signature, TensorSpec

TOLERANCE = 1e-5  # of the probe: padded against alone, relative to the outputs' scale
PROBE_STEPS, PROBE_PADDING = 5, 4  # the probe row's length, and the steps padded to it
ADVICE = "add a Masking layer or Embedding(mask_zero=True) in front, or leave buckets unset"


@dataclass(frozen=True)
class Padded:
    """How one input is padded, and how to fill a probe row of it: ``"values"`` (random
    numbers), ``"ids"`` (random ids in ``[1, ids)``), ``"mask"`` (ones) or ``"zeros"``."""

    pad: Any
    fill: str = "values"
    ids: int = 2


def padding_of(model: Any, signature: Signature,
               call: Callable[[Sequence[np.ndarray]], list[np.ndarray]]) -> tuple[Any, ...]:
    """Each input's pad value (None: an input that is not padded, its first dimension
    being known), once ``call`` (the model's compiled call, inputs in signature order) is
    found to give the same outputs on a probe row alone and padded."""
    specs = signature.inputs
    sequences = [j for j, s in enumerate(specs) if s.shape and s.shape[0] is None]
    if not sequences:
        shown = ", ".join(f"{s.name!r} {s.describe()}" for s in specs)
        raise ArgumentError(f"the model has no variable-length input ({shown}): there is "
                            f"nothing to pad; leave buckets unset")
    found = _hub_padding(model, specs, sequences) or _masked(model, specs, sequences)
    _probe(call, signature, found)
    return tuple(found[j].pad if j in found else None for j in range(len(specs)))


def _hub_padding(model: Any, specs: Sequence[TensorSpec], sequences: list[int]
                 ) -> dict[int, Padded] | None:
    """A keras-hub model's inputs beside its ``padding_mask`` (``encoder_padding_mask``...):
    all padded with 0; None for a model without such an input."""
    names = [specs[j].name for j in sequences]
    if not any(name.endswith("padding_mask") for name in names):
        return None
    ids = int(getattr(model, "vocabulary_size", None) or 2)
    return {j: Padded(0, "mask" if name.endswith("padding_mask") else
                      "ids" if name.endswith("token_ids") else "zeros", ids)
            for j, name in zip(sequences, names)}


def _masked(model: Any, specs: Sequence[TensorSpec], sequences: list[int]) -> dict[int, Padded]:
    """The padding of each sequence input, from the masks made after it."""
    found = input_tensors(model)
    if found is None or found[0] != [s.name for s in specs]:
        raise ArgumentError(f"{type(model).__name__} is not a graph of layers (a subclassed "
                            f"model): which of its inputs are masked cannot be told; buckets "
                            f"need a functional or Sequential model")
    out = {}
    for j in sequences:
        first, made = _masks_after(graph_of(model), found[1][j])
        if not made:
            what = f"feeds {type(first[0]).__name__}" if first else "feeds no layer"
            raise ArgumentError(f"input {specs[j].name!r} {what}, and no Masking layer or "
                                f"Embedding(mask_zero=True) after it marks padded steps: they "
                                f"would change the predictions; {ADVICE}")
        if len({p.pad for p in made}) > 1:
            raise ArgumentError(f"input {specs[j].name!r} feeds masks of different values "
                                f"({sorted(p.pad for p in made)}): no one padding suits them")
        out[j] = made[0]
    return out


def _masks_after(graph: Any, tensor: Any) -> tuple[list[Any], list[Padded]]:
    """The layers ``tensor`` (a symbolic input of ``graph``) feeds, and how it must be
    padded for the first layers after it that make a mask (``Masking``,
    ``Embedding(mask_zero=True)``; in a nested model of one input too) to mask the padded
    steps: the paths from it are followed until such a layer. That the values padded
    reach it unchanged, and its mask the outputs, is for the probe to tell."""
    rt = flavour.current()
    keras = rt.module
    layers = [x for x in getattr(graph, "operations", None) or graph.layers
              if not isinstance(x, keras.layers.InputLayer)]  # (tf-keras: fed its own tensor)
    first: list[Any] = []
    made: list[Padded] = []
    todo, seen = [tensor], {id(tensor)}
    while todo:
        x = todo.pop(0)
        for layer in layers:
            for node in getattr(layer, "_inbound_nodes", []):
                if not any(t is x for t in rt.flatten(node.input_tensors)):
                    continue
                if x is tensor:
                    first.append(layer)
                inner = input_tensors(layer) if isinstance(layer, keras.Model) else None
                if isinstance(layer, keras.layers.Masking):
                    made.append(Padded(float(layer.mask_value)))
                elif isinstance(layer, keras.layers.Embedding):
                    if layer.mask_zero:
                        made.append(Padded(0, "ids", int(layer.input_dim)))
                elif inner is not None and len(inner[1]) == 1 \
                        and (nested := _masks_after(layer, inner[1][0])[1]):
                    made.extend(nested)
                else:
                    for out in rt.flatten(node.output_tensors):
                        if id(out) not in seen:
                            seen.add(id(out))
                            todo.append(out)
    return first, made


def _probe(call: Callable[[Sequence[np.ndarray]], list[np.ndarray]], signature: Signature,
           found: dict[int, Padded]) -> None:
    """Refuse the padding unless ``call`` gives one random row of :data:`PROBE_STEPS`
    steps the same outputs alone and padded by :data:`PROBE_PADDING` steps."""
    rng = np.random.default_rng(0)
    alone = [_probe_row(s, found.get(j), rng) for j, s in enumerate(signature.inputs)]
    steps = PROBE_STEPS + PROBE_PADDING
    padded = [row if j not in found else
              np.concatenate([row, np.full((1, PROBE_PADDING, *row.shape[2:]), found[j].pad,
                                           row.dtype)], axis=1)
              for j, row in enumerate(alone)]
    try:
        want, got = call(alone), call(padded)
    except Exception as exc:
        raise ArgumentError(f"the model raised on a probe row of {PROBE_STEPS} steps, alone or "
                            f"padded to {steps}: {reason_text(exc)}") from exc
    for spec, w, g in zip(signature.outputs, want, got):
        g = trimmed(g[0], spec, PROBE_STEPS, steps)
        scale = max(1.0, float(np.abs(w).max())) if w.dtype.kind == "f" and w.size else 1.0
        same = g.shape == w[0].shape and (
            bool(np.all(np.abs(g - w[0]) <= TOLERANCE * scale)) if w.dtype.kind == "f"
            else bool(np.array_equal(g, w[0])))
        if not same:
            by = f"by up to {float(np.abs(g - w[0]).max()):.3g}" if g.shape == w[0].shape \
                else f"from shape {w[0].shape} to {g.shape}"
            raise ArgumentError(
                f"padding a row of {PROBE_STEPS} steps to {steps} changes output {spec.name!r} "
                f"{by}: a layer between the mask and this output drops the mask (a Conv1D, "
                f"a Flatten, any layer that takes none), so padded steps reach the "
                f"prediction; leave buckets unset")


def _probe_row(spec: TensorSpec, padded: Padded | None, rng: np.random.Generator) -> np.ndarray:
    """One row (a batch of one) of ``spec``: a sequence input :data:`PROBE_STEPS` steps
    long, its other unknown dimensions 2, filled as ``padded`` says (random numbers for
    an input that is not padded)."""
    dims = list(spec.shape)
    if padded is not None:
        dims[0] = PROBE_STEPS
    shape = (1, *(2 if d is None else d for d in dims))
    fill, ids = (padded.fill, padded.ids) if padded is not None else ("values", 2)
    if spec.dtype == "string":
        return np.full(shape, b"a", dtype=object)
    if fill == "ids":
        return rng.integers(1, max(2, ids), shape).astype(spec.dtype)
    if fill in ("mask", "zeros") or spec.dtype == "bool" or spec.dtype.startswith(("int", "uint")):
        return np.full(shape, 1 if fill == "mask" else 0, dtype=spec.dtype)
    return rng.standard_normal(shape).astype(spec.dtype)
