"""The score job's outputs (issue 46, items 3, 5 and 6): the quarantine of invalid rows
(``--invalid-output``, ``--drop-invalid``), invalid rows counted by class of reason in
the metrics, ``--output-format``, ``--partition-by`` and ``--output-table``, each with
``--resume``. The job's Python entry point (``score_run.score``) runs in the shared
session, as in tests/jobs/test_score_resume.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.jobs.score import lease as score_lease
from spark_keras.jobs.score.files import HadoopPaths
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.manifest import difference
from spark_keras.jobs.score.run import score
from tests import models
from tests.jobs.test_score_lease import _holder
from tests.jobs.test_score_resume import refusal

ROWS = 40  # per input file
FILES = 4  # k=0/part-0, k=0/part-1, k=1/part-2, k=1/part-3
# invalid rows of the array column ``features`` (the scalar columns f0..f5 are all valid)
NAN, NULL, SHORT, NAN2 = 15, 55, 95, 135
BAD = sorted((NAN, NULL, SHORT, NAN2))
CLASSES = {"input: NaN": 2, "input: null": 1, "input: shape": 1}
SCALARS = [f"f{i}" for i in range(6)]
TOKEN = "00000000000000000001aaaaaaaa"  # a live job's claim, made before any run here
HOLDER = f"holder-{TOKEN}.json"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("score-outputs"))


def write_data(folder):
    """Four input files in two partition folders (``k=0``, ``k=1``): an id, six scalar
    feature columns and the same values as an array column, with four invalid rows in
    it (``in``; ``scalar``: the same without the array column); a model of three outputs
    (array predictions) and one of one (scalar ones)."""
    x = np.random.default_rng(5).standard_normal((FILES * ROWS, 6))
    features = [list(r.astype("float32")) for r in x]
    features[NAN][2] = np.float32("nan")
    features[NAN2][0] = np.float32("nan")
    features[NULL] = None
    features[SHORT] = [1.0, 2.0, 3.0]
    for f in range(FILES):
        part = folder / "in" / f"k={f // 2}"
        part.mkdir(parents=True, exist_ok=True)
        rows = slice(f * ROWS, (f + 1) * ROWS)
        columns = {"id": pa.array(np.arange(FILES * ROWS)[rows], pa.int64()),
                   **{c: pa.array(x[rows, i]) for i, c in enumerate(SCALARS)},
                   "features": pa.array(features[rows], pa.list_(pa.float32()))}
        pq.write_table(pa.table(columns), part / f"part-{f}.parquet")
        scalar = folder / "scalar" / f"k={f // 2}"  # what CSV can hold
        scalar.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns).drop(["features"]), scalar / f"part-{f}.parquet")
    sk.save(models.mlp(n_features=6, hidden=8, outputs=3), str(folder / "model.skp"))
    sk.save(models.mlp(n_features=6, hidden=8, outputs=1), str(folder / "scalar.skp"))
    return folder


def job_args(data, *extra: str, per_group: int | None = None, model: str = "model.skp",
             features: str = "features", source: str = "in"):
    """The job's options on the input; ``per_group`` input files in a commit (--resume)."""
    resume = [] if per_group is None else [
        "--resume", "--commit-bytes",
        str(per_group * os.path.getsize(data / "in" / "k=0" / "part-0.parquet") + 10)]
    return parse_args(["--model", str(data / model), "--input", str(data / source),
                       "--features", features, *resume, *extra])


def read(spark, path, fmt="parquet"):
    """A dataset as Spark's reader sees it (CSV with its header), by id."""
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.options(header=True, inferSchema=True)
    return reader.load(str(path)).toPandas().sort_values("id").reset_index(drop=True)


def predictions(frame, column="prediction") -> list:
    """The predictions as bits (None for a null one), for comparing runs exactly."""
    return [None if p is None or (np.isscalar(p) and np.isnan(p))
            else np.asarray(p, "float32").view(np.uint32).tolist() for p in frame[column]]


# --- reasons counted, quarantine --------------------------------------------------------------

