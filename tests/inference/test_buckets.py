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

import spark_keras as sk
from spark_keras.errors import ArgumentError, ModelCallError
from spark_keras.handle import ModelHandle
from spark_keras.inference.buckets import bucket_lengths, checked, fewest_steps, padding_share
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.options import FLAGS, check_buckets
from spark_keras.inference.predictor import Predictor
from tests import models


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
    assert Predictor(sk.loads(sk.dumps(model))).padding == (0,)  # as a worker loads it


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


def two_sequences_model() -> keras.Model:
    """Two masked sequences of their own lengths (``first``, ``second``): a value per step
    of each, one per step of ``first`` attending over ``second`` (computed from both, its
    mask ``first``'s), and one for the whole."""
    keras.utils.set_random_seed(9)
    first, second = keras.Input((None, 3), name="first"), keras.Input((None, 3), name="second")
    a = layers.GRU(4, return_sequences=True)(layers.Masking(0.0)(first))
    b = layers.GRU(4, return_sequences=True)(layers.Masking(0.0)(second))
    cross = layers.MultiHeadAttention(2, 4)(a, b)
    whole = layers.Concatenate()([layers.GlobalAveragePooling1D()(a), layers.GlobalAveragePooling1D()(b)])
    return keras.Model([first, second], {"first_steps": layers.Dense(1)(a), "second_steps": layers.Dense(2)(b),
                                         "cross": layers.Dense(1)(cross), "whole": layers.Dense(1)(whole)},
                       name="two_sequences")


def test_per_step_outputs_of_two_sequences_are_cut_to_the_input_they_follow():
    model = two_sequences_model()
    predictor, calls = counted(model)
    rng = np.random.default_rng(9)
    first, second = rng.integers(1, 8, 16), rng.integers(1, 14, 16)
    assert (first < second).any() and (first > second).any()
    rows_a, rows_b = rows_of(first, 1), rows_of(second, 2)
    got = dict(zip(predictor.signature.output_names, predictor([rows_a, rows_b], 1024, None, buckets=2)))
    assert len(calls.shapes) == 2
    for k, want in enumerate(alone(model, rows_a, rows_b)):
        assert got["first_steps"][k].shape == (first[k], 1) and got["cross"][k].shape == (first[k], 1)
        assert got["second_steps"][k].shape == (second[k], 2)
        for name in want:
            np.testing.assert_allclose(got[name][k], want[name], atol=1e-5)
    assert predictor.padding == (0.0, 0.0)
    assert predictor.padding.follows == (0, 1, 0, None)  # first_steps, second_steps, cross, whole
    # as a worker has it, loaded from its config (each mask an argument computed in the graph)
    assert Predictor(sk.loads(sk.dumps(model))).padding.follows == (0, 1, 0, None)


def _steps_of_both() -> keras.Model:
    first, second = keras.Input((None, 3), name="first"), keras.Input((None, 3), name="second")
    joined = layers.Concatenate()([layers.Masking(0.0)(first), layers.Masking(0.0)(second)])
    return keras.Model([first, second], {"joined": layers.Dense(1)(joined)})


def test_a_per_step_output_of_two_sequences_that_follows_neither_is_refused():
    handle = ModelHandle("both", 0, model=_steps_of_both())
    with pytest.raises(ArgumentError, match=r"^buckets=2: output 'joined' has a value per step, computed from "
                                            r"inputs 'first' and 'second', and which of them its steps follow "
                                            r"cannot be told"):
        checked(handle, 2)


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


