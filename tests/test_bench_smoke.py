"""The benchmark code runs end to end at tiny sizes (so it cannot rot), and its
prediction check fails loudly."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from bench.scoring_bench import Expected, PredictionMismatch, check_predictions

from .conftest import REPO_ROOT


def test_bench_quick_runs_and_prints_tables():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "loads speed-up" in out and "MLP 90MB" in out
    for method in ("predict_batch_udf", "closure pandas_udf", "BroadcastModel.predict_udf",
                   "BroadcastModel.transform", "hand-written mapInArrow (best case)",
                   "identity mapInArrow", "raw model (1 process)"):
        assert method in out
    for variant in ("array", "scalars", "vector"):
        assert re.search(rf"\|\s+{variant} \|", out), variant
        assert f"MLP ({variant}) transform >= 0.9x hand-written best case" in out
    assert "x best case" in out and "CNN (array) transform >= 0.9x hand-written best case" in out
    assert "transform / predict_batch_udf >= 4" in out and "peak worker RSS" in out


def _table(ids, predictions) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "prediction": predictions})


def test_prediction_check_accepts_the_same_rows_in_any_order():
    expected = Expected(np.array([0, 20, 40]), np.array([[0.1, 0.9], [0.5, 0.5], [0.3, 0.7]], "float32"))
    got = _table([40, 0, 20], pa.array([[0.3, 0.7], [0.1, 0.9], [0.5, 0.5 + 1e-6]], pa.list_(pa.float32())))
    check_predictions("m", got, expected)
    check_predictions("m", _table([20, 0], pa.array([2.0, 1.0], pa.float32())),
                      Expected(np.array([0, 20]), np.array([[1.0], [2.0]])))


@pytest.mark.parametrize("ids, predictions, message", [
    ([0, 20], [1.0, 2.5], "1 of 2 rows differ .* id 20"),  # a wrong value
    ([0, 20], [2.0, 1.0], "2 of 2 rows differ"),           # rows swapped
    ([0, 40], [1.0, 2.0], "ids are not"),                  # another row
    ([0], [1.0], "1 rows whose ids"),                      # a row lost
    ([0, 20], [1.0, None], "1 of 2 rows differ"),          # a null
])
def test_prediction_check_raises_when_a_method_disagrees(ids, predictions, message):
    expected = Expected(np.array([0, 20]), np.array([[1.0], [2.0]]))
    with pytest.raises(PredictionMismatch, match=message):
        check_predictions("m", _table(ids, pa.array(predictions, pa.float32())), expected)