def test_options_that_do_not_go_together_are_refused(spark, data, tmp_path):
    """One line, exit 2, before anything is written."""
    cases = [
        (["--invalid-output", str(tmp_path / "q")], "--invalid-output needs --on-invalid null"),
        (["--on-invalid", "null", "--drop-invalid"], "--drop-invalid needs --invalid-output"),
        (["--on-invalid", "null", "--invalid-output", str(tmp_path / "out")],
         f"--invalid-output '{tmp_path / 'out'}' is --output '{tmp_path / 'out'}' itself: give "
         f"it a folder of its own"),
        # folders inside one another: a resumed run would never resume (the quarantine's
        # files are files the output's commit log does not know; the output's are input
        # files Spark reads), a fresh one would remove the input with its output
        (["--on-invalid", "null", "--invalid-output", str(tmp_path / "out" / "invalid")],
         f"--invalid-output '{tmp_path / 'out' / 'invalid'}' is inside --output "
         f"'{tmp_path / 'out'}': give it a folder outside"),
        (["--on-invalid", "null", "--invalid-output", str(tmp_path / "q"), "--output",
          str(tmp_path / "q" / "scored")], "is inside --invalid-output"),
        (["--output", str(data / "in" / "scored")], f"--output '{data / 'in' / 'scored'}' is "
         f"inside --input '{data / 'in'}': give it a folder outside"),
        (["--output", "file://" + str(data / "in" / "k=0" / "scored")], "is inside --input"),
        (["--partition-by", "day"], "--partition-by column 'day' is not a column of the input"),
        (["--on-invalid", "null", "--invalid-output", str(tmp_path / "q"), "--error-col", "k"],
         "the input has a column 'k', the quarantine's name for it: name it with --error-col"),
        (["--output-format", "csv"], "--output-format csv cannot hold column(s) ['features "
                                     "(array<float>)', 'prediction (array<float>)'] of the "
                                     "output: give parquet, orc or json"),
    ]
    for extra, says in cases:
        line = refusal(spark, job_args(data, "--output", str(tmp_path / "out"), *extra))
        assert says in line, line
    assert not os.listdir(tmp_path)
    (tmp_path / "q").mkdir()
    line = refusal(spark, job_args(data, "--output", str(tmp_path / "out"), "--on-invalid",
                                   "null", "--invalid-output", str(tmp_path / "q")))
    assert line == f"invalid rows' output path '{tmp_path / 'q'}' exists; pass --overwrite " \
                   f"to replace it", line
    with pytest.raises(SystemExit):  # argparse: one of the two
        parse_args(["--model", "m", "--input", "i", "--features", "f"])


def test_the_quarantine_holds_exactly_the_invalid_rows(spark, data, tmp_path):
    """The invalid rows, with the input's columns as read, their reason and the model
    version, in a dataset of their own; the output keeps them as null rows (or drops
    them: --drop-invalid); the metrics count them by class of reason."""
    out, quarantine, metrics = tmp_path / "out", tmp_path / "invalid", tmp_path / "m.json"
    args = job_args(data, "--output", str(out), "--on-invalid", "null", "--id-col", "id",
                    "--invalid-output", str(quarantine), "--metrics-json", str(metrics))
    summary = score(spark, HadoopPaths(spark), args)
    assert summary["rows"] == FILES * ROWS and summary["invalid_rows"] == len(BAD)
    assert summary["invalid_by_reason"] == CLASSES, summary
    assert json.loads(metrics.read_text())["invalid_by_reason"] == CLASSES
    main = read(spark, out)
    assert list(main.columns) == ["id", *SCALARS, "features", "k", "prediction"]
    assert main["id"].tolist() == list(range(FILES * ROWS))
    assert [i for i, p in zip(main["id"], main["prediction"]) if p is None] == BAD
    held = read(spark, quarantine)
    assert list(held.columns) == ["id", *SCALARS, "features", "k", "reason", "model_version"]
    assert held["id"].tolist() == BAD
    assert set(held["model_version"]) == {"1"}
    why = dict(zip(held["id"], held["reason"]))
    assert "NaN or infinite value(s), first at row id=15" in why[NAN], why
    assert "null value(s)" in why[NULL] and "3 values" in why[SHORT], why
    read_back = dict(zip(held["id"], held["features"]))  # the rows as they were read
    assert read_back[NULL] is None and read_back[SHORT].tolist() == [1.0, 2.0, 3.0]
    assert held.set_index("id").loc[SHORT, "f3"] == main.set_index("id").loc[SHORT, "f3"]


