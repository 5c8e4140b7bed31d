"""jobs/score.py through spark-submit on small parquet and CSV files, its exit status and
its one-line failures; and as a Spark Connect client (``--remote local[2]`` or
``SPARK_REMOTE``, a real local Connect server) with the same output and failures."""

from __future__ import annotations

import ast
import json
import os
import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk

from . import models
from .conftest import REPO_ROOT, run_score_job
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
    found = re.fullmatch(r"SCORED rows=(\d+) invalid_rows=\d+ seconds=\S+ rows_per_second=\S+ "
                         r"model_builds=\d+ build_seconds=\S+ builds_per_worker=(\{.*\})", lines[0])
    assert found, lines[0]
    return int(found[1]), ast.literal_eval(found[2])


def assert_one_build_per_worker(builds: dict) -> None:
    # local[2]: one or two Python workers, each built the model exactly once
    assert 1 <= len(builds) <= 2 and set(builds.values()) == {1}, builds


@pytest.mark.slow  # a whole job or driver of its own, or a cluster: 40-50 s
def test_score_csv_with_format_overwriting_old_output(files):
    folder, model, x = files
    out = folder / "scored"
    out.mkdir()
    pd.DataFrame({"stale": [7, 8, 9]}).to_parquet(out / "part-old.parquet", index=False)
    reports = folder / "daemon-reports"
    # the model by URI (read by the executor from storage); the workers' daemon reports
    proc = submit("--model", f"file://{folder}/model.skp", "--input", str(folder / "in.txt"),
                  "--format", "csv", "--output", str(out), "--features", ",".join(FEATURES),
                  "--batch-size", "64", "--overwrite", SPARK_KERAS_DAEMON_REPORT=str(reports))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows, builds = summary(proc)
    assert rows == 250
    assert_one_build_per_worker(builds)
    # conf/spark-defaults.conf: workers forked from the preloading daemon
    daemons = [json.loads(p.read_text()) for p in reports.glob("daemon-*.json")]
    assert daemons and all(d["refused"] is None for d in daemons), daemons
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
    job_tmp = folder / "holes-tmp"  # the job's temporary folders (its build log)
    job_tmp.mkdir()
    proc = submit("--model", str(folder / "model.keras"), "--input", str(source),
                  "--output", str(out), "--features", "features", "--on-invalid", "null",
                  TMPDIR=str(job_tmp))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows, builds = summary(proc)
    assert rows == 48
    assert_one_build_per_worker(builds)  # read from the build log the job made...
    assert [p.name for p in job_tmp.glob("spark_keras_builds_*")] == []  # ...and removed
    scored = pd.read_parquet(out).sort_values("id")
    assert scored["id"].tolist() == list(range(42)) + list(range(1000, 1006))
    invalid = scored["id"].isin([20, 21]) | (scored["id"] >= 1000)
    assert scored["prediction"].isna().tolist() == invalid.tolist()
    np.testing.assert_allclose(np.stack(scored["prediction"][~invalid].to_numpy()),
                               np.asarray(model(np.stack(good))), atol=1e-5)
    # the all-invalid file really was scored on its own (one output part holds it alone)
    parts = [pd.read_parquet(p) for p in sorted(out.glob("part-*.parquet"))]
    assert sorted(p["id"].tolist() for p in parts) == [list(range(42)), list(range(1000, 1006))]


FAILURES = {  # case: what the job's one error line says, and its exit status
    "missing input": ("input path", 2),
    "missing model": ("/nope.skp' does not exist", 2),
    "unreadable model": ("cannot load model", 2),
    "output exists": ("exists; pass --overwrite", 2),
    "unknown feature": ("not in the input", 2),
    "master and remote": ("--master 'local[1]' cannot be combined", 2),
    "bad data": ("column 'features' has type string", 1),  # a failed Spark job
}


def failing_args(folder, case: str, prefix: str) -> list[str]:
    """The job's arguments for the failure ``case``."""
    args = {"--model": str(folder / "model.keras"), "--input": str(folder / "in.parquet"),
            "--output": str(folder / f"{prefix}-{case.replace(' ', '-')}"), "--features": "features"}
    if case == "missing input":
        args["--input"] = str(folder / "nope.parquet")
    elif case == "missing model":
        args["--model"] = f"file://{folder}/nope.skp"
    elif case == "unreadable model":
        (folder / "garbage.keras").write_bytes(b"not a model at all")
        args["--model"] = str(folder / "garbage.keras")
    elif case == "output exists":
        os.makedirs(args["--output"], exist_ok=True)
    elif case == "unknown feature":
        args["--features"] = "pixels"
    elif case == "master and remote":
        args["--master"] = "local[1]"
    elif case == "bad data":
        args["--input"] = str(folder / "bad.parquet")
    return [item for pair in args.items() for item in pair]


@pytest.mark.parametrize("case", ["missing input", "missing model", "unreadable model",
                                  "output exists", "unknown feature", "bad data"])
