"""The scoring engine every front-end uses: input kinds as named Arrow columns
(``columns``), one read per column (``walk``), the ``on_invalid`` rule and the compiled
model call (``engine``, ``predictor``), results shaped per front-end (``outputs``).

Importing this package does not import pyarrow (the Spark worker daemon imports it
before it may start Arrow's threads): import ``engine`` and the rest by module."""

from .predictor import DEFAULT_BATCH_SIZE, Predictor, predictor_for
from .signature import Signature, TensorSpec, signature_of

__all__ = ["DEFAULT_BATCH_SIZE", "Predictor", "predictor_for", "Signature", "TensorSpec",
           "signature_of"]