def test_drop_invalid_leaves_them_out_of_the_output_only(spark, data, tmp_path):
    """--drop-invalid, the reason and version under the user's names (--error-col,
    --version-col): the output holds the valid rows, the quarantine the others."""
    out, quarantine = tmp_path / "out", tmp_path / "invalid"
    args = job_args(data, "--output", str(out), "--on-invalid", "null",
                    "--invalid-output", str(quarantine), "--drop-invalid",
                    "--error-col", "why", "--version-col", "v", "--model-version", "7")
    summary = score(spark, HadoopPaths(spark), args)
    assert summary["invalid_by_reason"] == CLASSES and summary["rows"] == FILES * ROWS
    dropped = read(spark, out)
    assert dropped["id"].tolist() == [i for i in range(FILES * ROWS) if i not in BAD]
    assert dropped["why"].isna().all() and set(dropped["v"]) == {"7"}
    assert dropped["prediction"].notna().all()
    held = read(spark, quarantine)
    assert list(held.columns)[-2:] == ["why", "v"] and held["id"].tolist() == BAD
    assert set(held["v"]) == {"7"}


def _counting(folder: str):
    """A preprocess function that records how many rows each call gets, in ``folder``."""
    def preprocess(batch):
        import uuid

        with open(os.path.join(folder, uuid.uuid4().hex), "w") as f:
            f.write(str(len(batch)))
        return batch.to_numpy(dtype="float32")
    return preprocess


