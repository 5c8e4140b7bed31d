"""``buckets``, without Spark: a batch's variable-length rows padded into a few lengths,
one model call per bucket. The bucket lengths chosen; each row's prediction the model's on
that row alone (a masked GRU, a Transformer-style model, per-step outputs, keras-hub's
padding mask); the calls and TensorFlow's traces bounded; the refusals; row isolation."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pyarrow as pa
import pytest
from keras import layers

from spark_keras.errors import ArgumentError, ModelCallError
from spark_keras.handle import ModelHandle
from spark_keras.inference.buckets import bucket_lengths, checked, fewest_steps, padding_share
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.options import FLAGS, check_buckets
from spark_keras.inference.predictor import Predictor

from . import models


def rows_of(lengths, seed: int = 0, ids: int | None = None) -> np.ndarray:
    """An object array of one row per length: (length, 3) floats, or token ids in [1, ids)."""
    rng = np.random.default_rng(seed)
    out = np.empty(len(lengths), dtype=object)
    out[:] = [rng.integers(1, ids, int(k)).astype("int32") if ids else
              rng.standard_normal((int(k), 3)).astype("float32") for k in lengths]
    return out


def alone(model, *inputs) -> list:
    """The model on each row alone (a batch of one), its outputs as numpy (in a
    ``tf.function``: an eager GRU takes a second a row)."""
    import tensorflow as tf

    call = tf.function(lambda x: model(x, training=False), reduce_retracing=True)
    got = []
    for row in zip(*inputs):
        out = call([r[None] for r in row] if len(row) > 1 else row[0][None])
        got.append({k: np.asarray(v)[0] for k, v in out.items()} if isinstance(out, dict)
                   else np.asarray(out)[0])
    return got


class Counted:
    """A predictor's compiled call, recording the shape of what each call is given."""

    def __init__(self, call) -> None:
        self.call, self.shapes = call, []

    def __call__(self, arrays):
        self.shapes.append(tuple(a.shape for a in arrays))
        return self.call(arrays)

    def __getattr__(self, name):
        return getattr(self.call, name)


def counted(model) -> tuple[Predictor, Counted]:
    predictor = Predictor(model)
    predictor.padding  # noqa: B018  (the probe's calls are not the batch's)
    predictor._call = calls = Counted(predictor._call)
    return predictor, calls


# --- the option and the bucket lengths -------------------------------------------------------

@pytest.mark.parametrize("given, want", [(None, None), (8, 8), (np.int64(3), 3), ([16, 32], (16, 32)),
                                         ((1,), (1,)), (np.array([4, 9]), (4, 9))])
def test_buckets_is_none_a_count_or_increasing_lengths(given, want):
    assert check_buckets(given) == want


@pytest.mark.parametrize("given", [0, -2, True, 2.5, "8", [], [32, 16], [8, 8], [0, 4], [4.0, 8.0]])
def test_other_buckets_are_refused_naming_the_option(given):
    with pytest.raises(ArgumentError, match=r"^buckets must be None, a count"):
        check_buckets(given)
    with pytest.raises(ArgumentError, match=r"^--buckets must be"):
        check_buckets(given, FLAGS)


def test_the_lengths_chosen_pad_the_fewest_steps():
    rng = np.random.default_rng(3)
    for _ in range(200):
        lengths = rng.integers(1, 20, rng.integers(1, 40))
        n = int(rng.integers(1, 6))
        got = bucket_lengths(lengths, n)
        assert (got >= lengths).all() and len(set(got.tolist())) <= n and got.max() == lengths.max()
        distinct = np.unique(lengths)
        fewest = min(sum(min(b for b in (*combo, distinct[-1]) if b >= k) for k in lengths)
                     for r in range(n) for combo in itertools.combinations(distinct[:-1], r))
        assert got.sum() == fewest, (lengths, n)
    # more distinct lengths than the programme weighs: still at most n, each row held
    many = rng.integers(1, 5000, 20_000)
    chosen = fewest_steps(many, 16)
    assert len(chosen) == 16 and chosen[-1] == many.max()
    assert (bucket_lengths(many, 16) >= many).all()
    assert padding_share(many, 16) < 0.065  # evenly spread: half a bucket (of 16) padded per row


