"""Arrow columns <-> model tensors, without Spark: shapes, dtypes, errors, the null policy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_keras import ModelInputError
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import model_inputs
from spark_keras.inference.outputs import outputs_to_arrow
from spark_keras.inference.signature import Signature, TensorSpec

ONE = Signature((TensorSpec("x", (3,), "float32"),), (TensorSpec("prediction", (1,), "float32"),), None, None)
IMAGE = Signature((TensorSpec("img", (2, 2), "float32"),), (TensorSpec("prediction", (2,), "float32"),), None, None)
MULTI_OUT = Signature((TensorSpec("x", (3,), "float32"),),
                      (TensorSpec("score", (1,), "float32"), TensorSpec("probs", (2,), "float32")),
                      None, ("score", "probs"))


def inputs(arrays, sig=ONE, names=None, on_invalid="error"):
    names = names or [f"c{i}" for i in range(len(arrays))]
    return model_inputs(from_arrow(names, arrays), sig, on_invalid)


def test_list_column_is_reshaped_without_copy():
    values = pa.array(np.arange(6, dtype="float32"))
    col = pa.ListArray.from_arrays(pa.array([0, 3, 6], pa.int32()), values)
    (x,), invalid = inputs([col])
    assert invalid is None and x.shape == (2, 3) and x.dtype == np.float32
    assert np.shares_memory(x, values.to_numpy())


def test_nested_and_fixed_size_lists():
    nested = pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], pa.list_(pa.list_(pa.float64())))
    (x,), _ = inputs([nested], IMAGE)
    np.testing.assert_array_equal(x, np.arange(1, 9).reshape(2, 2, 2))
    flat = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype="float32")), 4)
    (y,), _ = inputs([flat], IMAGE)
    np.testing.assert_array_equal(y, np.arange(8).reshape(2, 2, 2))


def test_sliced_list_column():
    col = pa.array([[9, 9, 9], [1, 2, 3], [4, 5, 6]], pa.list_(pa.float32())).slice(1)
    (x,), _ = inputs([col])
    np.testing.assert_array_equal(x, [[1, 2, 3], [4, 5, 6]])


def test_scalar_columns_are_stacked():
    cols = [pa.array([1.0, 4.0]), pa.array([2, 5]), pa.array([3.0, 6.0], pa.float32())]
    (x,), _ = inputs(cols, names=["a", "b", "c"])
    np.testing.assert_array_equal(x, [[1, 2, 3], [4, 5, 6]])


@pytest.mark.parametrize("col, pattern", [
    (pa.array([[1, 2, 3], [1, 2]], pa.list_(pa.float32())), r"column 'feat'.*ragged.*row 1.*has 2.*\(3,\)"),
    (pa.array([[1, 2], [1, 2]], pa.list_(pa.float32())), r"column 'feat'.*2 values.*\(3,\)"),
    (pa.array([[1, 2, 3], None], pa.list_(pa.float32())), r"column 'feat'.*null.*row 1"),
    (pa.array([[1, None, 3]], pa.list_(pa.float32())), r"column 'feat'.*null"),
    (pa.array([[1, 2, 3], [1, float("nan"), 3]], pa.list_(pa.float32())), r"column 'feat'.*NaN.*row 1"),
    (pa.array([[1, 2, 3], [1, float("inf"), 3]], pa.list_(pa.float32())), r"column 'feat'.*infinite"),
    (pa.array(["a", "b"]), r"column 'feat' has type string"),
    (pa.array([True, False]), r"column 'feat' has type bool"),
    (pa.array([["a", "b", "c"]], pa.list_(pa.string())), r"column 'feat' holds arrays of string"),
])
def test_bad_input_names_column_row_and_shape(col, pattern):
    with pytest.raises(ModelInputError, match=pattern):
        inputs([col], names=["feat"])


def test_wrong_column_count():
    with pytest.raises(ModelInputError, match="2 columns.*3 scalar columns"):
        inputs([pa.array([1.0]), pa.array([2.0])], names=["a", "b"])
    with pytest.raises(ModelInputError, match="column 'b' has type string"):
        inputs([pa.array([1.0]), pa.array(["x"]), pa.array([2.0])], names=["a", "b", "c"])


def vector_struct(rows):
    """ML Vectors in their Arrow form: struct<type, size, indices, values>."""
    return pa.array(rows, pa.struct([("type", pa.int8()), ("size", pa.int32()),
                                     ("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float64()))]))


def test_dense_and_sparse_vectors():
    col = vector_struct([
        {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},
        {"type": 0, "size": 3, "indices": [2], "values": [7.0]},
        {"type": 0, "size": 3, "indices": [], "values": []},
    ])
    (x,), _ = inputs([col])
    np.testing.assert_array_equal(x, [[1, 2, 3], [0, 0, 7], [0, 0, 0]])
    with pytest.raises(ModelInputError, match="sparse vector at row 0.*size 4"):
        inputs([vector_struct([{"type": 0, "size": 4, "indices": [0], "values": [1.0]}])])


def test_null_policy_scores_valid_rows_and_nulls_the_rest():
    col = pa.array([[1, 2, 3], None, [1, 2], [1, float("nan"), 3], [4, 5, 6]], pa.list_(pa.float32()))
    (x,), invalid = inputs([col], on_invalid="null")
    np.testing.assert_array_equal(invalid, [False, True, True, True, False])
    np.testing.assert_array_equal(x, [[1, 2, 3], [4, 5, 6]])
    out = outputs_to_arrow([np.array([[10.0], [20.0]])], ONE, invalid)
    assert out.to_pylist() == [10.0, None, None, None, 20.0]
    struct = outputs_to_arrow([np.array([[1.0], [2.0]]), np.array([[0.1, 0.9], [0.2, 0.8]])], MULTI_OUT, invalid)
    assert len(struct) == 5 and struct.null_count == 3
    assert struct.to_pylist()[4]["probs"] == pytest.approx([0.2, 0.8])
    with pytest.raises(ModelInputError, match="has type string"):  # a column problem still raises
        inputs([pa.array(["a"])], on_invalid="null")
    with pytest.raises(ValueError, match="on_invalid must be one of"):
        inputs([col], on_invalid="skip")


def test_outputs_as_arrow_types():
    out = outputs_to_arrow([np.ones((2, 2), "float32")], IMAGE)
    assert out.type == pa.list_(pa.float32()) and out.to_pylist() == [[1, 1], [1, 1]]
    scalar = outputs_to_arrow([np.ones((2, 1), "float32")], ONE)
    assert scalar.type == pa.float32()


@pytest.mark.parametrize("col", [
    pa.array([None, None], pa.list_(pa.float32())),
    pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float32())),
    pa.array([[[1.0, 2.0]], None], pa.list_(pa.list_(pa.float64()))),
    pa.array([[1.0, float("nan"), 2.0]], pa.list_(pa.float32())),
    pa.array([None, None], pa.float64()),
    vector_struct([None, {"type": 1, "size": None, "indices": None, "values": [1.0]}]),
], ids=["all null", "all misshapen", "nested", "nan", "scalar nulls", "vectors"])
def test_null_policy_on_a_batch_with_no_valid_row(col):
    """Every row invalid: empty inputs of the model's shape, every prediction null."""
    sig = ONE if pa.types.is_list(col.type) or pa.types.is_struct(col.type) else \
        Signature((TensorSpec("x", (), "float32"),), ONE.outputs, None, None)
    (x,), invalid = inputs([col], sig=sig, on_invalid="null")
    assert x.shape == (0, *sig.inputs[0].shape) and x.dtype == np.float32
    assert invalid.all() and len(invalid) == len(col)
    assert outputs_to_arrow([np.zeros((0, 1), "float32")], ONE, invalid).to_pylist() == [None] * len(col)
    multi = outputs_to_arrow([np.zeros((0, 1)), np.zeros((0, 2))], MULTI_OUT, invalid)
    assert multi.to_pylist() == [None] * len(col)


