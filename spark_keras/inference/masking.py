"""Whether ``buckets`` (:mod:`.buckets`) may pad a model's rows, and how (:func:`padding_of`):
the value to pad each variable-length input with and the input each output with a value
per step follows (a :class:`~.buckets.Padding`), each row's prediction staying the model's
on that row alone. A model is taken when all three checks below pass; every refusal is an
:class:`~spark_keras.errors.ArgumentError` saying why.

1. **A mask is made.** Each input with an unknown first dimension (a sequence) feeds a
   layer that masks its padded steps: a ``Masking`` layer (padded with its ``mask_value``),
   an ``Embedding(mask_zero=True)`` (padded with 0), in a nested model of one input too,
   or any other layer whose output carries a mask (its own ``compute_mask``, as keras.io's
   ``PositionalEmbedding``: ``inputs != 0``; padded with 0, which the probe confirms); or,
   in a keras-hub model, it is the input ``padding_mask`` or sits beside it
   (``token_ids``, ``segment_ids`` and the mask itself padded with 0, i.e. False).
2. **The mask is kept** (:func:`_walk`, on the model's graph of layers). Keras hands each
   layer the mask of the tensors it is given. A layer that supports masking passes it on
   (``Dense``, ``LayerNormalization``, ``Add``) or uses it (an RNN, attention,
   ``GlobalAveragePooling1D``: ``supports_masking``, or a ``mask`` argument of its
   ``call``); any other layer given a mask drops it (``GlobalMaxPooling1D``, ``Conv1D``,
   ``Flatten``, a ``keras.ops`` call; Keras 3 warns that such a layer "does not support
   masking") and is refused by name, as is a path from the input to an output on which no
   mask is made. An output with a value per step follows the input it is computed from, or,
   computed from two, the one its mask comes from (:func:`_follows`); else it is refused.
   A keras-hub model, whose mask is an input, and the inside of a nested model given a
   mask from outside are left to the probe.
3. **The probe agrees** (:func:`.mask_probe.probe`): rows a model blind to its mask
   cannot get right give the same outputs alone and padded.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from spark_keras import flavour
from spark_keras.errors import ArgumentError
from spark_keras.inference.buckets import Padding
from spark_keras.inference.mask_probe import INT_VALUES, Padded, probe
from spark_keras.inference.signature import graph_of, input_tensors
from spark_keras.inference.specs import Signature, TensorSpec

ADVICE = "add a Masking layer or Embedding(mask_zero=True) in front, or leave buckets unset"
HUB_AXES = ("token_ids", "segment_ids", "padding_mask")  # keras-hub inputs sharing one axis


def padding_of(model: Any, signature: Signature,
               call: Callable[[Sequence[np.ndarray]], list[np.ndarray]]) -> Padding:
    """Each input's pad value (None: an input that is not padded, its first dimension
    being known) and the input each output's steps follow, once the model passes the
    module's checks (``call``: the model's compiled call, inputs in signature order)."""
    specs = signature.inputs
    sequences = [j for j, s in enumerate(specs) if s.shape and s.shape[0] is None]
    if not sequences:
        shown = ", ".join(f"{s.name!r} {s.describe()}" for s in specs)
        raise ArgumentError(f"the model has no variable-length input ({shown}): there is "
                            f"nothing to pad; leave buckets unset")
    graph = _Graph.of(model)
    if graph is not None and graph.names != [s.name for s in specs]:
        graph = None  # (a task model: its signature is its preprocessor's)
    hub = _hub_padding(model, specs, sequences)
    if hub is not None:
        found = hub
    elif graph is not None:
        found = _masked(graph, signature, sequences)
    else:
        raise ArgumentError(f"{type(model).__name__} is not a graph of layers (a subclassed "
                            f"model): which of its inputs are masked cannot be told; buckets "
                            f"need a functional or Sequential model")
    follows = _follows(graph, signature, found, hub is not None)
    probe(call, signature, found, follows)
    return Padding([found[j].pad if j in found else None for j in range(len(specs))], follows)


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


@dataclass(frozen=True)
class _Graph:
    """A functional model's graph: the calls of its layers each tensor feeds (``calls``:
    by the tensor's id, the layer and the outputs of the call that the model's outputs are
    computed from, masks aside), its inputs' names and tensors and its outputs' tensors
    (in signature order), and the ids of the masks its layers pass each other."""

    calls: dict[int, list[tuple[Any, list[Any]]]]
    names: list[str]
    inputs: list[Any]
    outputs: list[Any]
    masks: frozenset[int]

    @classmethod
    def of(cls, model: Any) -> _Graph | None:
        """``model``'s graph; None for a model without one (a subclassed model)."""
        rt = flavour.current()
        found = input_tensors(model)
        graph = graph_of(model)
        struct = next((s for s in (getattr(graph, name, None) for name in
                                   ("_outputs_struct", "_nested_outputs")) if s is not None), None)
        if found is None or struct is None:
            return None
        outputs = [struct[k] for k in struct] if isinstance(struct, dict) else rt.flatten(struct)
        layers = [x for x in getattr(graph, "operations", None) or graph.layers
                  if not isinstance(x, rt.module.layers.InputLayer)]  # (tf-keras: fed its own tensor)
        nodes = [(layer, node) for layer in layers for node in getattr(layer, "_inbound_nodes", [])]
        masks = frozenset([*(id(m) for _, node in nodes
                             for t in (*_fed(node), *rt.flatten(node.output_tensors))
                             if (m := _mask_of(t)) is not None),
                           *(id(t) for _, node in nodes for t in _mask_arguments(node))])
        data = _ancestors(outputs, masks)
        calls: dict[int, list[tuple[Any, list[Any]]]] = {}
        for layer, node in nodes:
            outs = [t for t in rt.flatten(node.output_tensors) if id(t) in data]
            if outs:  # (not a call computing a mask only)
                for t in {id(t): t for t in _fed(node)}.values():
                    calls.setdefault(id(t), []).append((layer, outs))
        return cls(calls, found[0], found[1], outputs, masks)


