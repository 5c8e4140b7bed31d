"""Row isolation, the review's cases (real Keras models; Spark where it says so): a
preprocess function that edits its batch in place, a bucket whose every row raises beside a
per-step output, a preprocess that pads each call to its longest row, a string output
that is not UTF-8, and the bound on the search's work."""

from __future__ import annotations

import json
import types

import keras
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from keras import layers

import spark_keras as sk
from spark_keras.errors import ModelCallError, PreprocessError
from spark_keras.inference import isolation
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.outputs import to_arrow
from spark_keras.inference.predictor import Predictor
from spark_keras.inference.preprocess import Preprocess
from tests import models


def handle(model, preprocess=None):
    """What the engine needs of a handle: a predictor (and a preprocess function)."""
    return types.SimpleNamespace(predictor=Predictor(model), preprocess=Preprocess.of(preprocess))


def scored(h, name, array, **kw):
    kw.setdefault("batch_size", 1024)
    return score(h, from_arrow([name], [array]), **kw)


# --- 1. a preprocess function that edits its batch in place ------------------------------------

def scale_in_place(batch: pd.DataFrame) -> np.ndarray:
    """``batch["x"] = batch["x"] / 10`` (the usual pandas idiom), raising on a negative."""
    batch["x"] = batch["x"] / 10
    if (batch["x"] < 0).any():
        raise ValueError(f"negative x in rows {batch.index[batch['x'] < 0].tolist()}")
    return np.stack([batch["x"]] * 3, axis=1).astype("float32")


def shift_in_place(batch: pd.DataFrame) -> np.ndarray:
    """``batch["x"] = batch["x"] - 1``, then a check for negatives: a row given this
    twice turns negative."""
    batch["x"] = batch["x"] - 1
    if (batch["x"] < 0).any():
        raise ValueError("x below 1")
    return np.stack([batch["x"]] * 3, axis=1).astype("float32")


def _in_place_case():
    x = np.linspace(1.5, 1.9, 64)  # x - 1 twice: negative; x / 100: near 0
    x[37] = 0.5
    return x


def _expected(model, features):
    return model(np.stack([features] * 3, axis=1).astype("float32"), training=False).numpy()


@pytest.mark.parametrize("fn, made", [(scale_in_place, lambda x: x / 10),
                                      (shift_in_place, lambda x: x - 1)],
                         ids=["x / 10", "x - 1"])