def test_empty_batch_still_checks_the_column_type():
    (x,), invalid = inputs([pa.array([], pa.list_(pa.float32()))])
    assert x.shape == (0, 3) and invalid is None
    with pytest.raises(ModelInputError, match="column 'c0' holds arrays of string"):
        inputs([pa.array([], pa.list_(pa.string()))])


MISSHAPEN_VECTORS = [
    {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},   # good, dense
    {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0]},        # dense, too short
    {"type": 0, "size": 3, "indices": [1], "values": [5.0]},                 # good, sparse
    {"type": 0, "size": 4, "indices": [0], "values": [1.0]},                 # sparse, wrong size
    {"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0, 4.0]},  # dense, too long
    {"type": 0, "size": 3, "indices": [3], "values": [1.0]},                 # index outside 0..2
    None,
]


def test_misshapen_vectors_in_both_policies():
    col = vector_struct(MISSHAPEN_VECTORS)
    (x,), invalid = inputs([col], on_invalid="null")
    np.testing.assert_array_equal(invalid, [False, True, False, True, True, True, True])
    np.testing.assert_array_equal(x, [[1, 2, 3], [0, 5, 0]])
    with pytest.raises(ModelInputError, match="dense vector at row 1.*2 values.*3 features"):
        inputs([col.slice(0, 6)], names=["v"])
    with pytest.raises(ModelInputError, match=r"index outside 0..2.*\(2 invalid row"):
        inputs([col.slice(5)], names=["v"])
    with pytest.raises(ModelInputError, match="null.*row 0"):
        inputs([col.slice(6)], names=["v"])
    with pytest.raises(ModelInputError, match="sparse vector at row 0.*size 4"):
        inputs([col.slice(3, 1)])


