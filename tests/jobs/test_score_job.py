"""jobs/score.py through spark-submit on small parquet and CSV files, its exit status and
its one-line failures; and as a Spark Connect client (``--remote local[2]`` or
``SPARK_REMOTE``, a real local Connect server) with the same output and failures."""

from __future__ import annotations

import ast
import json
import os
import re

import keras
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.jobs.score.errors import outcome
from spark_keras.jobs.score.files import HadoopPaths
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.run import score
from tests import models
from tests.conftest import REPO_ROOT, run_score_job
from tests.conftest import submit_score_job as submit
from tests.jobs.scored_line import assert_built_once_per_worker, summary
from tests.jobs.test_score_imports import _module

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
    nan_row = x[:3].copy()
    nan_row[1, 2] = np.nan  # a row only a worker sees
    write_features(folder / "nan.parquet", [0, 1, 2], list(nan_row))
    model.save(folder / "model.keras")
    sk.save(model, folder / "model.skp")
    return folder, model, x


def write_features(path, ids, rows) -> None:
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                             "features": pa.array(rows, pa.list_(pa.float32()))}), path)


def executor_settings(event_log) -> dict:
    """The Spark properties of the application logged in the folder ``event_log`` (one
    log file, or a folder of rolled ones as Spark 4 writes it)."""
    logs = [p for p in event_log.rglob("*")
            if p.is_file() and not p.name.startswith((".", "appstatus"))]
    for line in (line for log in logs for line in log.read_text().splitlines()):
        event = json.loads(line)
        if event["Event"] == "SparkListenerEnvironmentUpdate":
            return dict(event["Spark Properties"])
    raise AssertionError(f"no environment in {logs}")


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
                  "--batch-size", "64", "--overwrite",
                  "--conf", "spark.sql.parquet.compression.codec=uncompressed",  # a user setting
                  SPARK_KERAS_DAEMON_REPORT=str(reports))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    # quiet: no Spark log lines or progress bars, the SCORED line (and spark-submit's own
    # few lines before the session starts)
    assert len((proc.stdout + proc.stderr).splitlines()) <= 12, proc.stdout + proc.stderr
    parts = [p.name for p in out.glob("part-*.parquet")]
    assert parts and not [n for n in parts if ".snappy." in n], parts  # the setting took
    figures = summary(proc)
    assert figures["rows"] == 250 and figures["invalid_rows"] == 0
    assert_built_once_per_worker(figures)
    # conf/spark-defaults.conf: workers forked from the preloading daemon
    daemons = [json.loads(p.read_text()) for p in reports.glob("daemon-*.json")]
    assert daemons and all(d["refused"] is None for d in daemons), daemons
    assert not (out / "part-old.parquet").exists()
    scored = pd.read_parquet(out).sort_values("id")  # only the new data
    assert list(scored.columns) == ["id", *FEATURES, "prediction"]
    assert scored["id"].tolist() == list(range(250))
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)