def test_a_preprocess_editing_its_batch_in_place_sees_the_rows_as_read(fn, made):
    model = models.mlp(n_features=3)
    x = _in_place_case()
    x[37] = -1.0 if fn is scale_in_place else 0.5
    h = handle(model, fn)
    out = scored(h, "x", pa.array(x), on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [37]
    assert out.reasons[37].startswith("preprocess: ValueError: "), out.reasons[37]
    np.testing.assert_allclose(out.outputs[0], _expected(model, made(np.delete(x, 37))), atol=1e-5)
    with pytest.raises(PreprocessError) as info:
        scored(h, "x", pa.array(x))
    assert str(info.value).startswith(f"the preprocess function {h.preprocess.name} raised on "
                                      f"row 37 of this batch (column 'x'): ValueError: "), info.value


def test_a_preprocess_editing_struct_cells_in_place_sees_the_rows_as_read():
    """pandas holds a struct column's rows as dicts, which a copied frame would share."""
    model = models.mlp(n_features=3)

    def shift_cells(batch):
        for cell in batch["s"]:
            cell["x"] -= 1
        x = np.array([cell["x"] for cell in batch["s"]])
        if (x < 0).any():
            raise ValueError("x below 1")
        return np.stack([x] * 3, axis=1).astype("float32")

    x = _in_place_case()
    column = pa.StructArray.from_arrays([pa.array(x)], names=["x"])
    out = scored(handle(model, shift_cells), "s", column, on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [37]
    np.testing.assert_allclose(out.outputs[0], _expected(model, np.delete(x, 37) - 1), atol=1e-5)


def shift_cells(batch: pd.DataFrame) -> np.ndarray:
    """Each cell of the list column ``v`` shifted in place (``cell -= 1``; of a nested list,
    its steps replaced in the cell), raising on a negative."""
    cells = list(batch["v"])
    for cell in cells:
        if cell.dtype == object:
            cell[:] = [step - 1.0 for step in cell]
        else:
            cell -= 1.0
    x = np.stack([np.stack(list(c)).ravel() if c.dtype == object else c for c in cells])
    if (x < 0).any():
        raise ValueError("v below 1")
    return x.astype("float32")


@pytest.mark.parametrize("nested", [False, True], ids=["list<double>", "list<list<double>>"])
def test_a_preprocess_editing_array_cells_in_place_sees_the_rows_as_read(nested):
    """Row 37 holds a null element, so pandas gets every cell of ``v`` as a writeable copy
    (else read-only views of Arrow's buffers); a nested list's cells are object arrays."""
    model = models.mlp(n_features=3)
    x = np.random.default_rng(0).uniform(1.5, 1.9, (64, 3))
    rows = x.tolist()
    rows[37] = [0.5, None, 1.7]  # the bad row: negative once shifted
    kind = pa.list_(pa.float64())
    if nested:
        rows, kind = [[[v] for v in row] for row in rows], pa.list_(kind)
    h = handle(model, shift_cells)
    out = scored(h, "v", pa.array(rows, kind), on_invalid="null", reasons=True, batch_size=64)
    assert np.flatnonzero(out.invalid).tolist() == [37]
    assert out.reasons[37] == "preprocess: ValueError: v below 1", out.reasons[37]
    want = model((np.delete(x, 37, axis=0) - 1).astype("float32"), training=False).numpy()
    np.testing.assert_allclose(out.outputs[0], want, atol=1e-5)
    with pytest.raises(PreprocessError, match=r"raised on row 37 of this batch \(column 'v'\): "
                                              r"ValueError: v below 1"):
        scored(h, "v", pa.array(rows, kind))


def test_transform_with_an_in_place_preprocess_scores_the_rows_as_read(spark):
    model = models.mlp(n_features=3)
    x = _in_place_case()
    df = spark.createDataFrame([(i, float(v)) for i, v in enumerate(x)], "id long, x double") \
        .coalesce(1)
    bm = sk.BroadcastModel(spark, model, preprocess=shift_in_place)
    try:
        rows = sorted(bm.transform(df, "x", on_invalid="null", error_col="error").collect())
        assert [r.id for r in rows if r.prediction is None] == [37]
        assert rows[37].error.startswith("preprocess: ValueError: x below 1"), rows[37].error
        assert all(r.error is None for r in rows if r.id != 37)
        got = np.array([r.prediction for r in rows if r.id != 37], dtype="float32")
        np.testing.assert_allclose(got, _expected(model, np.delete(x, 37) - 1).ravel(), atol=1e-5)
        with pytest.raises(Exception) as info:
            bm.transform(df, "x").collect()
        assert "PreprocessError: the preprocess function tests.inference.test_isolation_edge_cases." \
               "shift_in_place raised on row 37 of this batch (column 'x'): ValueError: x below 1" \
               in str(info.value), str(info.value)[:3000]
    finally:
        bm.destroy()


# --- 2. buckets, a per-step output, a bucket whose every row raises ----------------------------

def asserting_tagger(limit: float = 10.0) -> keras.Model:
    """A masked GRU scoring every step of a sequence of any length, raising (in its graph)
    on a row holding a value of ``limit`` or more."""
    keras.utils.set_random_seed(9)
    inp = keras.Input((None, 3), name="sequence")
    x = layers.Masking(0.0)(models.AssertBelow(limit)(inp))
    return keras.Model(inp, layers.Dense(2)(layers.GRU(4, return_sequences=True)(x)),
                       name="asserting_tagger")


def test_a_bucket_whose_every_row_raises_beside_a_per_step_output():
    import tensorflow as tf

    model = asserting_tagger()
    rng = np.random.default_rng(4)
    lengths = np.r_[rng.integers(2, 6, 20), [30, 31, 33]]  # the long rows: one bucket
    rows = [rng.standard_normal((int(k), 3)).astype("float32") for k in lengths]
    for r in rows[20:]:
        r[1, 2] = 50.0  # each long row raises
    column = pa.array([r.tolist() for r in rows], pa.list_(pa.list_(pa.float32())))
    h = handle(model)
    out = scored(h, "sequence", column, on_invalid="null", reasons=True, buckets=2)
    assert np.flatnonzero(out.invalid).tolist() == [20, 21, 22]
    assert all(out.reasons[i].startswith("model: InvalidArgumentError") for i in (20, 21, 22))
    alone = tf.function(lambda x: model(x, training=False))
    assert len(out.outputs[0]) == 20
    for got, row in zip(out.outputs[0], rows[:20]):
        np.testing.assert_allclose(got, alone(row[None]).numpy()[0], atol=1e-5)
    with pytest.raises(ModelCallError, match=r"the model raised on row 20 of this batch"):
        scored(h, "sequence", column, buckets=2)


@pytest.mark.parametrize("buckets", [1, None], ids=["buckets=1", "no buckets"])
def test_a_chunk_whose_every_row_raises_beside_a_chunk_that_does_not(buckets):
    """``batch_size`` 4 cuts one group of 8 rows in two chunks: the first one's rows all
    raise, so only the second's call tells the per-step output's shape."""
    import tensorflow as tf

    model = asserting_tagger()
    rng = np.random.default_rng(4)
    rows = [rng.standard_normal((5, 3)).astype("float32") for _ in range(8)]
    for r in rows[:4]:
        r[1, 2] = 50.0  # rows 0-3 raise
    column = pa.array([r.tolist() for r in rows], pa.list_(pa.list_(pa.float32())))
    out = scored(handle(model), "sequence", column, on_invalid="null", reasons=True, batch_size=4,
                 buckets=buckets)
    assert np.flatnonzero(out.invalid).tolist() == [0, 1, 2, 3]
    alone = tf.function(lambda x: model(x, training=False))
    assert len(out.outputs[0]) == 4
    for got, row in zip(out.outputs[0], rows[4:]):
        np.testing.assert_allclose(got, alone(row[None]).numpy()[0], atol=1e-5)


# --- 3. a preprocess that pads each call to its longest row ------------------------------------

WORDS = {w: i for i, w in enumerate("the cat sat on mat a dog ran in park birds sing".split(), 1)}


def tokens_padded(batch: pd.DataFrame) -> np.ndarray:
    """Word ids padded to the longest text of this call (``keras.utils.pad_sequences``):
    a None text raises."""
    return keras.utils.pad_sequences([[WORDS[w] for w in t.split()] for t in batch["text"]])


def test_a_preprocess_padding_each_call_to_its_longest_row_is_stitched():
    model = models.attention_model(vocabulary=len(WORDS) + 1)
    texts = ["the cat sat on the mat", "a dog", "birds sing", None,
             "the dog ran in the park", "a cat", "sat"] * 3
    out = scored(handle(model, tokens_padded), "text", pa.array(texts), on_invalid="null",
                 reasons=True)
    bad = [i for i, t in enumerate(texts) if t is None]
    assert np.flatnonzero(out.invalid).tolist() == bad
    assert out.reasons[3].startswith("preprocess: AttributeError: "), out.reasons[3]
    good = [t for t in texts if t is not None]
    expected = [model(np.array([[WORDS[w] for w in t.split()]], "int32"), training=False)
                .numpy()[0] for t in good]
    np.testing.assert_allclose(out.outputs[0], np.array(expected), atol=1e-5)


def parse_json(batch: pd.DataFrame) -> np.ndarray:
    """Features parsed from JSON text (``[1, 2, 3]``: int64 rows, ``[0.5, 2, 3]``: float64)."""
    return np.array([json.loads(t) for t in batch["j"]])


def test_preprocess_parts_of_different_number_types_are_stitched():
    """The search's parts that hold only integer rows come back int64, the one holding row
    10's float float64: one column of float64, the failed row null."""
    model = models.mlp(n_features=3)
    texts = ["[1, 2, 3]"] * 16
    texts[3], texts[10] = "[1, 2,", "[0.5, 2, 3]"
    out = scored(handle(model, parse_json), "j", pa.array(texts), on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [3]
    assert out.reasons[3].startswith("preprocess: JSONDecodeError: "), out.reasons[3]
    good = [json.loads(t) for i, t in enumerate(texts) if i != 3]
    want = model(np.array(good, "float32"), training=False).numpy()
    np.testing.assert_allclose(out.outputs[0], want, atol=1e-5)


def test_a_preprocess_part_of_a_type_that_goes_with_no_other_is_its_rows_failure():
    """Row 0 raises; the search's part of row 1 alone is text, the part of rows 2-3 numbers:
    row 1 is invalid, naming its type, and rows 2-3 are scored."""
    model = models.mlp(n_features=3)
    texts = ["[1, 2,", '["a", "b", "c"]', "[0.5, 2, 3]", "[1, 2, 3]"]
    h = handle(model, parse_json)
    out = scored(h, "j", pa.array(texts), on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [0, 1]
    assert out.reasons[1].startswith(
        f"preprocess: PreprocessError: the preprocess function {h.preprocess.name} made input "
        f"{h.predictor.signature.inputs[0].name!r} of type fixed_size_list<item: string>[3] "
        f"for these rows"), out.reasons[1]
    want = model(np.array([[0.5, 2, 3], [1, 2, 3]], "float32"), training=False).numpy()
    np.testing.assert_allclose(out.outputs[0], want, atol=1e-5)


# --- 4. a string output that is not UTF-8 ------------------------------------------------------

@keras.saving.register_keras_serializable(package="spark_keras_tests")
class FirstBytes(layers.Layer):
    """The first ``n`` bytes of each string: a character of several bytes cut in two
    leaves bytes that are not UTF-8."""

    def __init__(self, n: int = 3, **kwargs):
        super().__init__(**kwargs)
        self.n = n

    def call(self, x):
        import tensorflow as tf

        return tf.strings.substr(x, 0, self.n)

    def compute_output_spec(self, x):
        return keras.KerasTensor(x.shape, dtype="string")

    def get_config(self):
        return {**super().get_config(), "n": self.n}


def test_a_string_output_that_is_not_utf8_makes_only_its_row_invalid():
    inp = keras.Input((), dtype="string", name="text")
    model = keras.Model(inp, FirstBytes(3)(inp), name="first_bytes")
    texts = ["cats", "dogs", "ab\u00e9c", "birds", "\u00e9t\u00e9"]  # row 2: cut inside é
    h = handle(model)
    out = scored(h, "text", pa.array(texts), on_invalid="null", reasons=True)
    assert np.flatnonzero(out.invalid).tolist() == [2]
    assert out.reasons[2].startswith("model: ModelError: output ") and "UTF-8" in out.reasons[2], \
        out.reasons[2]
    assert to_arrow(out).to_pylist() == ["cat", "dog", None, "bir", "\u00e9t"]
    with pytest.raises(ModelCallError, match=r"^the model raised on row 2 of this batch "
                                             r"\(column 'text'\): ModelError: output .*UTF-8"):
        scored(h, "text", pa.array(texts))


# --- 5. the search's work is bounded ---------------------------------------------------------

def _composition_failure(n):
    """isolate over ``n`` rows of a call that raises on any call of more than one row."""
    calls, fed = [], []

    def call(ranges):
        rows = [r for a, b in ranges for r in range(a, b)]
        calls.append(len(rows))
        fed.append(len(rows))
        if len(rows) > 1:
            raise ValueError(f"{len(rows)} rows at once")
        return rows

    def cut(rows, sizes):
        bounds = np.cumsum([0, *sizes])
        return [rows[a:b] for a, b in zip(bounds, bounds[1:])]

    return isolation.isolate(call, 0, n, ValueError("the batch"), split=cut), calls, fed


@pytest.mark.parametrize("n", [1024, 100, 7])
def test_a_failure_of_every_multi_row_call_stays_within_the_search_bound(n):
    found, calls, fed = _composition_failure(n)
    assert sum(fed) <= isolation.SEARCH_BATCHES * n, (len(calls), sum(fed))
    scored_rows = [r for a, b, rows in found.parts for r in rows]
    assert sorted(scored_rows + list(found.failures)) == list(range(n))  # no row lost or twice
    stopped = [e for e in found.failures.values() if isinstance(e, isolation.SearchStopped)]
    assert len(stopped) == len(found.failures)  # no row raised alone: none is blamed for it
    for e in stopped:
        assert str(e).startswith(f"not tried alone: the search for the rows that raise stopped at "
                                 f"its bound ({isolation.SEARCH_BATCHES} times the {n} rows); "
                                 f"the batch raised ValueError: the batch"), str(e)


def test_the_search_bound_through_the_engine_both_ways():
    model = models.mlp(n_features=3)

    def one_row_at_a_time(batch):
        if len(batch) > 1:
            raise ValueError(f"{len(batch)} rows at once")
        return np.stack([batch["v"]] * 3, axis=1).astype("float32")

    v = np.linspace(0, 1, 512)
    h = handle(model, one_row_at_a_time)
    out = scored(h, "v", pa.array(v), on_invalid="null", reasons=True)
    assert out.rows == 512 and len(out.outputs[0]) == 512 - int(out.invalid.sum())
    stopped = np.flatnonzero(out.invalid)
    assert len(stopped) and all(out.reasons[i].startswith("preprocess: SearchStopped: not tried "
                                                          "alone") for i in stopped)
    ok = np.flatnonzero(~out.invalid)
    np.testing.assert_allclose(out.outputs[0], _expected(model, v[ok]), atol=1e-5)
    with pytest.raises(PreprocessError, match=r"raised on rows 0-511 of this batch \(column 'v'\): "
                                              r"ValueError: 512 rows at once"):
        scored(h, "v", pa.array(v))