# --- every input kind through one engine ------------------------------------------------

TWO_IN = Signature((TensorSpec("t1", (4,), "float32"), TensorSpec("t2", (3,), "float32")),
                   ONE.outputs, ("t1", "t2"), None)


def test_struct_fields_are_stacked_for_a_single_input():
    s = pa.StructArray.from_arrays([pa.array([1.0, 4.0]), pa.array([2, 5]), pa.array([3.0, 6.0])],
                                   names=["a", "b", "c"])
    (x,), invalid = inputs([s])
    np.testing.assert_array_equal(x, [[1, 2, 3], [4, 5, 6]])
    null_row = pa.StructArray.from_arrays(s.flatten(), names=["a", "b", "c"],
                                          mask=pa.array([False, True]))
    (x,), invalid = inputs([null_row], on_invalid="null")
    np.testing.assert_array_equal(invalid, [False, True])
    np.testing.assert_array_equal(x, [[1, 2, 3]])


def test_struct_fields_match_named_inputs_in_any_order():
    t1 = pa.array([[1, 2, 3, 4]], pa.list_(pa.float64()))
    t2 = pa.array([[5, 6, 7]], pa.list_(pa.float64()))
    s = pa.StructArray.from_arrays([t2, t1], names=["t2", "t1"])
    (a, b), _ = inputs([s], sig=TWO_IN)
    np.testing.assert_array_equal(a, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(b, [[5, 6, 7]])
    positional = pa.StructArray.from_arrays([t1, t2], names=["x", "y"])
    (a, b), _ = inputs([positional], sig=TWO_IN)
    np.testing.assert_array_equal(b, [[5, 6, 7]])
    with pytest.raises(ModelInputError, match=r"3 column\(s\).*2 inputs"):
        inputs([pa.StructArray.from_arrays([t1, t2, t2], names=["x", "y", "z"])], sig=TWO_IN)


def test_numpy_adapter_is_zero_copy_and_checks_rows():
    from spark_keras.inference.columns import from_numpy

    x = np.arange(12, dtype="float32").reshape(4, 3)
    (got,), invalid = model_inputs(from_numpy(x, ONE), ONE)
    assert invalid is None and np.shares_memory(got, x)
    x[2, 1] = np.nan
    with pytest.raises(ModelInputError, match=r"column 'x': NaN.*row 2 of this batch"):
        model_inputs(from_numpy(x, ONE), ONE)
    (got,), invalid = model_inputs(from_numpy(x, ONE), ONE, "null")
    np.testing.assert_array_equal(invalid, [False, False, True, False])
    ragged = np.array([[1.0, 2.0, 3.0], None, [1.0, 2.0]], dtype=object)
    (got,), invalid = model_inputs(from_numpy(ragged, ONE), ONE, "null")
    np.testing.assert_array_equal(invalid, [False, True, True])
    with pytest.raises(ModelInputError, match=r"inputs \['t2'\] missing"):
        from_numpy({"t1": np.zeros((1, 4))}, TWO_IN)
    with pytest.raises(ModelInputError, match=r"different lengths.*'t1' has 2 rows.*'t2' has 1"):
        model_inputs(from_numpy([np.zeros((2, 4)), np.zeros((1, 3))], TWO_IN), TWO_IN)


def test_pandas_and_rows_adapters_give_the_same_inputs():
    import pandas as pd

    from spark_keras.inference.columns import from_frame, from_rows

    rows = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    want, _ = model_inputs(from_arrow(["f"], [pa.array(rows)]), ONE)
    frame = pd.DataFrame({"f": [np.array(r) for r in rows]})
    got, _ = model_inputs(from_frame(frame, None, ONE), ONE)
    np.testing.assert_array_equal(got[0], want[0])
    scalars = pd.DataFrame(rows, columns=["a", "b", "c"])
    got, _ = model_inputs(from_frame(scalars, None, ONE), ONE)
    np.testing.assert_array_equal(got[0], want[0])
    got, _ = model_inputs(from_rows(rows, ONE), ONE)
    np.testing.assert_array_equal(got[0], want[0])
    with pytest.raises(ModelInputError, match="null.*row 11 of this partition"):
        model_inputs(from_rows([rows[0], None], ONE, first_row=10), ONE, where="partition",
                     first_row=10)


def test_a_block_of_pandas_number_columns_still_names_the_column_at_fault():
    import pandas as pd

    from spark_keras.inference.columns import from_frame

    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [4.0, np.nan, 6.0], "c": [7, 8, 9]})
    columns = from_frame(frame, None, ONE)
    assert len(columns) == 1 and columns[0].parts == ("a", "b", "c")  # read as one block
    with pytest.raises(ModelInputError, match=r"column 'b': NaN or infinite value\(s\), first at "
                                              r"row 1 of this batch"):
        model_inputs(columns, ONE)
    (x,), invalid = model_inputs(columns, ONE, "null")
    np.testing.assert_array_equal(invalid, [False, True, False])
    np.testing.assert_array_equal(x, [[1, 4, 7], [3, 6, 9]])
    (x,), _ = model_inputs(from_frame(frame, ["c", "a", "c"], ONE), ONE)  # any order, repeats
    np.testing.assert_array_equal(x, [[7, 1, 7], [8, 2, 8], [9, 3, 9]])


