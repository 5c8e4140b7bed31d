"""jobs/score.py through spark-submit on small parquet and CSV files, its exit status and
its one-line failures."""

from __future__ import annotations

import ast
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk

from . import models
from .conftest import submit_score_job as submit

FEATURES = [f"f{i}" for i in range(6)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("score-job")
    model = models.mlp(n_features=6, hidden=8, outputs=3)
    x = np.random.default_rng(2).standard_normal((250, 6)).astype("float32")
    pd.DataFrame({"id": np.arange(250), "features": list(x), "name": ["row"] * 250}).to_parquet(
        folder / "in.parquet", index=False)
    # CSV, one column per feature, under a name whose extension says nothing of the format
    pd.DataFrame({"id": np.arange(250), **{f: x[:, i] for i, f in enumerate(FEATURES)}}).to_csv(
        folder / "in.txt", index=False)
    pd.DataFrame({"id": [1, 2], "features": ["a", "b"]}).to_parquet(folder / "bad.parquet", index=False)
    model.save(folder / "model.keras")
    sk.save(model, folder / "model.skp")
    return folder, model, x


def write_features(path, ids, rows) -> None:
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "features": pa.array(rows, pa.list_(pa.float32()))}), path)


def summary(proc) -> tuple[int, dict]:
    """``rows`` and ``builds_per_worker`` from the job's one SCORED line."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SCORED ")]
    assert len(lines) == 1, (proc.stdout + proc.stderr)[-3000:]
    found = re.fullmatch(r"SCORED rows=(\d+) seconds=\S+ rows_per_second=\S+ "
                         r"builds_per_worker=(\{.*\})", lines[0])
    assert found, lines[0]
    return int(found[1]), ast.literal_eval(found[2])


def assert_one_build_per_worker(builds: dict) -> None:
    # local[2]: one or two Python workers, each built the model exactly once
    assert 1 <= len(builds) <= 2 and set(builds.values()) == {1}, builds


def test_score_csv_with_format_overwriting_old_output(files):
    folder, model, x = files
    out = folder / "scored"
    out.mkdir()
    pd.DataFrame({"stale": [7, 8, 9]}).to_parquet(out / "part-old.parquet", index=False)
    proc = submit("--model", str(folder / "model.skp"), "--input", str(folder / "in.txt"),
                  "--format", "csv", "--output", str(out), "--features", ",".join(FEATURES),
                  "--batch-size", "64", "--overwrite")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows, builds = summary(proc)
    assert rows == 250
    assert_one_build_per_worker(builds)
    assert not (out / "part-old.parquet").exists()
    scored = pd.read_parquet(out).sort_values("id")  # only the new data
    assert list(scored.columns) == ["id", *FEATURES, "prediction"]
    assert scored["id"].tolist() == list(range(250))
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)


def test_score_parquet_with_null_policy_keeps_every_row(files):
    """Invalid rows get a null prediction, also in a file (its own partition and Arrow
    batch) where every row is invalid; the row count never changes."""
    folder, model, x = files
    source = folder / "holes"
    source.mkdir()
    good = list(x[:40])
    mixed = good[:20] + [None, np.array([1.0, 2.0], "float32")] + good[20:]  # a null, a short row
    write_features(source / "part-a.parquet", range(42), mixed)
    nan_row = x[0].copy()
    nan_row[3] = np.nan
    all_bad = [None, [1.0, 2.0], list(range(7)), [], nan_row, [1.0, None, 2.0, 3.0, 4.0, 5.0]]
    write_features(source / "part-b.parquet", range(1000, 1006), all_bad)
    out = folder / "holes-scored.parquet"
    proc = submit("--model", str(folder / "model.keras"), "--input", str(source),
                  "--output", str(out), "--features", "features", "--on-invalid", "null")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows, builds = summary(proc)
    assert rows == 48
    assert_one_build_per_worker(builds)
    scored = pd.read_parquet(out).sort_values("id")
    assert scored["id"].tolist() == list(range(42)) + list(range(1000, 1006))
    invalid = scored["id"].isin([20, 21]) | (scored["id"] >= 1000)
    assert scored["prediction"].isna().tolist() == invalid.tolist()
    np.testing.assert_allclose(np.stack(scored["prediction"][~invalid].to_numpy()),
                               np.asarray(model(np.stack(good))), atol=1e-5)
    # the all-invalid file really was scored on its own (one output part holds it alone)
    parts = [pd.read_parquet(p) for p in sorted(out.glob("part-*.parquet"))]
    assert sorted(p["id"].tolist() for p in parts) == [list(range(42)), list(range(1000, 1006))]


@pytest.mark.parametrize("case", ["missing input", "unreadable model", "output exists",
                                  "unknown feature", "bad data"])
def test_score_job_failures_are_one_line_and_leave_nothing(files, case):
    folder, _, _ = files
    args = {"--model": str(folder / "model.keras"), "--input": str(folder / "in.parquet"),
            "--output": str(folder / f"out-{case.replace(' ', '-')}"), "--features": "features"}
    # checked before any Spark job runs: status 2; a failed Spark job (bad data): status 1
    expected, status = {"missing input": ("input path", 2), "unreadable model": ("cannot load model", 2),
                        "output exists": ("exists; pass --overwrite", 2),
                        "unknown feature": ("not in the input", 2),
                        "bad data": ("column 'features' has type string", 1)}[case]
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
    assert proc.returncode == status, (proc.stdout + proc.stderr)[-3000:]
    # spark-submit merges the Python driver's stderr into its stdout
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if line.startswith("score.py: error:")]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert set(os.listdir(folder)) == before  # no partial output, no staging folder
