"""Task models that carry their preprocessing beside their graph (keras-hub's
``TextClassifier``, ``ImageClassifier``, ...): ``model.preprocessor`` is a Keras layer
that ``model.predict`` runs on the raw inputs before the model's own call.

Such a model is scored as ``model(preprocessor(x))``, both in one compiled call: its
signature takes what the preprocessor takes (one string per row for text, an image of
any size for images) and returns what the task model returns. Nothing here imports
keras-hub; a task model is recognised by its attribute alone.
"""

from __future__ import annotations

from typing import Any

from spark_keras import flavour
from spark_keras.errors import ModelError
from spark_keras.inference.specs import Signature, TensorSpec


def attached_preprocessor(model: Any) -> Any | None:
    """``model.preprocessor`` if it is a Keras layer the model's own call does not run
    (keras-hub leaves it out of ``model.layers``), else None. A layer a subclassed model
    keeps in an attribute named ``preprocessor`` and calls itself is not one."""
    try:
        preprocessor = getattr(model, "preprocessor", None)
    except Exception:  # a property that cannot answer: not a task model
        return None
    if preprocessor is None or not isinstance(preprocessor, flavour.current().module.layers.Layer):
        return None
    if any(layer is preprocessor for layer in getattr(model, "layers", ())):
        return None
    return preprocessor


def task_signature(model: Any, preprocessor: Any, graph: Signature) -> Signature:
    """The signature of ``model`` scored with its ``preprocessor``: the preprocessor's
    input, the task model's outputs (``graph`` is the task model's own signature)."""
    return Signature((_preprocessor_input(model, preprocessor, graph),), graph.outputs,
                     None, graph.output_names)


def _preprocessor_input(model: Any, preprocessor: Any, graph: Signature) -> TensorSpec:
    """What one row of the preprocessor's input is: a string for a preprocessor with a
    tokenizer; for one with an image converter, an image (any height and width when the
    converter resizes, else the model's image shape)."""
    if getattr(preprocessor, "tokenizer", None) is not None:
        return TensorSpec("text", (), "string")
    converter = getattr(preprocessor, "image_converter", None)
    if converter is not None:
        image = graph.inputs[0] if len(graph.inputs) == 1 else None
        if image is None or len(image.shape) != 3:
            raise ModelError(f"{type(model).__name__} has an image preprocessor but its "
                             f"inputs are {[s.describe() for s in graph.inputs]}, not one "
                             f"batch of images")
        resizes = getattr(converter, "image_size", None) is not None
        shape = (None, None, image.shape[-1]) if resizes else image.shape
        return TensorSpec("image", shape, flavour.current().floatx())
    raise ModelError(
        f"cannot tell what the preprocessor {type(preprocessor).__name__} of "
        f"{type(model).__name__} takes (known: text preprocessors, with a tokenizer, and "
        f"image ones, with an image_converter): set model.preprocessor = None and score "
        f"columns holding the preprocessed inputs {[s.name for s in graph.inputs]}")


def preprocessed(preprocessor: Any, x: Any) -> Any:
    """The model inputs ``preprocessor`` makes of ``x`` (keras-hub preprocessors may
    return ``(x, y, sample_weight)`` tuples: only ``x`` is kept)."""
    unpack = flavour.current().module.utils.unpack_x_y_sample_weight
    inputs, _, _ = unpack(preprocessor(x))
    return inputs