@pytest.mark.parametrize("dtype", ["Int64", "Float32"])
def test_pandas_nullable_columns_hold_nulls_not_nan(dtype):
    import pandas as pd

    from spark_keras.inference.columns import from_frame

    frame = pd.DataFrame({"a": [1, 2, 3], "b": [4, None, 6], "c": [7, 8, 9]}).astype(dtype)
    with pytest.raises(ModelInputError, match=r"column 'b': null value\(s\), first at row 1"):
        model_inputs(from_frame(frame, None, ONE), ONE)
    (x,), invalid = model_inputs(from_frame(frame, None, ONE), ONE, "null")
    np.testing.assert_array_equal(invalid, [False, True, False])
    np.testing.assert_array_equal(x, [[1, 4, 7], [3, 6, 9]])
    single = Signature((TensorSpec("x", (1,), "float32"),), ONE.outputs, None, None)
    with pytest.raises(ModelInputError, match=r"column 'b': null value\(s\), first at row 1"):
        model_inputs(from_frame(frame, "b", single), single)


def test_integer_column_labels_index_the_frame_by_their_own_labels():
    import pandas as pd

    from spark_keras.inference.columns import from_frame

    data = np.arange(6, dtype="float32").reshape(2, 3)
    for frame in (pd.DataFrame(data), pd.DataFrame(data).astype(object).astype("float64")):
        (x,), _ = model_inputs(from_frame(frame, None, ONE), ONE)
        np.testing.assert_array_equal(x, data)
    frame = pd.DataFrame(data)
    (x,), _ = model_inputs(from_frame(frame, [2, 1, 0], ONE), ONE)
    np.testing.assert_array_equal(x, data[:, ::-1])
    with pytest.raises(ModelInputError, match=r"column\(s\) \['7'\] not in the data"):
        from_frame(frame, [0, 1, 7], ONE)


def test_one_invalid_wide_row_does_not_multiply_peak_memory():
    import tracemalloc

    rows, size = 256, 50_000
    sig = Signature((TensorSpec("x", (size,), "float32"),), ONE.outputs, None, None)
    values = pa.array(np.ones(rows * size, dtype="float32"))
    offsets = np.arange(rows + 1, dtype=np.int32) * size
    offsets[-1] = offsets[-2]  # the last row is empty (and null): invalid
    mask = pa.array([False] * (rows - 1) + [True])
    col = pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)
    result_bytes = (rows - 1) * size * 4
    tracemalloc.start()
    try:
        (x,), invalid = inputs([col], sig, on_invalid="null")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert x.shape == (rows - 1, size) and invalid.sum() == 1 and (x == 1).all()
    assert peak < 1.5 * result_bytes, f"peak {peak / 2**20:.0f} MiB for a {result_bytes / 2**20:.0f} MiB result"


SEQ = Signature((TensorSpec("seq", (None, 3), "float32"),), ONE.outputs, None, None)