@pytest.mark.slow  # a whole job: about 30 s
def test_score_parquet_with_null_policy_keeps_every_row_and_prints_its_own_lines_only(files):
    """Invalid rows get a null prediction, also in a file (its own partition and Arrow
    batch) where every row is invalid; the row count never changes. Run as ``spark-keras
    score`` runs it (``python jobs/score.py``, no spark-submit) from another working
    folder, on a model of the user's own layers: a registered class from a ``.py`` file
    on no path (``--import``, shipped to the executors) and a ``Lambda``
    (``--unsafe-deserialization``). It prints its own lines only: no JVM start-up lines,
    log4j WARNs or progress bars; stdout is the SCORED line, stderr the warning
    ``--unsafe-deserialization`` gives, and the JVM's log file is gone."""
    folder, _, x = files
    layers = _module(folder / "src", "sk55_classic_layers")
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((6,)), layers.GatedResidual(6),
                              keras.layers.Lambda(lambda t: t * 2.0), keras.layers.Dense(3)])
    model.save(folder / "custom.keras")
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
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
    job_tmp = folder / "holes-tmp"  # the job's temporary folders
    job_tmp.mkdir()
    events = folder / "holes-events"  # Spark's event log: the settings the executors got
    events.mkdir()
    proc = run_score_job("--model", str(folder / "custom.keras"), "--input", str(source),
                         "--output", str(out), "--features", "features", "--on-invalid", "null",
                         "--version-col", "model_version", "--model-version", "2026-12-03",
                         "--import", "../src/sk55_classic_layers.py", "--unsafe-deserialization",
                         "--master", "local[2]", "--conf", "spark.eventLog.enabled=true",
                         "--conf", "spark.eventLog.compress=false",
                         "--conf", f"spark.eventLog.dir=file://{events}", cwd=elsewhere,
                         TMPDIR=str(job_tmp))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    warned = proc.stderr.splitlines()
    assert len(warned) == 1 and warned[0].endswith(
        " WARNING --unsafe-deserialization: the model's Lambda layers run their Python code on "
        "the driver and every executor; use it only for model files you trust"), proc.stderr
    assert [line[:7] for line in proc.stdout.splitlines()] == ["SCORED "], proc.stdout
    assert not list(job_tmp.glob("spark-keras-score-*.log"))
    figures = summary(proc)
    assert figures["rows"] == 48 and figures["invalid_rows"] == 8
    assert_built_once_per_worker(figures)  # observed by the query, not read from a folder:
    assert "spark.executorEnv.SPARK_KERAS_BUILD_LOG" not in executor_settings(events)
    assert not list(job_tmp.glob("spark_keras_builds_*"))  # nor a folder on the driver
    scored = pd.read_parquet(out).sort_values("id")
    assert scored["id"].tolist() == list(range(42)) + list(range(1000, 1006))
    invalid = scored["id"].isin([20, 21]) | (scored["id"] >= 1000)
    assert scored["prediction"].isna().tolist() == invalid.tolist()
    assert set(scored["model_version"]) == {"2026-12-03"}  # every row, invalid ones too
    np.testing.assert_allclose(np.stack(scored["prediction"][~invalid].to_numpy()),
                               model.predict(np.stack(good), verbose=0), rtol=1e-5, atol=1e-5)
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
    "bad data": ("column 'features' has type string", 2),  # refused on the driver
    "bad row": ("NaN or infinite", 2),  # a worker's ModelInputError, as its one line
    # Spark's own cause, which Py4J puts on a line of its own after the call that failed
    "bad master": ("cannot start Spark on master 'locl[2]': SparkException: Could not parse "
                   "Master URL: 'locl[2]'", 2),
    "unreachable master": ("cannot reach the Spark master 'spark://127.0.0.1:", 2),
    "bad conf": ("--conf 'spark.sql.shuffle.partitions': expected key=value", 2),
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
    elif case == "bad row":
        args["--input"] = str(folder / "nan.parquet")
    elif case == "bad master":
        args["--master"] = "locl[2]"
    elif case == "unreachable master":
        import socket

        with socket.socket() as s:  # a port nothing listens on once closed
            s.bind(("127.0.0.1", 0))
            args["--master"] = f"spark://127.0.0.1:{s.getsockname()[1]}"
    elif case == "bad conf":
        args["--conf"] = "spark.sql.shuffle.partitions"
    return [item for pair in args.items() for item in pair]


# The answers given before Spark starts (a missing input or model, a file that is no model,
# an output that exists, a column the input lacks) are each checked without a JVM in
# test_score_early; one of them goes through spark-submit here, beside a worker's failure
# (the job's one line after Spark started and ran tasks). A refusal on the driver once Spark
# read the input: the next case.
@pytest.mark.parametrize("case", ["unknown feature", "bad row"])
@pytest.mark.slow  # one spark-submit per case: about 40 s in all
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
    stream = proc.stdout if errors[0] in proc.stdout else proc.stderr
    assert stream.splitlines()[-1] == errors[0]  # the last line says what failed
    assert len(output.splitlines()) <= 12, output  # no Spark log lines, no traceback
    assert set(os.listdir(folder)) == before  # no partial output, no staging folder


