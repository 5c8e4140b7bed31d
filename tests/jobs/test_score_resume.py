"""The score job's ``--resume`` (issue 46): output written in commits, a rerun scoring only
what is not committed, refusals naming what changed, and progress per commit. Fast cases
run the job's Python entry point (``score_run.score``) in the shared session; the slow one
runs the job on a local Spark Connect server. The job killed with SIGKILL (after a commit,
and at other moments) and resumed: test_score_inflight."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.errors import JobError, outcome
from spark_keras.jobs.score.files import HadoopPaths, glob_escaped, join, write_whole
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.manifest import difference, list_input, plan_groups
from spark_keras.jobs.score.run import score
from tests import models
from tests.conftest import run_score_job

ROWS = 300  # per input file


def write_rows(path, first: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((ROWS, 6)).astype("float32")
    pq.write_table(pa.table({"id": pa.array(np.arange(first, first + ROWS), pa.int64()),
                             "features": pa.array(list(x), pa.list_(pa.float32()))}), path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Two partition folders of input files (``k=0``, ``k=1``) with Spark's hidden
    companions, a flat folder of six files, and two models."""
    folder = tmp_path_factory.mktemp("score-resume")
    for k in (0, 1):
        (folder / "parted" / f"k={k}").mkdir(parents=True)
        for j in range(2):
            write_rows(folder / "parted" / f"k={k}" / f"part-{j}.parquet", (2 * k + j) * ROWS, 2 * k + j)
    (folder / "parted" / "_SUCCESS").write_bytes(b"")
    write_rows(folder / "parted" / "k=1" / ".part-8.parquet", 10**6, 8)  # hidden: not read
    write_rows(folder / "parted" / "k=1" / "part-7.parquet._COPYING_", 10**6, 7)  # nor this
    (folder / "parted" / "_temporary" / "0").mkdir(parents=True)
    write_rows(folder / "parted" / "_temporary" / "0" / "part-9.parquet", 10**6, 9)  # not read
    (folder / "flat").mkdir()
    for i in range(6):
        write_rows(folder / "flat" / f"part-{i}.parquet", i * ROWS, 10 + i)
    sk.save(models.mlp(n_features=6, hidden=8, outputs=3), str(folder / "model.skp"))
    sk.save(models.mlp(n_features=6, hidden=8, outputs=3), str(folder / "other.skp"))
    return folder


def job_args(data, out, *extra: str, source: str = "parted", model: str = "model.skp",
             per_group: int = 1):
    """The job's options for a resumable run, ``per_group`` input files in a commit."""
    one_file = os.path.getsize(data / "parted" / "k=0" / "part-0.parquet")
    return parse_args(["--model", str(data / model), "--input", str(data / source),
                       "--output", str(out), "--features", "features", "--resume",
                       "--commit-bytes", str(per_group * one_file + 10), *extra])


def read_sorted(spark, out):
    """The output as Spark's reader sees it, by id (the columns and the predictions)."""
    frame = spark.read.parquet(str(out)).toPandas().sort_values("id").reset_index(drop=True)
    return frame, np.stack(frame["prediction"].to_numpy()).astype("float32")


# --- no Spark --------------------------------------------------------------------------------

def test_groups_are_bounded_runs_of_files_in_name_order():
    assert plan_groups([10, 10, 10, 50, 5, 5], 20) == [[0, 1], [2], [3], [4, 5]]
    assert plan_groups([20, 0, 1], 20) == [[0, 1], [2]]  # the bound is inclusive
    assert plan_groups([], 20) == []


def manifest(**changes):
    base = {"format": 1, "model_sha256": "a" * 64, "commit_bytes": 100,
            "options": {"features": ["f"], "output_col": "prediction", "format": "parquet"},
            "files": [["k=0/a.parquet", 10, 1_700_000_000_000],
                      ["k=1/b.parquet", 20, 1_700_000_000_000]]}
    return {**base, **changes}