def test_the_output_and_the_quarantine_are_scored_once(spark, data, tmp_path):
    """Two writes of one scored DataFrame (its invalid rows, then the output): the rows
    go through the model once (held between the writes), and the observation counts
    them once."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from spark_keras.jobs.score.outputs import Outputs

    calls = tmp_path / "calls"
    calls.mkdir()
    frame = spark.read.parquet(str(data / "scalar"))
    outputs = Outputs("parquet", None, str(tmp_path / "out"), None, str(tmp_path / "q"),
                      False, None, None, frame.columns)
    handle = sk.BroadcastModel(spark, models.mlp(n_features=6, hidden=8, outputs=1),
                               preprocess=_counting(str(calls)))
    try:
        error_col, version_col = outputs.transform_cols()
        seen = Observation("once")
        nans = frame.withColumn("f1", F.when(frame.id % 50 == 0, float("nan"))
                                .otherwise(frame.f1))
        scored = handle.transform(nans, SCALARS, on_invalid="null", error_col=error_col,
                                  version_col=version_col, observe=seen)
        outputs.write(scored, str(tmp_path / "out"), str(tmp_path / "q"))
    finally:
        handle.destroy()
    assert sum(int(p.read_text()) for p in calls.iterdir()) == FILES * ROWS
    assert seen.get["rows"] == FILES * ROWS
    assert seen.get["invalid_by_reason"] == {"input: NaN": 4}, seen.get
    assert read(spark, tmp_path / "q")["id"].tolist() == [0, 50, 100, 150]
    assert len(read(spark, tmp_path / "out")) == FILES * ROWS


def _hold(folder_of) -> subprocess.Popen:
    """A live job's lease on the folder ``folder_of``: its holder file, naming a running
    process of this host (``sleep``; kill it to end that job)."""
    other = subprocess.Popen(["sleep", "300"])
    _holder(score_lease.lease_folder(os.path.realpath(folder_of)), TOKEN,
            host=socket.gethostname(), pid=other.pid,
            pid_start=score_lease._process_start(other.pid), started="earlier")
    return other


@contextlib.contextmanager
def _held(folder_of) -> Iterator[subprocess.Popen]:
    other = _hold(folder_of)
    try:
        yield other
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("as_", ["--output", "--invalid-output"])
def test_a_plain_run_refuses_a_folder_another_job_holds(spark, data, tmp_path, as_):
    """A run without --resume holds the leases of its output and quarantine too
    (score_lease): beside a live job holding a folder, an --overwrite run that would
    replace it, as its output or as its quarantine, stops before it scores or removes
    anything, exit 2, naming that job; once that job is gone it takes the folder over,
    and leaves no lease behind."""
    held = tmp_path / "held"
    held.mkdir()
    (held / "part-kept").write_text("the other job's commit")
    folder = score_lease.lease_folder(str(held))
    mine = {"--output": str(tmp_path / "mine"), "--invalid-output": str(tmp_path / "q"),
            as_: str(held)}
    args = job_args(data, "--overwrite", "--on-invalid", "null", "--output", mine["--output"],
                    "--invalid-output", mine["--invalid-output"])
    with _held(held) as other:
        line = refusal(spark, args)
        assert line == (f"output '{held}' is being written by another score job (pid "
                        f"{other.pid} on host '{socket.gethostname()}', started earlier): one "
                        f"job at a time per output (its lease: '{folder}')"), line
        assert sorted(p.name for p in held.iterdir()) == ["part-kept"]
        assert not os.path.exists(tmp_path / "mine") and not os.path.exists(tmp_path / "q")
        assert os.listdir(folder) == [HOLDER]
    summary = score(spark, HadoopPaths(spark), args)  # its holder is gone: taken over
    assert summary["rows"] == FILES * ROWS
    assert len(read(spark, mine["--output"])) == FILES * ROWS
    assert read(spark, mine["--invalid-output"])["id"].tolist() == BAD
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no lease left


def test_a_run_interrupted_while_taking_its_leases_holds_none(spark, data, tmp_path):
    """Ctrl-C (a real SIGINT) in the settle second of the quarantine's lease, the second
    one taken: the job's Python entry point raises KeyboardInterrupt and holds nothing
    afterwards (its holder named this live process to every rerun); a rerun in the same
    process (a notebook) goes on."""
    args = job_args(data, "--overwrite", "--on-invalid", "null", "--output",
                    str(tmp_path / "out"), "--invalid-output", str(tmp_path / "q"))
    second = score_lease.lease_folder(str(tmp_path / "q"))

    def ctrl_c_in_the_settle_second() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                os.path.isdir(second)
                and any(n.startswith("holder-") for n in os.listdir(second))):
            time.sleep(0.01)
        time.sleep(score_lease.SETTLE_SECONDS / 3)
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, whatever this process was started with (a background
    # job of a script, as CI runs make test, starts with SIGINT ignored)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=ctrl_c_in_the_settle_second, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            score(spark, HadoopPaths(spark), args)
    finally:
        signal.signal(signal.SIGINT, before)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no lease left
    assert score(spark, HadoopPaths(spark), args)["rows"] == FILES * ROWS


def test_a_plain_run_does_not_replace_an_output_published_while_it_scored(spark, data, tmp_path):
    """Without --overwrite, an output that another job published after this one's check
    (before its lease) is not replaced at the end: refused, the staging folder removed."""
    from spark_keras.jobs.score.errors import JobError
    from spark_keras.jobs.score.outputs import Outputs
    from spark_keras.jobs.score.run import _publish

    out = tmp_path / "out"
    frame = spark.read.parquet(str(data / "scalar"))
    outputs = Outputs("parquet", None, str(out), None, None, False, None, None, frame.columns)
    out.mkdir()
    (out / "part-theirs").write_text("published meanwhile")
    with pytest.raises(JobError, match=rf"output path '{out}' was written by another job while "
                                       rf"this one scored; pass --overwrite to replace it"):
        _publish(frame, HadoopPaths(spark), outputs, False, lambda: None)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    assert os.listdir(out) == ["part-theirs"]


def test_a_resumed_quarantine_equals_an_uninterrupted_one(spark, data, tmp_path):
    """Each commit publishes its group's invalid rows with its output files: a run killed
    while publishing a group (one quarantine file still in staging) and before another
    was committed resumes to the uninterrupted output and quarantine, no row twice; the
    metrics count the reasons of the rows this run scored."""
    out, quarantine = tmp_path / "out", tmp_path / "invalid"
    args = job_args(data, "--output", str(out), "--on-invalid", "null", "--id-col", "id",
                    "--invalid-output", str(quarantine), "--drop-invalid", per_group=2)
    first = score(spark, HadoopPaths(spark), args)
    assert first["groups"] == 2 and first["invalid_by_reason"] == CLASSES, first
    reference, held = read(spark, out), read(spark, quarantine)
    assert held["id"].tolist() == BAD and len(reference) == FILES * ROWS - len(BAD)
    log = out / "_spark_keras" / "commits"
    records = [json.loads((log / f"g{i:05d}.json").read_text()) for i in range(2)]
    assert [r["invalid_by_reason"] for r in records] == \
        [{"input: NaN": 1, "input: null": 1}, {"input: NaN": 1, "input: shape": 1}]
    assert all(r["invalid_files"] and r["files"] for r in records)
    assert (quarantine / "_SUCCESS").exists()
    # group 0: killed while its quarantine file was renamed in (rolled forward)
    (log / "g00000.json").rename(log / "g00000.moving.json")
    staging = quarantine / records[0]["invalid_staging"]
    staging.mkdir(parents=True)  # in its wave's folder
    name = records[0]["invalid_files"][0]
    (quarantine / name).rename(staging / name.split("-", 1)[1])
    # group 1: killed while Spark wrote it (no record: its files are removed, scored again)
    (log / "g00001.json").unlink()
    (quarantine / "_SUCCESS").unlink()
    second = score(spark, HadoopPaths(spark), args)
    assert (second["groups"], second["groups_skipped"]) == (1, 1), second
    assert second["invalid_by_reason"] == {"input: NaN": 1, "input: shape": 1}
    again, held_again = read(spark, out), read(spark, quarantine)
    assert held_again["id"].tolist() == BAD  # each invalid row once
    assert held_again.drop(columns="features").equals(held.drop(columns="features"))
    assert again["id"].tolist() == reference["id"].tolist()
    assert predictions(again) == predictions(reference)
    assert not [p for p in quarantine.iterdir() if p.name.startswith("_staging")]
    # the quarantine is one of the options a resumed run must keep
    line = refusal(spark, job_args(data, "--output", str(out), "--on-invalid", "null",
                                   "--id-col", "id", "--invalid-output", str(quarantine),
                                   per_group=2))
    assert "--drop-invalid differs (False now, True for the committed groups)" in line, line


def test_a_difference_in_the_new_options_is_named():
    base = {"format": 1, "model_sha256": "a" * 64, "commit_bytes": 100, "files": [],
            "options": {"features": ["f"], "output_col": "prediction"}}  # before item 6
    now = {**base, "options": {**base["options"], "output_format": "parquet",
                               "partition_by": None, "invalid_output": None,
                               "drop_invalid": False}}
    assert difference(base, now, "in") is None  # what an older log meant
    for key, value, flag in (("output_format", "orc", "--output-format"),
                             ("partition_by", ["k"], "--partition-by"),
                             ("invalid_output", "bad/", "--invalid-output")):
        changed = {**now, "options": {**now["options"], key: value}}
        assert difference(base, changed, "in").startswith(f"{flag} differs ("), key


# --- formats, partitions, tables ------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "csv"])  # orc: the table test
def test_each_format_partitioned_resumes_to_the_uninterrupted_output(spark, data, tmp_path, fmt):
    """--output-format and --partition-by k with --resume: files in k=... folders, read
    back by Spark's reader of that format as one dataset; a rerun after a group was half
    published (one file back in its staging folder's k=... folder) and another never
    committed gives the same rows, each once."""
    out = tmp_path / "out"
    args = job_args(data, "--output", str(out), "--output-format", fmt, "--partition-by", "k",
                    per_group=2, model="scalar.skp", features=",".join(SCALARS),
                    source="scalar")
    score(spark, HadoopPaths(spark), args)
    reference = read(spark, out, fmt)
    assert reference["id"].tolist() == list(range(FILES * ROWS))
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith((".", "_"))) == \
        ["k=0", "k=1"]
    log = out / "_spark_keras" / "commits"
    records = [json.loads((log / f"g{i:05d}.json").read_text()) for i in range(2)]
    assert all(n.startswith(f"k={i}/g{i:05d}-part-") and f".{fmt}" in n
               for i, r in enumerate(records) for n in r["files"]), records
    (log / "g00000.json").rename(log / "g00000.moving.json")
    staged = out / records[0]["staging"] / "k=0"
    staged.mkdir(parents=True)
    name = records[0]["files"][0]
    (out / name).rename(staged / name.split("/", 1)[1].split("-", 1)[1])
    (log / "g00001.json").unlink()
    resumed = score(spark, HadoopPaths(spark), args)
    assert (resumed["groups"], resumed["groups_skipped"]) == (1, 1), resumed
    again = read(spark, out, fmt)
    assert again["id"].tolist() == reference["id"].tolist()
    assert predictions(again) == predictions(reference)
    line = refusal(spark, job_args(data, "--output", str(out), "--partition-by", "k",
                                   per_group=2, model="scalar.skp", features=",".join(SCALARS),
                                   source="scalar"))
    assert f"--output-format differs ('parquet' now, {fmt!r} for the committed groups)" in line


@pytest.fixture
def database(spark, tmp_path):
    """A database whose tables live under ``tmp_path`` (not the session's warehouse)."""
    spark.sql(f"CREATE DATABASE sk_job_tables LOCATION '{tmp_path / 'warehouse'}'")
    yield "sk_job_tables"
    spark.sql("DROP DATABASE sk_job_tables CASCADE")


def _commits_of(location) -> list[str]:
    log = os.path.join(location, "_spark_keras", "commits")
    return sorted(n for n in os.listdir(log) if n.endswith(".json")) \
        if os.path.isdir(log) else []


@pytest.mark.parametrize("resume", [True, False], ids=["resume-overwrite", "plain-overwrite"])
def test_an_overwrite_run_leaves_a_table_a_live_job_writes(spark, data, database, tmp_path,
                                                           resume):
    """A --resume run into a table is live (its lease on the table's folder): a second
    --overwrite run into that table, resumable or not, stops before it removes anything:
    exit 2, the table's rows and the live job's commit log kept (a resumable one dropped
    the table first, a plain one replaced it)."""
    name = f"{database}.held"
    score(spark, HadoopPaths(spark), job_args(data, "--output-table", name, "--on-invalid",
                                              "null", per_group=1))
    location = tmp_path / "warehouse" / "held"
    before = _commits_of(location)
    assert len(before) == FILES and spark.table(name).count() == FILES * ROWS
    with _held(location):
        line = refusal(spark, job_args(data, "--output-table", name, "--on-invalid", "null",
                                       "--overwrite", per_group=1 if resume else None))
        assert "is being written by another score job" in line, line
        assert _commits_of(location) == before
        assert spark.table(name).count() == FILES * ROWS


@pytest.mark.parametrize("folder, spelled", [
    ("warehouse", "{db}.Later"),
    ("ware house", "{db}.later"),  # the database's URI says ware%20house
    ("warehouse", " {db} . later "),  # spaces Spark's parser drops
])
def test_a_table_not_made_yet_is_leased_where_spark_will_make_it(spark, data, tmp_path,
                                                                  folder, spelled):
    """The folder of a table that does not exist yet is where Spark makes it (the
    database's folder, the name in lower case), so a job that holds it (a --resume run
    making that table) refuses a plain run into it before anything is written (there was
    no lease: the plain run replaced the table that job made while it scored), and the
    lease leaves nothing behind."""
    from spark_keras.jobs.score.outputs import table_folder, table_location

    spark.sql(f"CREATE DATABASE sk_job_later LOCATION '{tmp_path / folder}'")
    try:
        name = spelled.format(db="sk_job_later")
        future = table_folder(spark, name)
        paths = HadoopPaths(spark)
        with _held(tmp_path / folder / "later"):
            line = refusal(spark, job_args(data, "--output-table", name, "--on-invalid", "null"))
            assert "is being written by another score job" in line, line
            assert not spark.catalog.tableExists(name)
        score(spark, paths, job_args(data, "--output-table", name, "--on-invalid", "null"))
        assert paths.place(table_location(spark, name)) == paths.place(future)
        assert sorted(os.listdir(tmp_path)) == [folder]  # no folder of an encoded name
        assert os.listdir(tmp_path / folder) == ["later"]  # no lease left
    finally:
        spark.sql("DROP DATABASE sk_job_later CASCADE")


def test_a_table_run_taken_over_before_its_write_leaves_the_table(spark, data, database):
    """Spark's writer publishes a table as it writes: the leases are checked as that
    write begins (they were checked after it: the table replaced, then 'stops before
    publishing anything more')."""
    from spark_keras.jobs.score.errors import JobError
    from spark_keras.jobs.score.lease import Leases
    from spark_keras.jobs.score.outputs import Outputs, table_location
    from spark_keras.jobs.score.run import _publish

    name = f"{database}.kept"
    spark.sql(f"CREATE TABLE {name} (id long, note string) USING parquet")
    spark.sql(f"INSERT INTO {name} VALUES (1, 'kept')")
    frame = spark.read.parquet(str(data / "scalar"))
    outputs = Outputs("parquet", None, None, name, None, False, None, None, frame.columns)
    paths = HadoopPaths(spark)
    location = table_location(spark, name)
    with Leases(paths, [location]) as leases:
        folder = score_lease.lease_folder(paths.place(location))
        for entry in os.listdir(folder):  # judged gone by another job, which took over
            os.remove(os.path.join(folder, entry))
        with _held(location.removeprefix("file:")):
            with pytest.raises(JobError, match="another score job holds it now"):
                _publish(frame, paths, outputs, True, leases.check)
    assert spark.table(name).collect() == [(1, "kept")]


def test_a_quarantine_inside_the_tables_folder_is_refused(spark, data, database, tmp_path):
    """As a quarantine inside --output is: one line, before anything is written (the job
    replaced the table, lost the quarantine and blamed 'another score job')."""
    name = f"{database}.qt"
    spark.sql(f"CREATE TABLE {name} (id long) USING parquet")
    spark.sql(f"INSERT INTO {name} VALUES (7)")
    inside = tmp_path / "warehouse" / "qt" / "quarantine"
    line = refusal(spark, job_args(data, "--output-table", name, "--overwrite", "--on-invalid",
                                   "null", "--invalid-output", str(inside)))
    assert line.startswith(f"--invalid-output '{inside}' is inside the folder of --output-table "
                           f"'{name}' "), line
    assert spark.table(name).collect() == [(7,)]


def test_an_output_table_is_saved_and_refused_when_it_exists(spark, data, database):
    name = f"{database}.plain"
    args = job_args(data, "--output-table", name, "--output-format", "orc",
                    "--partition-by", "k", "--on-invalid", "null")
    assert score(spark, HadoopPaths(spark), args)["rows"] == FILES * ROWS
    table = spark.table(name).toPandas().sort_values("id")
    assert table["id"].tolist() == list(range(FILES * ROWS))
    assert spark.sql(f"SHOW PARTITIONS {name}").count() == 2
    line = refusal(spark, job_args(data, "--output-table", name))
    assert line == f"--output-table {name!r} exists; pass --overwrite to replace it", line
    line = refusal(spark, job_args(data, "--output-table", "sk_no_such_database.t"))
    assert line.startswith("--output-table 'sk_no_such_database.t': [SCHEMA_NOT_FOUND]"), line


def test_a_table_a_kill_left_without_rows_is_made_again(spark, data, database):
    """A run killed after it made its table and before its first commit leaves a table
    with no rows and no commit log: --resume makes it again (nothing is lost)."""
    name = f"{database}.empty"
    spark.sql(f"CREATE TABLE {name} (id long) USING parquet")
    summary = score(spark, HadoopPaths(spark), job_args(
        data, "--output-table", name, "--on-invalid", "null", per_group=4))
    assert summary["groups"] == 1 and spark.table(name).count() == FILES * ROWS
    assert "prediction" in spark.table(name).columns
    score(spark, HadoopPaths(spark), job_args(data, "--output-table", name, "--overwrite",
                                              source="scalar", model="scalar.skp",
                                              features=",".join(SCALARS)))
    assert spark.table(name).columns == ["id", *SCALARS, "k", "prediction"]  # replaced


def test_an_output_table_resumes(spark, data, database, tmp_path):
    """--output-table with --resume: the table made empty, each group committed into its
    location (its partitions found, readers of the table see each commit); a rerun after
    a group was lost scores that group only; the table holds each row once."""
    name = f"{database}.resumed"
    args = job_args(data, "--output-table", name, "--partition-by", "k", "--on-invalid",
                    "null", "--invalid-output", str(tmp_path / "invalid"), per_group=2)
    first = score(spark, HadoopPaths(spark), args)
    assert first["groups"] == 2 and first["invalid_by_reason"] == CLASSES
    reference = spark.table(name).toPandas().sort_values("id").reset_index(drop=True)
    assert reference["id"].tolist() == list(range(FILES * ROWS))
    location = (tmp_path / "warehouse" / "resumed")
    log = location / "_spark_keras" / "commits"
    assert sorted(p.name for p in log.glob("g*.json")) == ["g00000.json", "g00001.json"]
    (log / "g00001.json").unlink()  # lost: scored again
    second = score(spark, HadoopPaths(spark), args)
    assert (second["groups"], second["groups_skipped"]) == (1, 1), second
    again = spark.table(name).toPandas().sort_values("id").reset_index(drop=True)
    assert again["id"].tolist() == reference["id"].tolist()
    assert predictions(again) == predictions(reference)
    assert read(spark, tmp_path / "invalid")["id"].tolist() == BAD
    shutil.rmtree(location / "_spark_keras")  # not this job's table any more
    line = refusal(spark, args)
    assert line.startswith(f"--output-table {name!r} exists and its location ") and \
        line.endswith("holds no commit log of a resumable run; pass --overwrite to replace it")
