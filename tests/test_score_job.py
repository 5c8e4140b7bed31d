"""jobs/score.py through spark-submit on small parquet files, and its one-line failures."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

import spark_keras as sk

from . import models
from .conftest import submit_score_job as submit

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("score-job")
    model = models.mlp(n_features=6, hidden=8, outputs=3)
    x = np.random.default_rng(2).standard_normal((250, 6)).astype("float32")
    pd.DataFrame({"id": np.arange(250), "features": list(x), "name": ["row"] * 250}).to_parquet(
        folder / "in.parquet", index=False)
    pd.DataFrame({"id": [1, 2], "features": ["a", "b"]}).to_parquet(folder / "bad.parquet", index=False)
    holes = list(x[:4]) + [None, np.array([1.0, 2.0], "float32")]  # a null row, a short row
    pd.DataFrame({"id": np.arange(6), "features": holes}).to_parquet(folder / "holes.parquet", index=False)
    model.save(folder / "model.keras")
    sk.save(model, folder / "model.skp")
    return folder, model, x


def test_score_job_with_spark_submit(files):
    folder, model, x = files
    out = folder / "scored.parquet"
    proc = submit("--model", str(folder / "model.skp"), "--input", str(folder / "in.parquet"),
                  "--output", str(out), "--features", "features", "--batch-size", "64")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SCORED rows=250" in proc.stdout
    assert "builds_per_worker={" in proc.stdout and "': 1" in proc.stdout
    scored = pd.read_parquet(out).sort_values("id")
    assert list(scored.columns) == ["id", "features", "name", "prediction"]
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)


def test_score_job_null_policy_keeps_every_row(files):
    folder, model, x = files
    out = folder / "holes-scored.parquet"
    proc = submit("--model", str(folder / "model.keras"), "--input", str(folder / "holes.parquet"),
                  "--output", str(out), "--features", "features", "--on-invalid", "null")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    scored = pd.read_parquet(out).sort_values("id")
    assert scored["prediction"].isna().tolist() == [False] * 4 + [True, True]
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()[:4]), np.asarray(model(x[:4])),
                               atol=1e-5)


@pytest.mark.parametrize("case", ["missing input", "unreadable model", "output exists",
                                  "unknown feature", "bad data"])
def test_score_job_failures_are_one_line_and_leave_nothing(files, case):
    folder, _, _ = files
    args = {"--model": str(folder / "model.keras"), "--input": str(folder / "in.parquet"),
            "--output": str(folder / f"out-{case.replace(' ', '-')}"), "--features": "features"}
    expected = {"missing input": "input path", "unreadable model": "cannot load model",
                "output exists": "exists; pass --overwrite", "unknown feature": "not in the input",
                "bad data": "column 'features' has type string"}[case]
    if case == "missing input":
        args["--input"] = str(folder / "nope.parquet")
    elif case == "unreadable model":
        (folder / "garbage.keras").write_bytes(b"not a model at all")
        args["--model"] = str(folder / "garbage.keras")
    elif case == "output exists":
        os.makedirs(args["--output"], exist_ok=True)
    elif case == "unknown feature":
        args["--features"] = "pixels"
    elif case == "bad data":
        args["--input"] = str(folder / "bad.parquet")
    before = set(os.listdir(folder))
    proc = submit(*[item for pair in args.items() for item in pair])
    assert proc.returncode != 0
    # spark-submit merges the Python driver's stderr into its stdout
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if line.startswith("score.py: error:")]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert set(os.listdir(folder)) == before  # no partial output, no staging folder