def test_a_difference_is_named_first_by_model_then_options_then_files():
    old = manifest()
    assert difference(old, manifest(), "in") is None
    said = difference(old, manifest(model_sha256="b" * 64), "in")
    assert said.startswith("the model is another one (sha256 bbbbbbbbbbbb...; the committed "
                           "groups were scored by aaaaaaaaaaaa...)"), said
    said = difference(old, manifest(options={**old["options"], "output_col": "score"}), "in")
    assert said == "--output-col differs ('score' now, 'prediction' for the committed groups)"
    said = difference(old, manifest(options={**old["options"], "buckets": [4, 8]}), "in")
    assert said == "--buckets differs ([4, 8] now, None for the committed groups)"
    touched = [old["files"][0], ["k=1/b.parquet", 20, 1_700_000_005_000]]
    assert difference(old, manifest(files=touched), "in") == (
        "input file 'in/k=1/b.parquet' changed (size 20 -> 20 bytes, modified "
        "2023-11-14 22:13:20.000 UTC -> 2023-11-14 22:13:25.000 UTC)")
    both = [["k=0/a.parquet", 11, 1]]
    assert difference(old, manifest(files=both), "in") == (
        "input file 'in/k=0/a.parquet' changed (size 10 -> 11 bytes, modified "
        "2023-11-14 22:13:20.000 UTC -> 1970-01-01 00:00:00.001 UTC) (and 1 more input file(s))")
    said = difference(old, manifest(files=old["files"] + [["c.parquet", 1, 1]]), "in")
    assert said == "input file 'in/c.parquet' is new"
    assert difference(old, manifest(commit_bytes=5), "in").startswith(
        "--commit-bytes differs (5 now, 100 for")


# --- the path layer, on both sides ---------------------------------------------------------------

def test_the_path_layers_list_what_spark_reads_and_write_whole_files(spark, data, tmp_path):
    """Classic (Hadoop through the JVM) and Connect (pyarrow) list the same files, the
    ones Spark reads under its rule for hidden names (no _SUCCESS, dot files, _temporary,
    ._COPYING_), and
    create, read and move small files alike."""
    hadoop, arrow = HadoopPaths(spark), ArrowPaths()
    root = str(data / "parted")
    listed = list_input(hadoop, root)
    assert listed == list_input(arrow, root)
    assert [p for p, _, _ in listed] == [f"k={k}/part-{j}.parquet" for k in (0, 1) for j in range(2)]
    assert listed[0][1] == os.path.getsize(data / "parted" / "k=0" / "part-0.parquet")
    assert listed[0][2] == os.stat(data / "parted" / "k=0" / "part-0.parquet").st_mtime_ns // 10**6
    read = spark.read.parquet(root).inputFiles()
    assert sorted(f.rsplit("/", 1)[1] for f in read) == sorted(p.rsplit("/", 1)[1] for p, _, _ in listed)
    single = str(data / "flat" / "part-1.parquet")
    assert list_input(hadoop, single) == list_input(arrow, single)
    assert list_input(hadoop, single)[0][0] == ""
    for name, paths in (("hadoop", hadoop), ("arrow", arrow)):
        target = join(str(tmp_path / name / "a" / "b"), "record.json")
        write_whole(paths, target, '{"x": 1}')
        assert json.loads(paths.read_bytes(target)) == {"x": 1}
        assert [e.name for e in paths.children(str(tmp_path / name / "a" / "b"))] == ["record.json"]
        with pytest.raises(sk.StorageError, match="record.json"):
            paths.create(target, b"again")
        entry = paths.status(target)
        assert entry is not None and not entry.is_dir and entry.size == 8
        assert paths.status(str(tmp_path / name / "nothing")) is None
        paths.move(target, target + ".moved")
        assert not paths.exists(target) and paths.exists(target + ".moved")
    # a file name Spark would expand as a glob, read as itself
    odd = tmp_path / "odd[1]"
    odd.mkdir()
    write_rows(odd / "p{a}.parquet", 0, 0)
    assert spark.read.parquet(glob_escaped(str(odd / "p{a}.parquet"))).count() == ROWS


