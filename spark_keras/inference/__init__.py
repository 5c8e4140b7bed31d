"""Batch inference: model signatures, Arrow/numpy conversion, the compiled predict call."""

from .predictor import DEFAULT_BATCH_SIZE, Predictor, predictor_for
from .signature import Signature, TensorSpec, signature_of

__all__ = ["DEFAULT_BATCH_SIZE", "Predictor", "predictor_for", "Signature", "TensorSpec",
           "signature_of"]