def test_explicit_lengths_take_each_row_to_the_smallest_that_holds_it():
    lengths = np.array([3, 16, 17, 64, 70, 90, 1])
    np.testing.assert_array_equal(bucket_lengths(lengths, (16, 32, 64)), [16, 16, 32, 64, 90, 90, 16])
    assert padding_share(np.array([4, 4]), (4,)) == 0.0
    assert padding_share(np.array([2, 6]), 1) == pytest.approx(4 / 12)


# --- each row's own prediction ---------------------------------------------------------------

def test_a_masked_gru_gives_each_row_its_own_prediction_in_one_call_per_bucket():
    model = models.sequence_model(masking=True)
    predictor, calls = counted(model)
    lengths = np.random.default_rng(1).integers(1, 40, 300)
    rows = rows_of(lengths)
    rows[5][-2:] = 0.0  # a row's own trailing zeros are masked alone too
    want = np.array(alone(model, rows))
    got = predictor([rows], 1024, None, buckets=4)[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert len(calls.shapes) == 4  # 38 distinct lengths, 4 calls
    assert {s[0][1] for s in calls.shapes} == set(fewest_steps(lengths, 4).tolist())
    # smaller calls: each bucket's rows in calls of batch_size, never more lengths
    calls.shapes.clear()
    np.testing.assert_allclose(predictor([rows], 50, None, buckets=(8, 16, 32))[0], want, atol=1e-5)
    assert {s[0][1] for s in calls.shapes} == {8, 16, 32, 39} and max(s[0][0] for s in calls.shapes) <= 50
    # without buckets: one call per distinct length
    calls.shapes.clear()
    np.testing.assert_allclose(predictor([rows], 1024)[0], want, atol=1e-5)
    assert len(calls.shapes) == len(np.unique(lengths))
    # one concrete function for every shape fed: at most one per bucket shape
    assert predictor.traces == 1


def test_batches_of_other_lengths_trace_nothing_new():
    model = models.sequence_model(masking=True)
    predictor, calls = counted(model)
    rng = np.random.default_rng(2)
    for seed in range(6):
        rows = rows_of(rng.integers(1, 60, 40), seed)
        np.testing.assert_allclose(predictor([rows], 16, None, buckets=3)[0],
                                   np.array(alone(model, rows)), atol=1e-5)
    shapes = {s[0][:2] for s in calls.shapes}
    assert len(shapes) > 10 and predictor.traces == 1 <= len(shapes)


def test_a_transformer_style_model_gives_each_row_its_own_prediction():
    model = models.attention_model()
    predictor, calls = counted(model)
    lengths = np.random.default_rng(4).integers(1, 24, 120)
    rows = rows_of(lengths, ids=30)
    want = np.array(alone(model, rows))
    assert np.ptp(want, axis=0).min() > 1e-3  # the rows' predictions differ
    for buckets, most in ((3, 3), ((4, 8, 16), 4)):  # rows over 16: one more bucket
        calls.shapes.clear()
        np.testing.assert_allclose(predictor([rows], 1024, None, buckets=buckets)[0], want, atol=1e-5)
        assert len(calls.shapes) <= most
    assert predictor.padding == (0,) and predictor.traces == 1


def test_per_step_outputs_come_back_cut_to_each_rows_length():
    model = models.tagger_model()
    predictor, _ = counted(model)
    lengths = np.random.default_rng(5).integers(1, 12, 40)
    rows = rows_of(lengths, 5)
    features = np.random.default_rng(6).standard_normal((40, 2)).astype("float32")
    steps, whole = predictor([rows, features], 1024, None, buckets=2)
    assert predictor.padding == (0.0, None)  # the features are not padded
    for k, want in enumerate(alone(model, rows, features)):
        assert steps[k].shape == (lengths[k], 2)
        np.testing.assert_allclose(steps[k], want["steps"], atol=1e-5)
        np.testing.assert_allclose(whole[k], want["whole"], atol=1e-5)


def test_a_keras_hub_backbone_pads_token_ids_and_its_padding_mask():
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(5)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=20, num_layers=1, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=16)
    predictor, calls = counted(backbone)
    assert predictor.padding == (0, 0, 0)  # token_ids, segment_ids, padding_mask
    lengths = np.random.default_rng(7).integers(1, 16, 24)
    ids = rows_of(lengths, 7, ids=20)
    segments, mask = (np.empty(24, dtype=object) for _ in range(2))
    segments[:] = [np.zeros_like(r) for r in ids]
    mask[:] = [np.ones_like(r) for r in ids]
    sequence, pooled = predictor([ids, segments, mask], 1024, None, buckets=3)
    assert len(calls.shapes) <= 3
    for k, row in enumerate(ids):
        want = backbone({"token_ids": row[None], "segment_ids": segments[k][None],
                         "padding_mask": mask[k][None]}, training=False)
        np.testing.assert_allclose(sequence[k], np.asarray(want["sequence_output"])[0], atol=1e-5)
        np.testing.assert_allclose(pooled[k], np.asarray(want["pooled_output"])[0], atol=1e-5)