def test_a_column_spark_reads_as_another_type_is_one_line_and_leaves_nothing(spark, files):
    """"bad data": refused on the driver once Spark read the input's schema, through the
    job's Python entry point on the module's session (a failure's process, its one last
    line and its quiet output: the spark-submit cases above)."""
    folder, _, _ = files
    expected, status = FAILURES["bad data"]
    before = set(os.listdir(folder))
    with pytest.raises(Exception) as caught:
        score(spark, HadoopPaths(spark), parse_args(failing_args(folder, "bad data", "out")))
    line, found = outcome(caught.value)
    assert found == status and expected in line and "\n" not in line, line
    assert set(os.listdir(folder)) == before  # no partial output, no staging folder


# (a missing model and a column the input lacks are answered before Spark starts: each is
# checked without a JVM in test_score_early)
@pytest.mark.slow  # about 20 s
@pytest.mark.parametrize("case", ["bad master", "unreachable master", "bad conf"])
def test_a_bad_master_or_setting_is_one_line_naming_it(files, case, tmp_path):
    """Run as ``spark-keras score`` runs it (no spark-submit, which takes --master itself):
    a setting the job cannot use stops it before any job, with status 2, in one line
    that gives Spark's cause (or the host and port no master answers at, within seconds
    where Spark's client would retry for a minute), and nothing of the JVM's output but
    the name of the file holding it."""
    import time

    folder, _, _ = files
    expected, status = FAILURES[case]
    args = failing_args(folder, case, "out")
    before = set(os.listdir(folder))
    started = time.monotonic()
    proc = run_score_job(*args, TMPDIR=str(tmp_path))
    # (Spark's own client retries an unreachable master for a minute, after the JVM's
    # start; 30 s was passed under CI's load by a job refused before any Spark job)
    assert time.monotonic() - started < 55
    assert proc.returncode == status, (proc.stdout + proc.stderr)[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("score.py: error:"), lines
    assert expected in lines[-1], lines
    assert set(os.listdir(folder)) == before
    if case != "bad conf":  # the JVM started: its output is in the file the line names
        log = re.search(r"\(Spark's own output: (\S+)\)$", lines[-1])[1]
        assert os.path.dirname(log) == str(tmp_path)
        assert "log4j" in open(log).read()


@pytest.mark.slow  # a whole job whose executors fail: about a minute
def test_executors_that_cannot_import_the_package_are_one_line_saying_so(files, tmp_path):
    """Executors given a Python without the package (a bare venv): exit 2 and a line
    naming the module and the setting that mends it, not the daemon's EOFException."""
    folder, _, _ = files
    import venv

    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(bare)  # no numpy, no spark_keras
    args = failing_args(folder, "bad master", "out")
    args[args.index("--master") + 1] = "local[1]"
    proc = run_score_job(*args, "--conf", f"spark.pyspark.python={bare / 'bin' / 'python'}")
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == 2, lines[-20:]
    # BroadcastModel checks the workers' Python before any task: one line, not the model's fault
    assert lines[-1].startswith("score.py: error: Spark's Python workers run "), lines[-5:]
    assert "which cannot import spark_keras" in lines[-1], lines[-1]
    # Spark's start-up lines and two progress bars come before the job's settings apply
    assert "spark.pyspark.python" in lines[-1] and len(lines) <= 20, lines


# --- Spark Connect -------------------------------------------------------------------------
# A local Connect server always listens on port 15002: the jobs below run one at a time.


def needs_connect() -> None:
    import pyspark

    pytest.importorskip("grpc")
    pytest.importorskip("zstandard")
    if int(pyspark.__version__.split(".")[0]) < 4:  # the server jar ships in the wheel from 4.0
        pytest.skip(f"PySpark {pyspark.__version__} has no local Spark Connect server")


# A successful Connect job (``--remote local[2]`` from another folder, relative paths, over
# an old output): test_score_imports, with the user's own layers.


@pytest.mark.parametrize("case", ["output exists", "missing input", "master and remote", "bad row"])
@pytest.mark.slow  # one Connect job per case
def test_connect_failures_are_one_line_and_leave_nothing(files, case):
    """Through ``SPARK_REMOTE``: the same one-line errors and statuses as classic. Path
    errors are found on the client before a server starts; only "bad row" runs a job
    (it fails while writing the staging folder, which must be gone afterwards)."""
    needs_connect()
    folder, _, _ = files
    expected, status = FAILURES[case]
    args = failing_args(folder, case, "connect-out")
    before = set(os.listdir(folder))
    proc = run_score_job(*args, SPARK_REMOTE="local[2]", server=case == "bad row")
    assert proc.returncode == status, (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("score.py: error:")]
    assert len(errors) == 1 and expected in errors[0], proc.stderr[-3000:]
    assert "SCORED" not in proc.stdout
    assert set(os.listdir(folder)) == before  # no output, no staging folder


def test_connect_path_never_touches_the_jvm():
    """A Connect session has no SparkContext: every use of one (and of SparkConf) lives
    in classic-only code (the classic session, Hadoop's file operations), which the job's
    ``_open`` reaches only without a remote."""
    jvm = {"sparkContext", "_jvm", "_jsc", "SparkConf"}

    def tree_of(*parts: str) -> ast.Module:
        with open(os.path.join(REPO_ROOT, "spark_keras", *parts), encoding="utf-8") as f:
            return ast.parse(f.read())

    def jvm_users(tree: ast.Module) -> set[str]:
        return {top.name for top in tree.body
                if isinstance(top, (ast.FunctionDef, ast.ClassDef))
                for node in ast.walk(top)
                if (isinstance(node, ast.Attribute) and node.attr in jvm)
                or (isinstance(node, ast.Name) and node.id in jvm)
                or (isinstance(node, ast.alias) and node.name in jvm)}

    assert jvm_users(tree_of("jobs", "score", "main.py")) == set()
    assert jvm_users(tree_of("jobs", "score", "errors.py")) == set()
    assert jvm_users(tree_of("jobs", "score", "session.py")) == {"classic_session"}
    assert jvm_users(tree_of("spark", "paths.py")) == {"hadoop_filesystem"}
    assert jvm_users(tree_of("jobs", "score", "files.py")) == set()  # through hadoop_filesystem
    arrow = tree_of("jobs", "score", "arrow_paths.py")  # Connect's paths: no JVM, nor Hadoop's
    assert jvm_users(arrow) == set()
    used = {n.id for n in ast.walk(arrow) if isinstance(n, ast.Name)} | {
        a.name for n in ast.walk(arrow) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not used & {"hadoop_filesystem", "hadoop_qualified", "HadoopPaths"}, used
    assert jvm_users(tree_of("jobs", "score", "checks.py")) == set()  # _open's, either side
    run = tree_of("jobs", "score", "run.py")
    assert jvm_users(run) == set()
    classic = {"classic_session", "HadoopPaths"}
    open_ = next(top for top in run.body if getattr(top, "name", None) == "_open")
    # the first branch: ``if <remote>: ... return``, before any classic-only call
    guard = next(node for node in open_.body if isinstance(node, ast.If))
    assert "remote" in ast.unparse(guard.test), ast.unparse(guard)
    before = open_.body[:open_.body.index(guard)]
    assert not {n.id for s in before for n in ast.walk(s) if isinstance(n, ast.Name)} & classic
    assert isinstance(guard.body[-1], ast.Return) and not guard.orelse
    called = {n.func.id for n in ast.walk(guard) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)}
    assert not called & classic, called