# --- the job's Python entry point, in the shared session ----------------------------------------

def test_an_interrupted_run_resumes_to_the_uninterrupted_output(spark, data, tmp_path):
    """A run's output in the states a kill can leave (a group half renamed into place, one
    whose file is lost mid-rename, one Spark was still writing, a record's temporary
    file): the rerun finishes the first, scores the other two again and nothing else, and
    the output equals the uninterrupted run's, bit for bit, each row once."""
    out = tmp_path / "out"
    metrics = tmp_path / "metrics.json"
    args = job_args(data, out, "--metrics-json", str(metrics))
    first = score(spark, HadoopPaths(spark), args)
    assert (first["rows"], first["rows_skipped"], first["groups"], first["groups_skipped"]) == \
        (4 * ROWS, 0, 4, 0)
    assert json.loads(metrics.read_text()) == first and first["done"] is True
    reference, predictions = read_sorted(spark, out)
    assert reference["id"].tolist() == list(range(4 * ROWS))  # each row once
    assert list(reference.columns) == ["id", "features", "k", "prediction"]  # k: a partition
    assert reference["k"].tolist() == [i // (2 * ROWS) for i in range(4 * ROWS)]
    assert (out / "_SUCCESS").exists()

    log = out / "_spark_keras" / "commits"
    records = {i: json.loads((log / f"g{i:05d}.json").read_text()) for i in range(4)}
    assert all(r["rows"] == ROWS and len(r["files"]) >= 1 for r in records.values())
    # group 1: renamed into place but one file, then killed (rolled forward)
    (log / "g00001.json").rename(log / "g00001.moving.json")
    staging = out / records[1]["staging"]
    staging.mkdir(parents=True)  # in its wave's folder
    kept = records[1]["files"][0]
    (out / kept).rename(staging / kept[len("g00001-"):])
    # group 2: a file lost in between (rolled back, scored again)
    (log / "g00002.json").rename(log / "g00002.moving.json")
    (out / records[2]["files"][0]).unlink()
    # group 3: never committed, killed while Spark wrote it
    (log / "g00003.json").unlink()
    for name in records[3]["files"]:
        (out / name).unlink()
    (out / "_staging-g00003-0123456789ab").mkdir()
    (out / "_staging-g00003-0123456789ab" / "part-00000-x.parquet").write_bytes(b"half")
    (log / ".g00003.json.tmp-0123456789ab").write_text("{")
    (out / "_SUCCESS").unlink()

    second = score(spark, HadoopPaths(spark), args)
    assert (second["rows"], second["rows_skipped"], second["groups"], second["groups_skipped"]) \
        == (2 * ROWS, 2 * ROWS, 2, 2), second
    assert json.loads(metrics.read_text()) == second
    resumed, again = read_sorted(spark, out)
    assert resumed["id"].tolist() == list(range(4 * ROWS))
    assert again.view(np.uint32).tolist() == predictions.view(np.uint32).tolist()  # bit for bit
    assert sorted(p.name for p in log.iterdir() if not p.name.endswith(".crc")) == \
        [f"g{i:05d}.json" for i in range(4)]  # (.crc: Hadoop's checksums of local files)
    assert not [p for p in out.iterdir() if p.name.startswith("_staging")]
    assert (out / "_SUCCESS").exists()
    # nothing left to do: every group skipped
    third = score(spark, HadoopPaths(spark), args)
    assert (third["rows"], third["rows_skipped"], third["groups"]) == (0, 4 * ROWS, 0)


@pytest.fixture(scope="module")
def committed(spark, data, tmp_path_factory):
    """A finished resumable output of the flat input (three files per group)."""
    out = tmp_path_factory.mktemp("committed") / "out"
    score(spark, HadoopPaths(spark), job_args(data, out, source="flat", per_group=3))
    return out


def refusal(spark, args) -> str:
    with pytest.raises(JobError) as caught:
        score(spark, HadoopPaths(spark), args)
    line, status = outcome(caught.value)
    assert status == 2 and "\n" not in line, line
    return line


def test_a_rerun_with_another_model_options_or_input_is_refused(spark, data, committed, tmp_path):
    """Refused before the model is loaded, exit 2, one line naming the difference; the
    output untouched. ``--overwrite`` starts over."""
    before = sorted(p.name for p in committed.iterdir())
    line = refusal(spark, job_args(data, committed, source="flat", model="other.skp", per_group=3))
    assert re.fullmatch(r"cannot resume '.*/out': the model is another one \(config and weights "
                        r"differ: its config sha256 \w{12}\.\.\. now, \w{12}\.\.\. for the "
                        r"committed groups; its weights sha256 \w{12}\.\.\. now, \w{12}\.\.\. for "
                        r"the committed groups\); pass --overwrite to start over", line), line
    line = refusal(spark, job_args(data, committed, "--output-col", "score", source="flat",
                                   per_group=3))
    assert "--output-col differs ('score' now, 'prediction' for the committed groups)" in line
    line = refusal(spark, job_args(data, committed, "--on-invalid", "null", source="flat",
                                   per_group=3))
    assert "--on-invalid differs ('null' now, 'error' for the committed groups)" in line
    flat = tmp_path / "flat"
    shutil.copytree(data / "flat", flat, copy_function=shutil.copy2)  # sizes and times kept
    os.utime(flat / "part-3.parquet", ns=(time.time_ns(), time.time_ns() + 5 * 10**9))
    line = refusal(spark, job_args(data, committed, source=str(flat), per_group=3))
    assert f"input file '{flat}/part-3.parquet' changed (size " in line, line
    assert sorted(p.name for p in committed.iterdir()) == before
    # an output that is not a resumable run's
    plain = tmp_path / "plain"
    plain.mkdir()
    write_rows(plain / "part-0.parquet", 0, 0)
    line = refusal(spark, job_args(data, plain))
    assert "holds no commit log of a resumable run (no _spark_keras/manifest.json); pass " \
           "--overwrite" in line, line
    # without --resume: the hint to continue it
    plain_args = job_args(data, committed, source="flat", per_group=3)
    plain_args.resume, plain_args.commit_bytes = False, None
    line = refusal(spark, plain_args)
    assert line.endswith("exists; pass --overwrite to replace it (or --resume to continue it)")


def test_overwrite_starts_a_resumable_output_over(spark, data, committed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(committed, out)
    summary = score(spark, HadoopPaths(spark),
                    job_args(data, out, "--overwrite", source="flat", model="other.skp",
                             per_group=6))
    assert (summary["groups"], summary["groups_skipped"], summary["rows"]) == \
        (summary["groups_total"], 0, 6 * ROWS)
    frame, _ = read_sorted(spark, out)
    assert frame["id"].tolist() == list(range(6 * ROWS))


# --- the job as a process, killed: test_score_inflight (SIGKILLs at several moments, a
# reader meanwhile, the rerun's figures and output against an uninterrupted run's) ----------


# --- progress lines --------------------------------------------------------------------------

# a beat's tail: the group in flight, or none (the closing 'scored' line has a ';' too)
BEAT = re.compile(r"; (group \d+: |no group in flight)")


def progress_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "spark_keras.jobs.score"]


def running_tasks_in(lines: list[str]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for line in lines if (m := re.search(r"(\d+) of (\d+) tasks", line))]


def test_progress_lines_say_how_far_the_job_is(spark, data, tmp_path, caplog):
    """With --progress a line every --progress-seconds while Spark scores: the rows scored
    of the input's (rising, never past them), rows/s, the running stages' tasks done
    (rising, never past their count), elapsed time and ETA; with
    --resume the groups, rows and invalid rows committed too, rising to the total. Without
    it (the default when stderr is not a terminal) no line and no thread."""
    caplog.set_level(logging.INFO, logger="spark_keras.jobs.score")
    plain = parse_args(["--model", str(data / "model.skp"), "--input", str(data / "flat"),
                        "--output", str(tmp_path / "plain"), "--features", "features",
                        "--progress", "--progress-seconds", "0.05"])
    score(spark, HadoopPaths(spark), plain)
    lines = progress_lines(caplog)
    assert lines[0] == f"scoring {str(data / 'flat')!r} into {str(tmp_path / 'plain')!r}", lines
    beats = [line for line in lines if line.startswith("scoring: ")]
    tasks = running_tasks_in(beats)
    assert tasks and all(0 <= done <= total for done, total in tasks), beats
    assert all(re.fullmatch(r"scoring: ([\d,]+ of 1,800 rows, [\d,]+ rows/s, (\d+ of \d+ tasks, "
                            r"\d\d:\d\d:\d\d elapsed, ETA (\d\d:\d\d:\d\d|unknown)|no Spark "
                            r"stage running, \d\d:\d\d:\d\d elapsed)|no Spark stage running, "
                            r"\d\d:\d\d:\d\d elapsed)", line) for line in beats), beats
    rows = [int(m[1].replace(",", "")) for line in beats if (m := re.match(r"scoring: ([\d,]+) of", line))]
    assert rows and rows == sorted(rows) and rows[-1] <= 6 * ROWS, beats  # issue 55 item 4
    for total in {t for _, t in tasks}:  # one stage's count only rises
        done = [d for d, t in tasks if t == total]
        assert done == sorted(done), beats
    assert lines[-1].startswith(f"scored {6 * ROWS} rows (0 invalid)"), lines

    caplog.clear()
    threads = threading.active_count()
    quiet = parse_args(["--model", str(data / "model.skp"), "--input", str(data / "flat"),
                        "--output", str(tmp_path / "quiet"), "--features", "features"])
    assert quiet.progress is None  # main() makes it sys.stderr.isatty()
    score(spark, HadoopPaths(spark), quiet)
    assert not [line for line in progress_lines(caplog) if "tasks" in line or "stage" in line]
    assert not [t for t in threading.enumerate() if t.name == "spark-keras-progress"]
    assert threading.active_count() <= threads

    caplog.clear()
    resumable = job_args(data, tmp_path / "resumable", "--progress", "--progress-seconds",
                         "0.05", source="flat", per_group=2)
    score(spark, HadoopPaths(spark), resumable)
    lines = progress_lines(caplog)
    groups = json.loads((tmp_path / "resumable" / "_spark_keras" / "manifest.json")
                        .read_text())["groups"]
    assert len(groups) >= 3, groups
    kib = sum(os.path.getsize(p) for p in (data / "flat").glob("*.parquet")) / 1024
    told = [line for line in lines if not BEAT.search(line)]  # the start, each commit, the end
    assert told[0] == f"scoring {len(groups)} group(s), {kib:.1f} KiB of input into " \
                      f"'{tmp_path / 'resumable'}'", told
    assert told[len(groups)].endswith("ETA 00:00:00"), told
    assert told[len(groups) + 1].startswith(f"scored {6 * ROWS} rows"), told
    commit_lines = [line for line in lines if not BEAT.search(line) and line.startswith("committed")]
    assert [re.sub(r", [\d.,k]+ rows/s, ETA (\d\d:\d\d:\d\d|unknown)$", "", line)
            for line in commit_lines] == \
        [f"committed {i} of {len(groups)} groups, "
         f"{sum(len(g) for g in groups[:i]) * ROWS:,} rows (0 invalid)"
         for i in range(1, len(groups) + 1)]
    beats = [line for line in lines if "; group " in line]
    assert beats and all(re.fullmatch(r"committed \d of \d groups, [\d,]+ rows \(0 invalid\), "
                                      r"[\d.,k]+ rows/s, ETA (\d\d:\d\d:\d\d|unknown); group "
                                      r"\d: (\d+ of \d+ tasks|no Spark stage running)", line)
                         for line in beats), beats
    assert running_tasks_in(beats), beats
    scored = [int(re.search(r"; group (\d)", line)[1]) for line in beats]
    assert scored == sorted(scored) and set(scored) <= set(range(1, len(groups) + 1)), beats


def test_connect_progress_counts_the_stages_not_done():
    """Spark Connect's handler gets every stage of the operation, done or not."""
    from pyspark.sql.connect.shell.progress import StageInfo

    from spark_keras.jobs.score.progress import Running, running_tasks

    stages = [StageInfo(stage_id=0, num_tasks=4, num_completed_tasks=4, num_bytes_read=10,
                        done=True),
              StageInfo(stage_id=1, num_tasks=8, num_completed_tasks=3, num_bytes_read=10,
                        done=False),
              StageInfo(stage_id=2, num_tasks=2, num_completed_tasks=0, num_bytes_read=0,
                        done=False)]
    assert running_tasks(stages) == Running(3, 10)  # no rows: Connect reports none
    assert running_tasks(stages[:1]) is None and running_tasks([]) is None


@pytest.mark.slow  # two jobs on a local Spark Connect server of their own: 2-4 minutes
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
@pytest.mark.timeout(900)
def test_connect_resumes_with_the_clients_paths_and_progress(data, tmp_path):
    """``--remote local[2]`` from the data folder with relative paths: the commits are
    made with pyarrow on the client, a rerun after a group was lost mid-commit scores that
    group only and gives the same output bit for bit; progress lines come from the
    client's progress handler."""
    pytest.importorskip("grpc")
    pytest.importorskip("zstandard")
    shutil.copytree(data / "flat", tmp_path / "in")
    shutil.copy(data / "model.skp", tmp_path / "model.skp")
    one_file = os.path.getsize(tmp_path / "in" / "part-0.parquet")
    common = ["--remote", "local[2]", "--model", "model.skp", "--input", "in", "--output",
              "out", "--features", "features", "--resume", "--commit-bytes",
              str(2 * one_file + 10), "--conf", "spark.connect.progress.reportInterval=100ms"]
    first = run_score_job(*common, "--progress", "--progress-seconds", "0.2", cwd=tmp_path)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    groups = json.loads((tmp_path / "out" / "_spark_keras" / "manifest.json").read_text())["groups"]
    assert len(groups) >= 2 and first.stdout.strip().endswith(
        f"rows_skipped=0 groups={len(groups)} groups_skipped=0"), first.stdout
    beats = [line for line in first.stderr.splitlines() if "; group " in line]
    assert running_tasks_in(beats), first.stderr[-3000:]  # the server's reports reached us
    out = tmp_path / "out"
    expected, bits = read_arrow_sorted(out)
    assert expected["id"].tolist() == list(range(6 * ROWS))

    log = out / "_spark_keras" / "commits"
    last = f"g{len(groups) - 1:05d}"
    record = json.loads((log / f"{last}.json").read_text())
    (log / f"{last}.json").rename(log / f"{last}.moving.json")
    (out / record["files"][0]).unlink()  # lost mid-commit: the group is scored again
    (out / "_SUCCESS").unlink()
    second = run_score_job(*common, "--metrics-json", "metrics.json", cwd=tmp_path)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert " INFO " not in second.stderr  # no progress lines when stderr is not a terminal
    figures = json.loads((tmp_path / "metrics.json").read_text())
    assert (figures["rows"], figures["rows_skipped"], figures["groups"]) == \
        (len(groups[-1]) * ROWS, (6 - len(groups[-1])) * ROWS, 1), figures
    found, again = read_arrow_sorted(out)
    assert found["id"].tolist() == list(range(6 * ROWS))
    assert again.view(np.uint32).tolist() == bits.view(np.uint32).tolist()
    assert (out / "_SUCCESS").exists() and not list(log.glob("*.moving.json"))


def read_arrow_sorted(out):
    """The output as pyarrow's dataset reader sees it, by id (a second reader beside Spark's:
    the names starting with ``_`` are hidden from it too)."""
    frame = pq.read_table(str(out)).to_pandas().sort_values("id").reset_index(drop=True)
    return frame, np.stack(frame["prediction"].to_numpy()).astype("float32")
