"""What the sections score: workloads (a model, its input shape, rows and batch size), the
cached DataFrames built for them, and the check that a method returns the model's own
predictions (``model.predict`` on the driver for the sample rows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from bench.harness import sample
from bench.models import actor_model, mlp_model


@dataclass
class Workload:
    name: str
    build: Callable[[], Any]
    input_shape: tuple[int, ...]
    rows: int
    batch_size: int
    variants: tuple[str, ...]  # "array", "scalars", "vector"


def workloads(quick: bool) -> list[Workload]:
    """The scoring section's workloads: the MLP on three input layouts, the CNN on arrays."""
    if quick:
        return [Workload("MLP", mlp_model, (64,), 1_000, 256, ("array", "scalars", "vector")),
                Workload("CNN", actor_model, (120, 160, 2), 16, 8, ("array",))]
    return [Workload("MLP", mlp_model, (64,), 200_000, 1024, ("array", "scalars", "vector")),
            Workload("CNN", actor_model, (120, 160, 2), 3_000, 64, ("array",))]


# --- data ----------------------------------------------------------------------------------

def make_frame(spark, workload: Workload, variant: str, partitions: int = 8):
    """A cached DataFrame of random rows: one array column, scalar columns, or a Vector."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    size = int(np.prod(workload.input_shape))
    base = spark.range(workload.rows, numPartitions=partitions)
    if variant == "scalars":
        cols = [F.rand(seed=j).cast("double").alias(f"f{j}") for j in range(size)]
        df = base.select("id", *cols)
    else:
        feats = F.transform(F.sequence(F.lit(1), F.lit(size)),
                            lambda i: (F.rand(seed=7) * i / size).cast("float"))
        df = base.select("id", feats.alias("features"))
        if variant == "vector":
            df = df.select("id", array_to_vector("features").alias("features"))
    df = df.cache()
    df.count()
    return df


def input_columns(workload: Workload, variant: str) -> list[str]:
    if variant == "scalars":
        return [f"f{j}" for j in range(int(np.prod(workload.input_shape)))]
    return ["features"]


def feature_array(variant: str, cols: list[str]):
    """The input as one array<float> column: what predict_batch_udf needs (its error
    message tells users to build it) and what the prediction check reads on the driver."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    if variant == "scalars":
        return F.array(*cols).cast("array<float>")
    if variant == "vector":
        return vector_to_array("features", "float32")
    return F.col("features")


# --- the check: every method returns the model's own predictions ---------------------------

class PredictionMismatch(AssertionError):
    """A method's predictions differ from ``model.predict`` on the same rows."""


@dataclass
class Expected:
    ids: np.ndarray      # sorted
    outputs: np.ndarray  # (rows, values per row), in the order of ids


def _column_values(column) -> np.ndarray:
    """A float or array<float> Arrow column's values, flat (nulls as NaN, null lists dropped)."""
    import pyarrow as pa

    array = column.combine_chunks()
    if pa.types.is_list(array.type):
        array = array.flatten()
    return array.to_numpy(zero_copy_only=False)


def expected_predictions(model, df, workload: Workload, variant: str, cols: list[str]) -> Expected:
    """``model.predict`` on the driver for the sample rows, read from the same cached
    DataFrame (same ids, same F.rand features) the methods score."""
    table = sample(df).select("id", feature_array(variant, cols).alias("x")).toArrow().sort_by("id")
    x = _column_values(table.column("x")).reshape(-1, *workload.input_shape)
    y = model.predict(x, batch_size=workload.batch_size, verbose=0)
    return Expected(table.column("id").to_numpy(), y.reshape(len(x), -1))


def check_predictions(method: str, got, expected: Expected, rtol: float = 1e-3,
                      atol: float = 1e-4) -> None:
    """Raise PredictionMismatch unless the Arrow table ``got`` (id, prediction) holds the
    expected rows with the expected predictions."""
    got = got.sort_by("id")
    ids = got.column("id").to_numpy()
    if not np.array_equal(ids, expected.ids):
        raise PredictionMismatch(f"{method} returned {len(ids)} rows whose ids are not the "
                                 f"{len(expected.ids)} rows it was given")
    values = _column_values(got.column("prediction"))
    if values.size != expected.outputs.size:
        raise PredictionMismatch(f"{method} returned {values.size} prediction values for "
                                 f"{len(ids)} rows; model.predict gives {expected.outputs.size}")
    values = values.reshape(expected.outputs.shape)
    close = np.isclose(values, expected.outputs, rtol=rtol, atol=atol).all(axis=1)
    if not close.all():
        i = int(np.argmin(close))
        raise PredictionMismatch(
            f"{method}: {int((~close).sum())} of {len(ids)} rows differ from model.predict on the "
            f"same rows (rtol {rtol}, atol {atol}); first at id {ids[i]}: {values[i]} instead of "
            f"{expected.outputs[i]}")