@dataclass
class _Walk:
    """What :func:`_walk` finds after an input: the layers it feeds, how to pad it for the
    masks made after it, the layers given its mask that drop it, and the outputs (their
    index) it reaches on a path where no mask is made."""

    first: list[Any] = field(default_factory=list)
    made: list[Padded] = field(default_factory=list)
    dropped: list[Any] = field(default_factory=list)
    bare: list[int] = field(default_factory=list)
    vocabularies: list[int] = field(default_factory=list)  # of the Embedding layers met


def _masked(graph: _Graph, signature: Signature, sequences: list[int]) -> dict[int, Padded]:
    """The padding of each sequence input, once the mask made after it is kept to the
    outputs (checks 1 and 2 of the module's text)."""
    out = {}
    for j in sequences:
        name, walk = signature.inputs[j].name, _walk(graph, graph.inputs[j])
        if not walk.made:
            what = f"feeds {type(walk.first[0]).__name__}" if walk.first else "feeds no layer"
            raise ArgumentError(f"input {name!r} {what}, and no Masking layer or "
                                f"Embedding(mask_zero=True) after it marks padded steps: they "
                                f"would change the predictions; {ADVICE}")
        if len({p.pad for p in walk.made}) > 1:
            raise ArgumentError(f"input {name!r} feeds masks of different values "
                                f"({sorted(p.pad for p in walk.made)}): no one padding suits them")
        if walk.dropped:
            layer = walk.dropped[0]
            raise ArgumentError(f"input {name!r} is masked, but {type(layer).__name__} "
                                f"{layer.name!r} after it does not support masking: given the "
                                f"mask, it drops it (Keras 3 warns so), and the padded steps "
                                f"reach the outputs after it; leave buckets unset")
        if walk.bare:
            raise ArgumentError(f"input {name!r} reaches output "
                                f"{signature.outputs[walk.bare[0]].name!r} by a path with no "
                                f"Masking layer or Embedding(mask_zero=True) on it: its padded "
                                f"steps would change that output; {ADVICE}")
        out[j] = walk.made[0]
        if out[j].fill == "values" and signature.inputs[j].dtype.startswith(("int", "uint")):
            # integers masked by value: probe rows of ids (below the smallest vocabulary
            # after the input), not zeros, which are the pad value and would all be masked
            out[j] = Padded(out[j].pad, "ids", min(walk.vocabularies, default=INT_VALUES))
    return out