def test_rows_of_unknown_length_keep_their_own_shapes():
    rows = [np.arange(3 * k, dtype="float32").reshape(k, 3) for k in (2, 1, 2, 4)]
    nested = pa.array([r.tolist() for r in rows])
    flat = pa.array([r.reshape(-1).tolist() for r in rows], pa.list_(pa.float64()))
    for col in (nested, flat, nested.slice(1), flat.slice(1)):
        (x,), invalid = inputs([col], SEQ)
        assert invalid is None and x.dtype == object
        expected = rows[len(rows) - len(col):]
        for got, want in zip(x, expected):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("col, pattern", [
    (pa.array([[[1.0, 2, 3], [1.0, 2]]]), r"row 1 of this batch is not rectangular"),
    (pa.array([[1.0, 2, 3, 4]]), r"row 1 of this batch has 4 values at nesting level 0 where "
                                 r"the model input takes a non-empty multiple of 3"),
    (pa.array([[]], pa.list_(pa.list_(pa.float32()))), r"has 0 values at nesting level 0 where "
                                                       r"the model input takes a non-empty array"),
    (pa.array([[[1.0, 2]]]), r"has 2 values at nesting level 1 where the model input takes 3"),
    (pa.array([None], pa.list_(pa.list_(pa.float32()))), r"null value\(s\)"),
    (pa.array([[[1.0, None, 3]]]), r"null array element"),
])
def test_bad_rows_of_unknown_length(col, pattern):
    good = pa.array([[1.0, 2, 3]] if not pa.types.is_list(col.type.value_type) else [[[1.0, 2, 3]]],
                    col.type)
    with pytest.raises(ModelInputError, match=r"column 'c0': .*" + pattern):
        inputs([pa.concat_arrays([good, col])], SEQ)
    (x,), invalid = inputs([pa.concat_arrays([good, col])], SEQ, on_invalid="null")
    assert invalid.tolist() == [False, True] and len(x) == 1


def test_vectors_for_an_input_of_unknown_length():
    sig = Signature((TensorSpec("x", (None,), "float32"),), ONE.outputs, None, None)
    (x,), _ = inputs([vector_struct([{"type": 1, "size": None, "indices": None, "values": [1.0, 2.0]}])], sig)
    np.testing.assert_array_equal(x[0], [1, 2])
    sparse = vector_struct([{"type": 0, "size": 3, "indices": [2], "values": [7.0]}])
    with pytest.raises(ModelInputError, match=r"column 'c0': ML Vectors, sparse or null .*'x'.*array column"):
        inputs([sparse], sig)


def test_two_unknown_dimensions_need_nested_arrays():
    sig = Signature((TensorSpec("img", (None, None, 3), "float32"),), ONE.outputs, None, None)
    with pytest.raises(ModelInputError, match="give each unknown dimension its own level"):
        inputs([pa.array([[1.0, 2, 3]])], sig)


def test_spark_image_rows_bgr_to_rgb_and_bad_rows():
    bgr = np.arange(2 * 2 * 3, dtype=np.uint8)
    rows = [{"origin": "a", "height": 2, "width": 2, "nChannels": 3, "mode": 16, "data": bgr.tobytes()},
            {"origin": "b", "height": 2, "width": 2, "nChannels": 3, "mode": 16, "data": bgr.tobytes()[:5]},
            {"origin": "c", "height": 2, "width": 2, "nChannels": 3, "mode": 21, "data": bgr.tobytes()},
            None]
    col = pa.array(rows, pa.struct([("origin", pa.string()), ("height", pa.int32()), ("width", pa.int32()),
                                    ("nChannels", pa.int32()), ("mode", pa.int32()), ("data", pa.binary())]))
    sig = Signature((TensorSpec("img", (2, 2, 3), "float32"),), ONE.outputs, None, None)
    (x,), invalid = inputs([col], sig, on_invalid="null")
    assert invalid.tolist() == [False, True, True, True]
    np.testing.assert_array_equal(x[0], bgr.reshape(2, 2, 3)[..., ::-1])
    for sliced, pattern in [(col.slice(1, 1), "has 5 data bytes for 2 x 2 x 3"),
                            (col.slice(2, 1), "has mode 21 with 3 channel"),
                            (col.slice(3, 1), "null image")]:
        with pytest.raises(ModelInputError, match=pattern):
            inputs([sliced], sig)


@pytest.mark.parametrize("module", ["spark_keras.inference", "spark_keras.inference.predictor",
                                    "spark_keras.spark.broadcast"])
def test_importing_the_engine_package_leaves_pyarrow_unloaded(module):
    """The Spark worker daemon imports spark_keras before it may let pyarrow start Arrow's
    allocator thread: the package, the predictor and BroadcastModel's module load pyarrow
    only once a batch is read (``engine`` and the rest, imported by module)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    code = f"import sys, {module}; print(sorted(m for m in ('pyarrow', 'pandas') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=root)).stdout
    assert out.strip() == "[]", (module, out)