@pytest.mark.slow  # one spark-submit per case: about 2 minutes in all
def test_score_job_failures_are_one_line_and_leave_nothing(files, case):
    folder, _, _ = files
    expected, status = FAILURES[case]
    args = failing_args(folder, case, "out")
    before = set(os.listdir(folder))
    proc = submit(*args)
    assert proc.returncode == status, (proc.stdout + proc.stderr)[-3000:]
    # spark-submit merges the Python driver's stderr into its stdout
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if line.startswith("score.py: error:")]
    assert len(errors) == 1 and expected in errors[0], output[-3000:]
    assert set(os.listdir(folder)) == before  # no partial output, no staging folder


# --- Spark Connect -------------------------------------------------------------------------
# A local Connect server always listens on port 15002: the jobs below run one at a time.


def needs_connect() -> None:
    import pyspark

    pytest.importorskip("grpc")
    pytest.importorskip("zstandard")
    if int(pyspark.__version__.split(".")[0]) < 4:  # the server jar ships in the wheel from 4.0
        pytest.skip(f"PySpark {pyspark.__version__} has no local Spark Connect server")


@pytest.mark.slow  # a whole job or driver of its own, or a cluster: 40-50 s
def test_connect_scores_relative_paths_like_the_model_overwriting_old_output(files):
    """``--remote local[2]``, run from the data folder with relative paths: the server
    and the client must agree on what they mean."""
    needs_connect()
    folder, model, x = files
    out = folder / "connect-scored"
    out.mkdir()
    pd.DataFrame({"stale": [7, 8, 9]}).to_parquet(out / "part-old.parquet", index=False)
    job_tmp = folder / "connect-tmp"  # the job's temporary folders (its build log)
    job_tmp.mkdir()
    before = set(os.listdir(folder))
    proc = run_score_job("--remote", "local[2]", "--model", "model.skp", "--input", "in.parquet",
                         "--output", "connect-scored", "--features", "features",
                         "--batch-size", "64", "--overwrite", cwd=folder,
                         TMPDIR=str(job_tmp))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows, builds = summary(proc)
    assert rows == 250
    assert_one_build_per_worker(builds)  # read from the build log the job made...
    assert [p.name for p in job_tmp.glob("spark_keras_builds_*")] == []  # ...and removed
    assert set(os.listdir(folder)) == before  # no staging folder left
    assert not (out / "part-old.parquet").exists()
    scored = pd.read_parquet(out).sort_values("id")  # only the new data
    assert list(scored.columns) == ["id", "features", "name", "prediction"]
    assert scored["id"].tolist() == list(range(250))
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)


@pytest.mark.parametrize("case", ["output exists", "missing input", "master and remote", "bad data"])
@pytest.mark.slow  # one Connect job per case
def test_connect_failures_are_one_line_and_leave_nothing(files, case):
    """Through ``SPARK_REMOTE``: the same one-line errors and statuses as classic. Path
    errors are found on the client before a server starts; only "bad data" runs a job
    (it fails while writing the staging folder, which must be gone afterwards)."""
    needs_connect()
    folder, _, _ = files
    expected, status = FAILURES[case]
    args = failing_args(folder, case, "connect-out")
    before = set(os.listdir(folder))
    proc = run_score_job(*args, SPARK_REMOTE="local[2]")
    assert proc.returncode == status, (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("score.py: error:")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    assert "SCORED" not in proc.stdout
    assert set(os.listdir(folder)) == before  # no output, no staging folder


def test_connect_path_never_touches_the_jvm():
    """A Connect session has no SparkContext: every use of one (and of SparkConf) lives
    in the classic-only code, which ``_open``/``_build_log_folder`` reach only without a
    remote."""
    import ast

    with open(os.path.join(REPO_ROOT, "spark_keras", "jobs", "score.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    jvm = {"sparkContext", "_jvm", "_jsc", "SparkConf"}
    users = {top.name for top in tree.body if isinstance(top, (ast.FunctionDef, ast.ClassDef))
             for node in ast.walk(top)
             if (isinstance(node, ast.Attribute) and node.attr in jvm)
             or (isinstance(node, ast.Name) and node.id in jvm)
             or (isinstance(node, ast.alias) and node.name in jvm)}
    assert users == {"_session", "HadoopPaths", "_classic_build_log"}, users
    functions = {top.name: top for top in tree.body if isinstance(top, ast.FunctionDef)}
    for name, classic in {"_open": {"_session", "HadoopPaths"},
                          "_build_log_folder": {"_classic_build_log"}}.items():
        # the first branch: ``if <remote>: ... return``, before any classic-only call
        guard = next(node for node in functions[name].body if isinstance(node, ast.If))
        assert "remote" in ast.unparse(guard.test), ast.unparse(guard)
        before = functions[name].body[:functions[name].body.index(guard)]
        assert not {n.id for s in before for n in ast.walk(s) if isinstance(n, ast.Name)} & classic
        assert isinstance(guard.body[-1], ast.Return) and not guard.orelse
        called = {n.func.id for n in ast.walk(guard) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name)}
        assert not called & classic, (name, called)