# --- refusals ---------------------------------------------------------------------------------

def _conv_after_masking() -> keras.Model:
    inp = keras.Input((None, 3), name="sequence")
    x = layers.Conv1D(4, 3, padding="same")(layers.Masking(0.0)(inp))
    return keras.Model(inp, layers.Dense(1)(layers.GlobalAveragePooling1D()(x)))


@pytest.mark.parametrize("build, why", [
    (lambda: models.sequence_model(masking=False),
     r"^buckets=4: input 'sequence' feeds GRU, and no Masking layer or Embedding\(mask_zero=True\) "
     r"after it marks padded steps: they would change the predictions"),
    (_conv_after_masking, r"^buckets=4: padding a row of 5 steps to 9 changes output 'prediction' by up "
                          r"to [0-9.e-]+: a layer between the mask and this output drops the mask"),
    (lambda: models.mlp(3, 4, 1), r"^buckets=4: the model has no variable-length input \('input_layer\w*' "
                                  r"float32 of shape \(3,\)\): there is nothing to pad"),
], ids=["unmasked GRU", "mask dropped", "no variable input"])
def test_a_model_that_would_not_ignore_the_padding_is_refused(build, why):
    handle = ModelHandle("refused", 0, model=build())
    with pytest.raises(ArgumentError, match=why):
        checked(handle, 4)
    assert checked(handle, None) is None  # no buckets: nothing to check


# --- row isolation ----------------------------------------------------------------------------

def test_a_row_the_model_raises_on_costs_only_itself_in_its_bucket():
    model = models.asserting_sequence_model(limit=10.0)
    handle = ModelHandle("isolated", 0, model=model)
    lengths = np.random.default_rng(8).integers(1, 20, 30)
    rows = rows_of(lengths, 8)
    rows[7][0, 1] = 50.0  # raises in the graph
    column = pa.array([r.tolist() for r in rows], pa.list_(pa.list_(pa.float32())))
    scored = score(handle, from_arrow(["seq"], [column]), batch_size=64, on_invalid="null",
                   reasons=True, buckets=3)
    assert np.flatnonzero(scored.invalid).tolist() == [7]
    assert scored.reasons[7].startswith("model: InvalidArgumentError")
    want = np.array(alone(model, np.delete(rows, 7)))
    np.testing.assert_allclose(scored.outputs[0], want, atol=1e-5)
    with pytest.raises(ModelCallError, match=r"the model raised on row 7 of this batch"):
        score(handle, from_arrow(["seq"], [column]), batch_size=64, buckets=3)
