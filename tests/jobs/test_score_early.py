"""The score job's answers that need no Spark arrive before Spark starts (issue 55, item 3),
each within 5 s: a missing model, a file that is not a model, a feature or id column the
input lacks (a Parquet folder with partitions, a CSV file), a ``--resume`` its output
refuses; classic and ``--remote local[2]``. And a model saved again does not block
``--resume`` (item 7): the manifest compares its config and weights digests, naming which
differs. No Spark anywhere here: the job runs in a fresh Python that must never start a
JVM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import keras
import numpy as np
import pandas as pd
import pytest

import spark_keras as sk
from spark_keras.jobs.score import manifest
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.early import model_digests
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.run import manifest_options
from tests import models
from tests.conftest import REPO_ROOT

# runs the job's main() per case in one fresh Python; then says whether a JVM was started
_RUNNER = """
import contextlib, io, json, sys, time
from spark_keras.jobs.score.main import main
found = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stderr(err):
        status = main(argv, prog="score")
    found.append([status, err.getvalue().strip(), time.perf_counter() - started])
from pyspark import SparkContext
print(json.dumps({"cases": found, "jvm": SparkContext._gateway is not None}))
"""


def _answers(cases: list[list[str]]) -> tuple[list, bool]:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    proc = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(cases)], cwd=REPO_ROOT,
                          env=dict(env, TF_CPP_MIN_LOG_LEVEL="2"), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return found["cases"], found["jvm"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("early")
    model = models.mlp(n_features=4, hidden=8, outputs=1)
    model.save(folder / "model.keras")
    x = np.random.default_rng(3).standard_normal((20, 4)).astype("float32")
    for part in ("a", "b"):  # a partitioned Parquet folder: k=a/, k=b/
        (folder / "in" / f"k={part}").mkdir(parents=True)
        pd.DataFrame({"id": np.arange(10), "features": list(x[:10])}).to_parquet(
            folder / "in" / f"k={part}" / "part-0.parquet", index=False)
    pd.DataFrame({"id": np.arange(3), "f0": [1.0, 2.0, 3.0]}).to_csv(folder / "in.csv",
                                                                      index=False)
    (folder / "notes.keras").write_text("not a model\n")
    return folder


def _committed(folder, argv: list[str]) -> None:
    """The commit log a ``--resume`` run with ``argv`` begins with (its manifest), as the
    job writes it, with nothing committed yet."""
    args = parse_args(argv)
    made = manifest.plan(ArrowPaths(), args.input, None, model_sha256=manifest.file_sha256(args.model),
                         model_digests=model_digests(args.model), options=manifest_options(args),
                         commit_bytes=args.commit_bytes, overwrite=False, spark_files=None)
    log = folder / args.output / manifest.LOG
    log.mkdir(parents=True, mode=0o700)
    os.chmod(folder / args.output, 0o700)
    (log / manifest.MANIFEST).write_text(json.dumps(made.manifest))


def test_answers_that_need_no_spark_come_before_it_starts(folder):
    """Each answer within 5 s of main() being called, exit 2, one line naming the fault,
    and no JVM started in the process (before the fix: Spark started first, 20-50 s)."""
    base = ["--model", str(folder / "model.keras"), "--input", str(folder / "in"),
            "--features", "features"]
    resumed = base + ["--output", str(folder / "resumed"), "--resume"]
    _committed(folder, resumed)
    cases = {
        "missing model": (["--model", str(folder / "gone.keras")], "does not exist"),
        "missing input": (["--input", str(folder / "gone.parquet")], "input path"),
        "output exists": (["--output", str(folder / "in.csv")], "exists; pass --overwrite"),
        "not a model": (["--model", str(folder / "notes.keras")],
                        "neither a spark_keras payload nor a .keras file"),
        "missing column": (["--features", "feature"], "feature column(s) ['feature'] not in "
                           "the input; it has ['id', 'features', 'k']"),
        "missing id column": (["--id-col", "key"], "--id-col 'key' is not a column"),
        "csv column": (["--input", str(folder / "in.csv"), "--features", "f0,f1"],
                       "['f1'] not in the input; it has ['id', 'f0']"),
        "resume refused": (["--output", str(folder / "resumed"), "--resume", "--output-col",
                            "score"], "--output-col differs ('score' now, 'prediction'"),
        "connect column": (["--remote", "local[2]", "--features", "feature"],
                           "feature column(s) ['feature'] not in"),
    }
    argv = [base + ["--output", str(folder / "out")] + extra for extra, _ in cases.values()]
    answers, jvm = _answers(argv)
    for (case, (_, said)), (status, line, seconds) in zip(cases.items(), answers):
        assert status == 2 and said in line and "\n" not in line, (case, line)
        assert seconds < 5, (case, seconds, line)
    assert not jvm, "a JVM was started: Spark ran before the answer"
    assert not (folder / "out").exists()


def test_a_model_saved_again_resumes_and_a_changed_one_names_what_changed(folder, tmp_path):
    """The same model saved twice (another file: Keras records when) plans the same
    manifest; changed weights, a changed config: refused naming which. A payload file
    saved twice likewise."""
    model = models.mlp(n_features=4, hidden=8, outputs=1)
    argv = ["--input", str(folder / "in"), "--output", str(tmp_path / "out"), "--features",
            "features", "--resume"]

    def planned(model_file) -> dict:
        args = parse_args(["--model", str(model_file), *argv])
        return manifest.plan(ArrowPaths(), args.input, None,
                             model_sha256=manifest.file_sha256(args.model),
                             model_digests=model_digests(args.model),
                             options=manifest_options(args), commit_bytes=None,
                             overwrite=False, spark_files=None).manifest

    def differ(a, b) -> str | None:
        return manifest.difference(planned(a), planned(b), str(folder / "in"))

    model.save(tmp_path / "a.keras")
    time.sleep(1.1)  # Keras records the second it was saved
    model.save(tmp_path / "b.keras")
    assert manifest.file_sha256(str(tmp_path / "a.keras")) != \
        manifest.file_sha256(str(tmp_path / "b.keras"))
    assert differ(tmp_path / "a.keras", tmp_path / "b.keras") is None
    sk.save(model, tmp_path / "a.skp")
    sk.save(model, tmp_path / "b.skp")
    assert differ(tmp_path / "a.skp", tmp_path / "b.skp") is None

    model.set_weights([w + 1.0 for w in model.get_weights()])
    model.save(tmp_path / "weights.keras")
    said = differ(tmp_path / "a.keras", tmp_path / "weights.keras")
    assert said is not None and said.startswith("the model is another one (weights differ"), said
    model.layers[0].activation = keras.activations.get("tanh")
    model.save(tmp_path / "both.keras")
    said = differ(tmp_path / "weights.keras", tmp_path / "both.keras")
    assert said is not None and said.startswith("the model is another one (config differ"), said
    said = differ(tmp_path / "a.keras", tmp_path / "both.keras")
    assert said is not None and "(config and weights differ" in said, said


def test_a_manifest_without_model_digests_compares_the_file(folder, tmp_path):
    """A commit log written before the digests existed: the model file's SHA-256 still
    decides, as it did."""
    old = {"format": manifest.FORMAT, "model_sha256": "a" * 64, "options": {},
           "commit_bytes": 1, "files": []}
    new = dict(old, model_digests={"config": "c", "weights": "w"})
    assert manifest.difference(old, new, "in") is None
    said = manifest.difference(old, dict(new, model_sha256="b" * 64), "in")
    assert said is not None and said.startswith("the model is another one (sha256 bbbbbbbbbbbb"), said


@pytest.mark.parametrize("text, spark_names, answered", [
    ("\ufeffid,x\n1,2\n", ["id", "x"], True),  # a byte order mark (Excel's CSV): Spark drops it
    ("\n  \nid,x\n1,2\n", ["id", "x"], True),  # blank lines first: Spark skips them
    ("id,,x\n1,2,3\n", ["id", "_c1", "x"], True),
    ("a,a,b\n1,2,3\n", ["a0", "a1", "b"], False),  # repeated names: Spark adds their places
    ("A,a,b\n1,2,3\n", ["A0", "a1", "b"], False),
    ('"a,b","c ""q""",d\n1,2,3\n', ["a,b", '"c ""q"""', "d"], False),  # Spark's quoting: \ escapes
])
def test_csv_header_names_are_sparks_or_no_answer(tmp_path, text, spark_names, answered):
    """The early answer's CSV columns are those Spark 4's reader (header=True) gives for
    the file (measured with PySpark 4.3), or none at all, never others: a valid
    job (``--id-col id`` of a file with a byte order mark, ``--features a0``) was refused."""
    from spark_keras.jobs.score.early import input_columns

    (tmp_path / "in.csv").write_text(text, encoding="utf-8", newline="")
    found = input_columns(ArrowPaths(), str(tmp_path / "in.csv"), "csv")
    assert found == (spark_names if answered else None), found