def max_pooled(seed: int = 1) -> keras.Model:
    """Masking -> Dense(tanh) -> GlobalMaxPooling1D (which does not support masking: Keras
    warns the mask is lost) -> Dense."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((None, 3), name="sequence")
    x = layers.Dense(4, activation="tanh")(layers.Masking(0.0)(inp))
    return keras.Model(inp, layers.Dense(1)(layers.GlobalMaxPooling1D()(x)), name="max_pooled")


def _ops_after_masking() -> keras.Model:
    inp = keras.Input((None, 3), name="sequence")
    x = layers.Dense(4)(layers.Masking(0.0)(inp))
    return keras.Model(inp, layers.Dense(1)(keras.ops.max(x, axis=1)))


def _unmasked_skip() -> keras.Model:
    inp = keras.Input((None, 3), name="sequence")
    masked = layers.GRU(4)(layers.Masking(0.0)(inp))
    raw = layers.GlobalAveragePooling1D()(inp)  # no mask on this path: it averages padded steps
    return keras.Model(inp, layers.Dense(1)(layers.Concatenate()([masked, raw])))


@pytest.mark.parametrize("build, why", [
    (lambda: models.sequence_model(masking=False),
     r"^buckets=4: input 'sequence' feeds GRU, and no Masking layer or Embedding\(mask_zero=True\) "
     r"after it marks padded steps: they would change the predictions"),
    (_conv_after_masking, r"^buckets=4: input 'sequence' is masked, but Conv1D 'conv1d\w*' after it does not "
                          r"support masking: given the mask, it drops it"),
    (max_pooled, r"^buckets=4: input 'sequence' is masked, but GlobalMaxPooling1D 'global_max_pooling1d\w*' "
                 r"after it does not support masking: given the mask, it drops it \(Keras 3 warns so\), and the "
                 r"padded steps reach the outputs after it"),
    (_ops_after_masking, r"^buckets=4: input 'sequence' is masked, but Max 'max\w*' after it does not support "
                         r"masking"),
    (_unmasked_skip, r"^buckets=4: input 'sequence' reaches output 'prediction' by a path with no Masking layer "
                     r"or Embedding\(mask_zero=True\) on it"),
    (lambda: models.mlp(3, 4, 1), r"^buckets=4: the model has no variable-length input \('input_layer\w*' "
                                  r"float32 of shape \(3,\)\): there is nothing to pad"),
], ids=["unmasked GRU", "Conv1D drops the mask", "GlobalMaxPooling1D drops the mask", "an op drops the mask",
        "an unmasked path", "no variable input"])
def test_a_model_that_would_not_ignore_the_padding_is_refused(build, why):
    model = build()
    handle = ModelHandle("refused", 0, model=model)
    with pytest.raises(ArgumentError, match=why):
        checked(handle, 4)
    with pytest.raises(ArgumentError, match=why[len("^buckets=4: "):]):  # as a worker loads it
        Predictor(sk.loads(sk.dumps(model))).padding  # noqa: B018
    assert checked(handle, None) is None  # no buckets: nothing to check


def test_the_max_pooled_model_is_refused_and_padding_would_change_its_predictions():
    """The review's model: refused, and rightly (what one bucket would give is not each
    row's own prediction)."""
    model = max_pooled()
    with pytest.raises(ArgumentError, match=r"GlobalMaxPooling1D .* does not support masking"):
        checked(ModelHandle("pooled", 0, model=model), 1)
    rows = rows_of(np.random.default_rng(10).integers(2, 8, 40), 10)
    padded = np.zeros((len(rows), 8, 3), "float32")
    for k, row in enumerate(rows):
        padded[k, :len(row)] = row
    wrong = np.asarray(model(padded, training=False))
    assert np.abs(wrong - np.array(alone(model, rows))).max() > 0.01  # what buckets would have given


def _mask_dropped_inside(seed: int) -> keras.Model:
    """The max-pooled model with its pooling inside a nested model given the mask from
    outside: the graph's check trusts the nested model, the probe must not."""
    keras.utils.set_random_seed(seed)
    inner = keras.Sequential([keras.Input((None, 3)), layers.Dense(4, activation="tanh"),
                              layers.GlobalMaxPooling1D()])
    inp = keras.Input((None, 3), name="sequence")
    return keras.Model(inp, layers.Dense(1)(inner(layers.Masking(0.0)(inp))))


def test_the_probe_refuses_a_mask_dropped_inside_a_nested_model_for_any_weights():
    for seed in range(12):  # one random probe row let most of these through
        handle = ModelHandle("nested", 0, model=_mask_dropped_inside(seed))
        with pytest.raises(ArgumentError, match=r"^buckets=4: padding rows of 5 steps to (6|9) changes output "
                                                r"'prediction' by up to [0-9.e+-]+ \(its values up to"):
            checked(handle, 4)


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
