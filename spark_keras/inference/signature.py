"""What a model takes and returns: names, per-row shapes and dtypes (:mod:`.specs`),
read off the model."""

from __future__ import annotations

from typing import Any

from spark_keras import flavour
from spark_keras.errors import ModelError
from spark_keras.inference.specs import Signature, TensorSpec, model_outputs
from spark_keras.inference.tasks import attached_preprocessor, task_signature

# the specs' types, importable from here as before
__all__ = ["Signature", "TensorSpec", "model_outputs", "signature_of"]


def _known(shape: Any, what: str) -> tuple[int | None, ...]:
    """The per-row shape (the batch dimension dropped); unknown dimensions stay None."""
    if shape is None or len(tuple(shape)) == 0:
        raise ModelError(f"{what} has no batch dimension (shape {shape})")
    return tuple(None if d is None else int(d) for d in tuple(shape)[1:])


def signature_of(model: Any) -> Signature:
    """Input and output specs of a built Keras 3 or tf-keras model. A task model with an
    attached preprocessor (keras-hub) takes what its preprocessor takes (see
    :mod:`.tasks`)."""
    graph = _graph_signature(model)
    preprocessor = attached_preprocessor(model)
    return graph if preprocessor is None else task_signature(model, preprocessor, graph)


def graph_of(model: Any) -> Any:
    """The model's graph of layers: a Keras 3 Sequential wraps a functional model."""
    return getattr(model, "_functional", None) or model


def input_tensors(model: Any) -> tuple[list[str], list[Any], Any] | None:
    """The names and symbolic tensors of the model's inputs, in signature order, and how
    ``model()`` takes them (see :attr:`Signature.input_structure`); None for a model with no
    graph (a subclassed one)."""
    # the model's own nesting of its symbolic inputs (Keras 3, then tf-keras names)
    inputs_struct = _first_attr(graph_of(model), "_inputs_struct", "_nested_inputs")
    if inputs_struct is None:
        return None
    if isinstance(inputs_struct, dict):
        names = list(inputs_struct)
        return names, [inputs_struct[k] for k in names], tuple(names)
    tensors = flavour.current().flatten(inputs_struct)
    single = len(tensors) == 1 and not isinstance(inputs_struct, (list, tuple))
    return [_input_name(t) for t in tensors], tensors, None if single else "list"


def _graph_signature(model: Any) -> Signature:
    """Input and output specs of the model's own call."""
    rt = flavour.current()
    graph = graph_of(model)
    found = input_tensors(model)
    if found is not None:
        names, tensors, input_structure = found
        inputs = tuple(TensorSpec(n, _known(t.shape, f"input {n!r}"), rt.dtype_name(t.dtype))
                       for n, t in zip(names, tensors))
        outputs_struct = _first_attr(graph, "_outputs_struct", "_nested_outputs")
    else:
        shape = (model.get_build_config() or {}).get("input_shape")
        if shape is None or not all(d is None or isinstance(d, int) for d in shape):
            raise ModelError(f"cannot tell the input shape of {type(model).__name__}: build it "
                             f"with a single input shape (model.build(shape)) or use keras.Input")
        floatx = rt.floatx()
        inputs = (TensorSpec("input", _known(shape, "input"), floatx),)
        input_structure = None
        outputs_struct = rt.output_spec(model, (None, *inputs[0].shape), floatx)

    if isinstance(outputs_struct, dict):
        keys = tuple(outputs_struct)
        out_names: tuple[str, ...] | None = keys
        out_tensors = [outputs_struct[k] for k in keys]
    else:
        out_tensors = rt.flatten(outputs_struct)
        out_names = None
        if len(out_tensors) > 1:
            names = getattr(model, "output_names", None) or []
            out_names = tuple(names) if len(names) == len(out_tensors) and len(set(names)) == len(names) \
                else tuple(f"output_{i}" for i in range(len(out_tensors)))
    outputs = tuple(
        TensorSpec(out_names[i] if out_names else "prediction",
                   _known(t.shape, "output"), _output_dtype(t, rt))
        for i, t in enumerate(out_tensors))
    return Signature(inputs, outputs, input_structure, out_names)


def _input_name(tensor: Any) -> str:
    """An input's name: its ``InputLayer``'s, which the model's config keeps (an unnamed
    ``keras.Input`` is tensor ``keras_tensor_3`` of layer ``input_layer_1``, and only the
    layer's name survives a round trip), else the tensor's own."""
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) or (history[0] if history else None)
    return getattr(layer, "name", None) or tensor.name


def _output_dtype(tensor: Any, rt: Any) -> str:
    """A symbolic output's dtype; Keras reports ``StringLookup(invert=True)``'s strings as
    its integer input dtype, so such an output is taken for what it returns: strings."""
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) or (history[0] if history else None)
    if getattr(layer, "invert", False) and type(layer).__name__ == "StringLookup":
        return "string"
    return rt.dtype_name(tensor.dtype)


def _first_attr(obj: Any, *names: str) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return None

