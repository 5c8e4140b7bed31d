"""The scoring engine every front-end uses: what a model takes and returns (``specs``,
read off the model by ``signature``), input kinds as named Arrow columns (``columns``),
one read per column (``walk`` and ``images``, giving a ``column_read.ColumnRead``), the
``on_invalid`` rule and the compiled model call (``engine``, ``predictor``), results
shaped per front-end (``outputs``); batches of rows in mixed key order put together for
KeyedModels (``keyed_batches``).

Importing this package does not import pyarrow (the Spark worker daemon imports it
before it may start Arrow's threads): import ``engine`` and the rest by module."""

from spark_keras.inference.options import DEFAULT_BATCH_SIZE
from spark_keras.inference.predictor import Predictor, predictor_for
from spark_keras.inference.signature import signature_of
from spark_keras.inference.specs import Signature, TensorSpec

__all__ = ["DEFAULT_BATCH_SIZE", "Predictor", "predictor_for", "Signature", "TensorSpec",
           "signature_of"]