def _walk(graph: _Graph, tensor: Any) -> _Walk:
    """The paths from ``tensor`` (an input of ``graph``) to the outputs, layer by layer
    (see :class:`_Walk`). A path is followed while it carries the input's padded steps:
    unmasked, until a layer makes a mask (``Masking``, ``Embedding(mask_zero=True)``, a
    nested model of one input that makes one, any other layer whose output has a mask);
    masked, through the layers that pass the
    mask on, to a layer that uses it up (an output without a mask) or drops it."""
    rt = flavour.current()
    keras = rt.module
    walk = _Walk()
    todo, seen = [tensor], {id(tensor)}
    while todo:
        x = todo.pop(0)
        masked = _mask_of(x) is not None
        if not masked:
            walk.bare.extend(k for k, out in enumerate(graph.outputs) if out is x)
        for layer, outs in graph.calls.get(id(x), []):
            if x is tensor:
                walk.first.append(layer)
            if isinstance(layer, keras.layers.Embedding):
                walk.vocabularies.append(int(layer.input_dim))
            after: Iterable[Any] = outs
            if masked:
                if not _takes_mask(layer):
                    walk.dropped.append(layer)
                    continue
                after = [t for t in outs if _mask_of(t) is not None]  # a mask used up: no steps
            elif isinstance(layer, keras.layers.Masking):
                walk.made.append(Padded(float(layer.mask_value)))
            elif isinstance(layer, keras.layers.Embedding):
                if layer.mask_zero:
                    walk.made.append(Padded(0, "ids", int(layer.input_dim)))
            elif isinstance(layer, keras.Model) and (inner := _Graph.of(layer)) is not None \
                    and len(inner.inputs) == 1 and (nested := _walk(inner, inner.inputs[0])).made:
                walk.made.extend(nested.made)
                walk.dropped.extend(nested.dropped)
                walk.vocabularies.extend(nested.vocabularies)
                if not nested.bare:  # its mask used up inside, or passed on
                    after = [t for t in outs if _mask_of(t) is not None]
            elif any(_mask_of(t) is not None for t in outs):
                # another layer making a mask (a compute_mask of its own: keras.io's
                # PositionalEmbedding, ``inputs != 0``): padded with 0, which the probe checks
                walk.made.append(Padded(0))
                walk.vocabularies.extend(_vocabularies(layer))
            for t in after:
                if id(t) not in seen:
                    seen.add(id(t))
                    todo.append(t)
    return walk


def _vocabularies(layer: Any) -> list[int]:
    """The input sizes of the Embedding layers inside ``layer``."""
    embedding = flavour.current().module.layers.Embedding
    flatten = getattr(layer, "_flatten_layers", None)
    inner = flatten(include_self=False, recursive=True) if flatten else []
    return [int(x.input_dim) for x in inner if isinstance(x, embedding)]


def _takes_mask(layer: Any) -> bool:
    """Whether ``layer``, given a mask, passes it on or uses it: Keras's
    ``supports_masking``, or a ``mask`` (``query_mask``...) argument of its ``call`` (of
    its function, for a ``Lambda``)."""
    if getattr(layer, "supports_masking", False):
        return True
    lambda_layer = flavour.current().module.layers.Lambda
    try:
        params = inspect.signature(layer.function if isinstance(layer, lambda_layer)
                                   else layer.call).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return any(_is_mask_name(p) for p in params)


