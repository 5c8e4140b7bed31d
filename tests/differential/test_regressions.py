"""Shrunk cases of the generated suite (:mod:`.test_generated`), as ordinary tests: each is
checked against the oracle exactly as a generated case is (:func:`.harness.check`).

``FOUND``: defects of the engine the generators reach, each fixed, kept so that it stays
fixed (the review's items of issue 42: the case the suite shrank to with the fix
reverted). ``OPEN``: defects found and not fixed yet, strict xfails (each one's line in
:data:`.strategies.OPEN_DEFECTS` keeps it out of the generated cases meanwhile): when one
is fixed its test passes, fails as XPASS, and its marker and its line there go.
"""

from __future__ import annotations

import types

import numpy as np
import pyarrow as pa
import pytest

from spark_keras.errors import ModelInputError
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import score
from spark_keras.inference.preprocess import Preprocess
from tests.differential.cases import MARK, Case, Options
from tests.differential.harness import Difference, check, predictor
from tests.differential.recipes import HOT, TABLE, Recipe

TABLE_MODEL = Recipe("tokens", guard="table")  # ids -> Embedding(mask_zero) -> Positions(TABLE)
LONG = [1] * (TABLE + 2)  # past the positional table: the model raises on this row alone
OK = [0.25, 0.5, 0.75]  # a plain row, or step

# name -> (case, issue 42's item): shrunk with the item's fix reverted (see the report of
# issue 44 for the seeds); each passes on the engine as it is
FOUND: dict[str, tuple[Case, str]] = {
    "preprocess editing its batch in place, a refused row": (
        Case(Recipe("dense"), [[OK], [[MARK, 0.25, 0.25]], [OK]], "doubled_in_place", Options()),
        "1: the search sliced the frame the first call had edited: the good rows doubled twice "
        "(-0.447 where alone -0.223)"),
    "buckets, a value per step, a bucket whose every row raises": (
        Case(Recipe("seq", body="gru", head="steps", guard="assert"),
             [[[OK]], [[OK, OK, [HOT, 0.25, 0.25]]]], None, Options(buckets=2)),
        "2: TypeError 'object of type 'int' has no len()' for the whole batch"),
    "preprocess pieces of different widths": (
        Case(Recipe("dense"), [[[0.25, 0.25, 0.25]], [[0.25, 0.25]]], "doubled", Options()),
        "3: the function raised on the batch (rows of two widths cannot be stacked); its pieces, "
        "of widths 3 and 2, were not stitched: ArrowTypeError 'Size of FixedSizeList is not the "
        "same' for the whole batch"),
    "buckets, two sequence inputs of different lengths, a value per step": (
        Case(Recipe("pair", body="gru", head="steps"),
             [[[[0.25, 0.25, 0.25]], [[0.25, 0.25], [0.25, 0.25]]]], None, Options(buckets=1)),
        "8: output 'steps' follows input 's' (1 step) but came back with 2 steps, the length of "
        "the longer input 'u'"),
    "a string output that is not UTF-8": (
        Case(Recipe("text", outputs=2), [["cat"], [b"\xff\xfe"]], None, Options()),
        "4: ModelError for the whole batch under 'null'"),
    "a failure of every call of several rows": (
        Case(Recipe("dense", guard="together"), [[[HOT, 0.25, 0.25]]] * 40, None, Options()),
        "5: the search fed the model 716 rows in 103 calls to score 40"),
    "buckets, a model whose maximum over the steps drops the mask": (
        Case(Recipe("seq", body="dense", head="max"),
             [[[OK]], [[OK, [-0.5, 1.0, 0.25], [1.5, -1.0, 2.0]]]], None, Options(buckets=1)),
        "7: buckets=1 accepted (the probe agreed by chance): row 0 -0.095, alone 0.199"),
    # the engine review's D1 (these were strict xfails until fixed)
    "buckets, positional table (null)": (
        Case(TABLE_MODEL, [[[1, 2]], [LONG]], None, Options(buckets=1)),
        "D1: the search kept the bucket's padding: row 0, fine alone, was retried padded to "
        "row 1's length, past the table, and was null ('indices[10] = 10 is not in [0, 10)')"),
    "buckets, positional table (error)": (
        Case(TABLE_MODEL, [[[1, 2]], [LONG]], None, Options(buckets=1, on_invalid="error")),
        "D1: ModelCallError named row 0 (fine alone) instead of row 1"),
    # empty batches with a preprocess function (strict xfails until fixed: the engine
    # now calls no function on no rows)
    "empty batch, preprocess raising on it (null)": (
        Case(Recipe("dense"), [], "doubled", Options(on_invalid="null")),
        "np.stack of no rows raises; the search for the failing row of a 0-row batch "
        "recurses: RecursionError instead of 0 rows"),
    "empty batch, preprocess raising on it (error)": (
        Case(Recipe("dense"), [], "doubled_in_place", Options(on_invalid="error")),
        "RecursionError instead of 0 rows or a PreprocessError"),
    "empty batch, preprocess making 0-wide rows": (
        Case(Recipe("tokens"), [], "padded", Options()),
        "the function's (0, 0) array: ArrowInvalid 'list_size needs to be a strict positive "
        "integer' instead of 0 rows"),
}

# name -> (case, what is wrong): none open now
OPEN: dict[str, tuple[Case, str]] = {}


@pytest.mark.parametrize("name", list(FOUND))
def test_found_defects_stay_fixed(name):
    check(FOUND[name][0])


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, raises=Difference, reason=why))
    for name, (_, why) in OPEN.items()])
def test_open_defects(name):
    check(OPEN[name][0])


def _zero_wide(batch):
    """A preprocess function making rows of no values (a tokenizer given empty text, a
    feature selection that selects nothing)."""
    return np.zeros((len(batch), 0), dtype="float32")


def _score_zero_wide(on_invalid: str):
    handle = types.SimpleNamespace(predictor=predictor(Recipe("dense")),
                                   preprocess=Preprocess.of(_zero_wide), resize=None)
    columns = from_arrow(["raw"], [pa.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])])
    return score(handle, columns, batch_size=64, on_invalid=on_invalid, where="batch",
                 first_row=0, reasons=True, ids=None, buckets=None)


def test_zero_wide_rows_from_preprocess_are_refused_by_the_input_check():
    """Rows of 0 values where the model takes 3: each row invalid under "null", with the
    input check's reason naming input 'a'; under "error" a ModelInputError naming it."""
    scored = _score_zero_wide("null")
    assert scored.invalid is not None and scored.invalid.tolist() == [True, True]
    assert all(str(r).startswith("column 'a': ") for r in scored.reasons)
    with pytest.raises(ModelInputError, match="'a'"):
        _score_zero_wide("error")
