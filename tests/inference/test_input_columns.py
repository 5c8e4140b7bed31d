"""Input columns as users hand them over: pandas text read from CSV files, column names
that match only some of the model's inputs, a ``preprocess`` function fed by a mapping of
columns (``pool_predict``)."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from spark_keras import ModelInputError
from spark_keras.inference.columns import from_arrow, from_frame, from_rows
from spark_keras.inference.engine import model_inputs
from spark_keras.inference.signature import Signature, TensorSpec

OUT = (TensorSpec("prediction", (1,), "float32"),)
TEXT = Signature((TensorSpec("text", (1,), "string"),), OUT, None, None)
A_B = Signature((TensorSpec("a", (1,), "float32"), TensorSpec("b", (1,), "float32")), OUT,
                "list", None)


def test_a_text_column_read_from_csv_holds_nan_for_missing_values():
    frame = pd.read_csv(io.StringIO("id,text\n0,the cat\n1,\n2,a dog\n"))
    assert frame["text"].dtype == object and np.isnan(frame["text"][1])  # what pandas gives
    (x,), invalid = model_inputs(from_frame(frame, "text", TEXT), TEXT, "null")
    np.testing.assert_array_equal(invalid, [False, True, False])
    assert x.tolist() == [["the cat"], ["a dog"]]
    with pytest.raises(ModelInputError, match=r"column 'text': null value\(s\), first at row 1"):
        model_inputs(from_frame(frame, "text", TEXT), TEXT)
    binary = pd.DataFrame({"text": [b"x", np.nan]})
    (x,), invalid = model_inputs(from_frame(binary, None, TEXT), TEXT, "null")
    assert invalid.tolist() == [False, True] and x.tolist() == [[b"x"]]


def test_a_column_of_mixed_values_is_not_called_numbers():
    mixed = pd.DataFrame({"text": ["a", 3, "b"]})
    with pytest.raises(ModelInputError) as raised:
        from_frame(mixed, None, TEXT)
    message = str(raised.value)
    assert "column 'text'" in message and "int, str" in message, message
    assert "as numbers" not in message, message


def test_only_some_columns_named_as_inputs_do_not_fall_back_to_order():
    one = pa.array([1.0, 2.0])
    two = pa.array([3.0, 4.0])
    with pytest.raises(ModelInputError, match=r"columns \['b', 'x'\] name only some of the "
                                              r"model's inputs \['a', 'b'\].*'b' would feed "
                                              r"the input 'a'"):
        model_inputs(from_arrow(["b", "x"], [one, two]), A_B)
    with pytest.raises(ModelInputError, match=r"fields \['x', 'a'\] name only some"):
        model_inputs(from_rows([{"x": 1.0, "a": 3.0}], A_B), A_B)
    # names that agree with the order, or no names at all: in order, as before
    for names in (["a", "x"], ["x", "b"], ["x", "y"]):
        (a, b), _ = model_inputs(from_arrow(names, [one, two]), A_B)
        assert a.ravel().tolist() == [1, 2] and b.ravel().tolist() == [3, 4], names
    (a, b), _ = model_inputs(from_arrow(["b", "a"], [one, two]), A_B)  # every name: by name
    assert a.ravel().tolist() == [3, 4] and b.ravel().tolist() == [1, 2]
    (a, b), _ = model_inputs(from_rows([{"b": 1.0, "a": 3.0}], A_B), A_B)
    assert a.ravel().tolist() == [3] and b.ravel().tolist() == [1]


def test_a_mapping_of_columns_for_a_preprocess_function_gives_each_named_column():
    frame = pd.DataFrame({"x": [1.0], "y": [2.0], "z": [3.0]})
    got = from_frame(frame, {"a": ["y", "x"], "b": "y"}, None)
    assert [c.name for c in got] == ["y", "x"]


def _sum_columns(batch: pd.DataFrame) -> np.ndarray:
    """A preprocess function: the columns it was given must be exactly x and y."""
    assert list(batch.columns) == ["x", "y"], list(batch.columns)
    return np.stack([batch["x"].to_numpy(), batch["y"].to_numpy(), batch["x"] + batch["y"]],
                    axis=1).astype("float32")


def test_pool_predict_with_preprocess_and_a_mapping_of_columns():
    from spark_keras.multiprocessing import pool_predict
    from tests import models

    model = models.mlp(3, 4, 2)
    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "other": ["p", "q", "r"], "y": [4.0, 5.0, 6.0]})
    name = model.inputs[0].name
    got = pool_predict(model, frame, columns={name: ["x", "y"]}, preprocess=_sum_columns,
                       processes=1)
    want = model(_sum_columns(frame[["x", "y"]]), training=False).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
