"""What a model takes and returns, as data: per-row specs of its inputs and outputs
(:class:`TensorSpec`), the whole :class:`Signature`, and outputs shaped by it.

Nothing here imports Keras or pyarrow: :mod:`.signature` reads these off a model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # per row, without the batch dimension; None: any length
    dtype: str

    @property
    def variable(self) -> bool:
        """True if a dimension besides the batch one is unknown (``None``): rows may differ
        in shape (sequences of any length, images of any size)."""
        return None in self.shape

    @property
    def size(self) -> int | None:
        """Values per row; None when rows differ in shape (:attr:`variable`)."""
        return None if self.variable else math.prod(self.known_shape)

    @property
    def known_shape(self) -> tuple[int, ...]:
        """:attr:`shape`, typed for a spec whose dimensions are all known (call only
        when not :attr:`variable`)."""
        assert not self.variable, self
        return cast("tuple[int, ...]", self.shape)

    def describe(self) -> str:
        return f"{self.dtype} of shape {self.shape}"


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_structure: Any  # how model() wants its inputs: None (one tensor), "list", or dict keys
    output_names: tuple[str, ...] | None  # None: a single output (not a struct)

    def pack_inputs(self, arrays: list[Any]) -> Any:
        if self.input_structure is None:
            return arrays[0]
        if self.input_structure == "list":
            return list(arrays)
        return dict(zip(self.input_structure, arrays))


def model_outputs(outputs: list[Any], signature: Signature) -> Any:
    """Flat outputs (signature order) shaped like the model's: one array for a
    single-output model, a dict keyed by output name otherwise."""
    if signature.output_names is None:
        return outputs[0]
    return dict(zip(signature.output_names, outputs))


def empty_outputs(signature: Signature) -> list[np.ndarray]:
    """Outputs for no rows, of the output specs' shapes and dtypes."""
    return [np.zeros((0, *s.known_shape), dtype=object if s.dtype == "string" else s.dtype)
            if not s.variable else np.empty(0, dtype=object) for s in signature.outputs]