def _fed(node: Any) -> list[Any]:
    """The symbolic tensors a layer's call (``node``) was given, in any argument (tf-keras's
    ``input_tensors`` are its first argument's alone)."""
    fed = getattr(node, "keras_inputs", None)  # tf-keras
    return list(fed) if fed is not None else flavour.current().flatten(node.input_tensors)


def _mask_arguments(node: Any) -> list[Any]:
    """The tensors a layer's call (``node``) was given as masks (``mask=``, ``query_mask=``...;
    a model loaded from its config passes each mask so, computed by ops of its graph)."""
    kwargs = getattr(getattr(node, "arguments", None), "kwargs", None)  # Keras 3
    if kwargs is None:
        kwargs = getattr(node, "call_kwargs", None) or {}  # tf-keras
    return [t for name, value in kwargs.items() if _is_mask_name(name)
            for t in flavour.current().flatten(value)]


def _is_mask_name(name: str) -> bool:
    """Whether a ``call`` argument of this name takes a mask (``use_causal_mask`` does not)."""
    return name == "mask" or (name.endswith("_mask") and not name.startswith("use_"))


def _mask_of(tensor: Any) -> Any:
    """The mask Keras attached to a symbolic tensor, if any."""
    return getattr(tensor, "_keras_mask", None)


def _ancestors(tensors: Iterable[Any], skip: frozenset[int] = frozenset()) -> set[int]:
    """The ids of ``tensors`` and of the tensors they are computed from (each one's Keras
    history, back to the inputs), leaving out those of ``skip`` and what only they come from."""
    todo, seen = list(tensors), set()
    while todo:
        t = todo.pop()
        if id(t) in seen or id(t) in skip:
            continue
        seen.add(id(t))
        history = getattr(t, "_keras_history", None)
        nodes = getattr(history[0], "_inbound_nodes", []) if history else []
        if history and history[1] < len(nodes):
            todo.extend(_fed(nodes[history[1]]))
    return seen


def _follows(graph: _Graph | None, signature: Signature, found: dict[int, Padded],
             hub: bool) -> tuple[int | None, ...]:
    """For each output, the padded input whose steps its first axis follows: for an output
    with a value per step, the padded input it is computed from; of several on different
    axes (keras-hub's ``token_ids`` and ``padding_mask`` share one), the one its mask comes
    from. None for an output without a value per step or computed from no padded input."""
    axis = {j: _hub_axis(signature.inputs[j].name) if hub else str(j) for j in found}
    out: list[int | None] = []
    for k, spec in enumerate(signature.outputs):
        if not spec.shape or spec.shape[0] is not None:
            out.append(None)
            continue
        candidates = sorted(found)
        if graph is not None:
            before = _ancestors([graph.outputs[k]], graph.masks)
            candidates = [j for j in candidates if id(graph.inputs[j]) in before]
            mask = _mask_of(graph.outputs[k])
            if len({axis[j] for j in candidates}) > 1 and mask is not None:
                of_mask = _ancestors([mask])
                candidates = [j for j in candidates if id(graph.inputs[j]) in of_mask] or candidates
        if len({axis[j] for j in candidates}) > 1:
            names = " and ".join(repr(signature.inputs[j].name) for j in candidates)
            raise ArgumentError(f"output {spec.name!r} has a value per step, computed from inputs "
                                f"{names}, and which of them its steps follow cannot be told from "
                                f"the model (nor from its mask): padded to one length, rows of "
                                f"different lengths could not be cut back to their own; leave "
                                f"buckets unset")
        out.append(candidates[0] if candidates else None)
    return tuple(out)


def _hub_axis(name: str) -> str:
    """The axis a keras-hub input lies on: its name's prefix (``encoder_``, ``decoder_``
    or none) before ``token_ids``, ``segment_ids`` or ``padding_mask``."""
    return next((name[:-len(s)] for s in HUB_AXES if name.endswith(s)), name)
