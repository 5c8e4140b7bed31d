"""Rows that make the model or the preprocess function raise, isolated by the engine
(real Keras models, no Spark): the failing rows null with a reason, every other row
equal to the model on the good rows alone."""

from __future__ import annotations

import types

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from spark_keras.errors import ModelCallError, ModelInputError, PreprocessError
from spark_keras.inference import isolation
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.predictor import Predictor
from spark_keras.inference.preprocess import Preprocess
from tests import models


def handle(model, preprocess=None):
    """What the engine needs of a handle: a predictor (and a preprocess function)."""
    return types.SimpleNamespace(predictor=Predictor(model), preprocess=Preprocess.of(preprocess))


def scored(h, name, array, **kw):
    kw.setdefault("batch_size", 64)
    return score(h, from_arrow([name], [array]), **kw)


def full(out, invalid):
    """The valid rows' outputs put back at their positions (NaN elsewhere)."""
    rows = np.full((len(invalid), *out.shape[1:]), np.nan)
    rows[~invalid] = out
    return rows


@pytest.fixture(scope="module")
def png_case():
    model = models.image_bytes_model()
    images = models.png_bytes(40)
    bad = [3, 17, 39]
    data = [b"not a png" if i in bad else b for i, b in enumerate(images)]
    return model, data, bad, images


def test_corrupt_png_decoded_in_the_graph_is_isolated(png_case):
    model, data, bad, images = png_case
    out = scored(handle(model), "content", pa.array(data, pa.binary()), on_invalid="null",
                 reasons=True, batch_size=16)
    assert out.rows == 40 and np.flatnonzero(out.invalid).tolist() == bad
    good = [b for i, b in enumerate(images) if i not in bad]
    expected = model(np.array(good, dtype=object), training=False).numpy()
    np.testing.assert_allclose(out.outputs[0], expected, atol=1e-5)
    for i in bad:
        assert out.reasons[i].startswith("model: InvalidArgumentError: "), out.reasons[i]
        assert "image" in out.reasons[i].lower() and len(out.reasons[i]) <= isolation.REASON_CHARS
    assert all(out.reasons[i] is None for i in range(40) if i not in bad)


def test_a_failing_tf_assert_is_isolated():
    model = models.asserting_mlp(limit=10.0)
    x = np.random.default_rng(0).uniform(0, 5, (300, 4)).astype("float32")
    x[[0, 150, 299], 2] = 50.0
    col = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 4)
    out = scored(handle(model), "features", col, on_invalid="null", reasons=True, batch_size=128)
    assert np.flatnonzero(out.invalid).tolist() == [0, 150, 299]
    np.testing.assert_allclose(out.outputs[0], model(np.delete(x, [0, 150, 299], 0)).numpy(),
                               atol=1e-5)
    assert "value over the limit" in out.reasons[150] and out.reasons[150].startswith("model: ")


def test_a_gather_out_of_range_on_a_long_sequence_is_isolated():
    model = models.positional_model(max_length=16)
    rng = np.random.default_rng(1)
    lengths = [3, 16, 17, 5, 40, 8]
    rows = [rng.integers(1, 9, n).tolist() for n in lengths]
    out = scored(handle(model), "tokens", pa.array(rows, pa.list_(pa.int32())),
                 on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [2, 4]
    for got, row in zip(out.outputs[0], [r for r, n in zip(rows, lengths) if n <= 16]):
        np.testing.assert_allclose(got, model(np.array([row], "int32")).numpy()[0], atol=1e-5)
    assert "is not in [0, 16)" in out.reasons[4]


def test_preprocess_raising_on_some_rows_is_isolated():
    model = models.mlp(n_features=3)

    def features(batch: pd.DataFrame) -> np.ndarray:
        if (batch["v"] < 0).any():
            raise ValueError(f"negative value in rows {batch.index[batch['v'] < 0].tolist()}")
        return np.stack([batch["v"], batch["v"] * 2, batch["v"] ** 2], axis=1).astype("float32")

    v = np.linspace(0.0, 1.0, 1000)
    v[[10, 777]] = -1.0
    out = scored(handle(model, features), "v", pa.array(v), on_invalid="null", reasons=True)
    assert out.rows == 1000 and np.flatnonzero(out.invalid).tolist() == [10, 777]
    good = np.delete(v, [10, 777])
    expected = model(np.stack([good, good * 2, good ** 2], 1).astype("float32")).numpy()
    np.testing.assert_allclose(out.outputs[0], expected, atol=1e-5)
    assert out.reasons[777].startswith("preprocess: ValueError: negative value"), out.reasons[777]


def test_preprocess_rows_invalid_by_the_checks_keep_their_own_reason():
    model = models.mlp(n_features=3)

    def features(batch):
        if (batch["v"] < 0).any():
            raise ValueError("negative")
        x = np.stack([batch["v"]] * 3, axis=1).astype("float32")
        x[batch["v"].to_numpy() > 0.99] = np.nan  # a row the engine's checks refuse
        return x

    v = np.linspace(0.0, 1.0, 50)
    v[5] = -1
    out = scored(handle(model, features), "v", pa.array(v), on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [5, 49]
    assert out.reasons[5].startswith("preprocess: ValueError") and "NaN" in out.reasons[49]


def test_on_invalid_error_names_the_row_the_column_and_the_model_message(png_case):
    model, data, bad, _ = png_case
    with pytest.raises(ModelCallError) as info:
        scored(handle(model), "content", pa.array(data, pa.binary()), batch_size=16,
               first_row=100, where="partition")
    first = str(info.value).splitlines()[0]
    assert "column 'content'" in first and "row 103 of this partition" in first, first
    assert "InvalidArgumentError" in first and "image" in first.lower()


def test_on_invalid_error_names_the_row_the_preprocess_function_raised_on():
    model = models.mlp(n_features=3)

    def features(batch):
        if (batch["v"] < 0).any():
            raise ValueError("negative value")
        return np.stack([batch["v"]] * 3, axis=1).astype("float32")

    v = np.ones(500)
    v[321] = -1
    with pytest.raises(PreprocessError, match=r"row 321 of this batch.*ValueError: negative value"):
        scored(handle(model, features), "v", pa.array(v))


def test_a_model_that_fails_on_every_row_nulls_every_row_under_null():
    model = models.asserting_mlp(limit=-1.0)
    col = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(40, "float32")), 4)
    out = scored(handle(model), "features", col, on_invalid="null", reasons=True)
    assert out.invalid.all() and out.outputs[0].shape == (0, 1)
    assert all(r.startswith("model: InvalidArgumentError") for r in out.reasons)


def test_clean_batches_are_not_retried():
    calls = []
    model = models.mlp(n_features=3)
    predictor = Predictor(model)
    inner = predictor._call
    predictor._call = lambda arrays: calls.append(len(arrays[0])) or inner(arrays)
    h = types.SimpleNamespace(predictor=predictor, preprocess=None)
    x = np.ones((300, 3), "float32")
    out = scored(h, "f", pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 3),
                 on_invalid="null", batch_size=100)
    assert calls == [100, 100, 100] and out.invalid is None


def _search_counting_calls(n, bad, split):
    """isolate over rows 0..n-1 of a call raising on any range holding a ``bad`` row."""
    calls = []

    def call(ranges):
        rows = [r for a, b in ranges for r in range(a, b)]
        calls.append(len(ranges))
        if bad.intersection(rows):
            raise ValueError(f"bad rows {sorted(bad.intersection(rows))}")
        return rows

    def cut(rows, sizes):
        bounds = np.cumsum([0, *sizes])
        return [rows[a:b] for a, b in zip(bounds, bounds[1:])]

    found = isolation.isolate(call, 0, n, ValueError("the whole batch"), split=cut if split else None)
    return found, calls


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_the_search_finds_exactly_the_failing_rows_and_calls_every_other_row_once(seed, split):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 1500))
    bad = set(rng.choice(n, size=int(rng.integers(0, min(n, 9) + 1)), replace=False).tolist())
    found, calls = _search_counting_calls(n, bad, split)
    assert set(found.failures) == bad
    # each failure is the exception of its row called alone (the batch's, for a batch of one)
    assert {r: str(e) for r, e in found.failures.items()} == \
        {r: "the whole batch" if n == 1 else f"bad rows [{r}]" for r in bad}
    scored_rows = [r for a, b, rows in found.parts for r in rows]
    assert scored_rows == [r for r in range(n) if r not in bad]  # in order, each once
    assert all(rows == list(range(a, b)) for a, b, rows in found.parts)
    if not split:
        assert set(calls) <= {1}  # one range per call without a split


def test_one_failing_row_among_1024_takes_about_log2_calls():
    """Pieces set aside are called together: 10 halvings and one call for the rest (one
    call per piece instead costs ~15), since each call's fixed cost dominates the search."""
    for row in (0, 1, 511, 700, 1023):
        found, calls = _search_counting_calls(1024, {row}, True)
        assert set(found.failures) == {row} and len(calls) <= 12, (row, len(calls))


def test_isolation_reason_texts():
    class Op(Exception):
        message = ("Graph execution error:\n\nDetected at node DecodePng defined at (most "
                   "recent call last):\n  File \"x.py\", line 4, in f\n\nInvalid PNG. Failed to "
                   "initialize decoder\n\t [[{{node DecodePng}}]] [Op:__inference_call_61]")

    assert isolation.reason("model", Op()) == \
        "model: Op: Invalid PNG. Failed to initialize decoder"
    assert isolation.reason("preprocess", KeyError()) == "preprocess: KeyError"
    long = isolation.reason("model", ValueError("x" * 500))
    assert len(long) == isolation.REASON_CHARS and long.endswith("...")


def test_input_errors_are_not_taken_for_row_failures():
    model = models.mlp(n_features=3)
    with pytest.raises(ModelInputError, match="column 's'"):
        scored(handle(model), "s", pa.array(["a", "b"]), on_invalid="null")


@pytest.mark.slow  # two spawned pools
def test_pool_predict_isolates_rows_across_its_processes():
    from spark_keras.multiprocessing import pool_predict

    model = models.asserting_mlp(limit=10.0)
    x = np.random.default_rng(2).uniform(0, 5, (400, 4)).astype("float32")
    x[[7, 390], 1] = 99.0
    x[100, 0] = np.nan  # invalid by the checks, before the model
    out = pool_predict(model, x, processes=2, batch_size=64, on_invalid="null")
    assert np.flatnonzero(np.isnan(out[:, 0])).tolist() == [7, 100, 390]
    good = np.delete(np.arange(400), [7, 100, 390])
    np.testing.assert_allclose(out[good], model(x[good]).numpy(), atol=1e-5)
    with pytest.raises(ModelCallError, match=r"row 388 of this input.*value over the limit"):
        pool_predict(model, np.delete(x, [7, 100], 0), processes=2, batch_size=64)  # 390 - 2
