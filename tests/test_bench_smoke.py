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

from bench.coldstart_bench import assert_identical
from bench.docs import TITLES, write_docs
from bench.frames import Expected, PredictionMismatch, check_predictions
from bench.targets import coldstart_goal, memory_targets
from tests.conftest import REPO_ROOT


def _quick_bench(*sections: str, timeout: int) -> str:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", ",".join(sections)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_quick_runs_and_prints_tables():
    out = _quick_bench("payload", "scoring", "memory", "dask", "frontends", timeout=900)
    assert "loads speed-up" in out and "MLP 90MB" in out
    for method in ("predict_batch_udf", "closure pandas_udf", "BroadcastModel.predict_udf",
                   "BroadcastModel.transform", "hand-written mapInArrow (best case)",
                   "identity mapInArrow", "raw model (1 process)"):
        assert method in out
    for variant in ("array", "scalars", "vector"):
        assert re.search(rf"\|\s+{variant} \|", out), variant
    # speed is not checked at these sizes, but each target's verdict must follow from its value
    targets = _target_lines(out)
    scoring = _printed_table(out, "x best case")
    for workload, variant in [("MLP", "array"), ("MLP", "scalars"), ("MLP", "vector"), ("CNN", "array")]:
        row = next(r for r in scoring if r["workload"].startswith(workload) and r["input"] == variant
                   and r["method"] == "BroadcastModel.transform")
        value = targets[f"{workload} ({variant}) transform >= 0.9x hand-written best case"]
        assert abs(value - float(row["x best case"])) <= 0.011, (value, row)
    assert any(label.startswith("MLP (array) transform / predict_batch_udf >= 4") for label in targets)
    assert any("peak worker RSS" in label for label in targets)
    assert "file load speed-up" in out
    assert "MLP 90MB rebuild from a payload file (share_weights=True) >= 3x Keras pickle" in out
    # the memory section: a tiny model on 1 and 2 concurrent workers, both modes side by side
    memory = _printed_table(out, "weights mapped %")
    assert [(r["workers"], r["mode"]) for r in memory] == [
        ("1", "copy per worker"), ("1", "shared file"), ("2", "copy per worker"), ("2", "shared file")]
    for row in memory:
        assert row["sum PSS growth MB"] and row["x weights"] and row["build s mean"], row
        # the shared mode really built on the mapped file, the other on private copies
        assert row["weights mapped %"] == ("100.00" if row["mode"] == "shared file" else "0.00"), row


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_inputs_quick_scores_text_png_bytes_and_sequences():
    # 2,000 sentences, 200 PNGs, 400 sequences per length set, one timed run each: ~2 minutes
    out = _quick_bench("inputs", timeout=600)
    targets = _target_lines(out)
    scored = _printed_table(out, "x best case")
    for workload, variant in [("text", "string column"), ("image", "binary column (PNG)")]:
        rows = {r["method"]: r for r in scored if r["workload"].startswith(workload) and r["input"] == variant}
        assert set(rows) == {"predict_batch_udf", "BroadcastModel.transform", "hand-written mapInArrow (best case)",
                             "identity mapInArrow", "raw model (1 process)", "ceiling 1/(1/raw+1/identity)"}, rows
        assert all(float(r["rows/s"].replace(",", "")) > 0 for r in rows.values()), rows
        value = targets[f"{workload} ({variant}) transform >= 0.9x hand-written best case"]
        assert abs(value - float(rows["BroadcastModel.transform"]["x best case"])) <= 0.011, (value, rows)
    lengths = _printed_table(out, "x equal lengths")
    methods = ("BroadcastModel.transform", "raw model (1 process, one call per length)")
    assert [(r["input"], r["method"]) for r in lengths] == [
        (variant, method) for variant in ("equal lengths (40)", "4 distinct lengths", "64 distinct lengths")
        for method in methods] + [("64 distinct lengths", "BroadcastModel.transform (buckets=8)"),
                                  ("64 distinct lengths", "raw model (1 process, 8 buckets)")]
    assert all(float(r["rows/s"].replace(",", "")) > 0 for r in lengths), lengths
    assert [r["x equal lengths"] for r in lengths[:2]] == ["1.00", "1.00"], lengths
    # 8 buckets of 8 lengths each (8 to 71, each about as often): 3.5 steps of 43 padded per row
    assert [float(r["padding %"]) for r in lengths[:6]] == [0.0] * 6, lengths
    assert all(7.5 < float(r["padding %"]) < 9 for r in lengths[6:]), lengths
    bucketed = lengths[-2]
    value = targets["GRU on 64 distinct lengths per batch, BroadcastModel.transform (buckets=8) >= 0.8x "
                    "transform on equal lengths"]
    assert abs(value - float(bucketed["x equal lengths"])) <= 0.011, (value, bucketed)


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_coldstart_quick_runs_both_daemons_side_by_side():
    # two fresh workers per model and daemon, a 2-partition transform job: under ~90 s
    out = _quick_bench("coldstart", timeout=400)
    rows = {r["measure"]: r for r in _printed_table(out, "daemon / stock")}
    stock, daemon = "pyspark.daemon (stock)", "spark_keras.executor.daemon"
    for model in ("MLP", "CNN"):
        first = rows[f"{model}: task start to first prediction, median of 2 fresh workers, s"]
        assert float(first[stock]) > 0 and float(first[daemon]) > 0, first
        imports = rows[f"{model}: of which import tensorflow, keras, median s"]
        assert float(imports[daemon]) < float(imports[stock]), imports  # preloaded: (almost) free
        assert rows[f"{model}: of which model build (bm.value), median s"][daemon]
        cold = rows[f"{model}: cold start less the model build, median s"]
        assert _goal_value(cold["goal"]) == pytest.approx(float(cold[daemon]), abs=0.006), cold
    pss = rows["worker PSS, tensorflow and keras imported, no model, median MB"]
    cut = 100 * (1 - float(pss[daemon]) / float(pss[stock]))
    assert _goal_value(pss["goal"]) == pytest.approx(cut, abs=1), pss
    assert rows["transform job wall (MLP, 2 partitions x 100 rows, collected) s"][daemon]
    assert rows["daemon start to its first fork (once per executor and worker pool), median s"][stock]
    first_job = next(r for m, r in rows.items() if m.startswith("first job of a new session"))
    assert float(first_job[stock]) > 0 and float(first_job[daemon]) > 0, first_job
    assert first_job["goal"].startswith(("met: ", "NOT met: ")), first_job
    assert "preloading daemon: " in out  # the targets


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_operations_quick_measures_every_mode_against_plain_for_both_models():
    """Each model's modes, the A/A row and df.observe alone among them; each observed
    run's figures were checked against the input by the bench itself (it would have
    failed)."""
    from bench import operations_bench

    out = _quick_bench("operations", timeout=600)
    rows = _printed_table(out, "x plain, median of rounds")
    models = [f"MLP 64-{w}-{w}-8" for w, _ in operations_bench.MODELS]
    assert [(r["model"], r["transform (on_invalid='null')"]) for r in rows] == [
        (m, mode) for m in models for mode in operations_bench.MODES]
    for row in rows:
        assert float(row["rows/s"].replace(",", "")) > 0, row
        if row["transform (on_invalid='null')"] == "plain":
            assert row["x plain"] == row["x plain, median of rounds"] == "1.000", row


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_isolation_quick_times_every_mode_of_both_models():
    """Both models' three modes; the bench checked that the failing runs' null rows are
    exactly the failing rows (it would have failed)."""
    from bench import isolation_bench

    out = _quick_bench("isolation", timeout=1200)
    rows = _printed_table(out, "x 'error' clean, median of rounds")
    assert [(r["model"], r["transform"]) for r in rows] == [
        (m, mode) for m, _, _ in isolation_bench.MODELS for mode in isolation_bench.MODES]
    assert all(float(r["rows/s"].replace(",", "")) > 0 for r in rows)
    assert "1 failing row per 10,000 >= 0.8x clean" in out  # the targets


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_keyed_quick_times_every_mode_and_counts_one_file_per_model():
    from bench import keyed_bench

    out = _quick_bench("keyed", timeout=900)
    rows = _printed_table(out, "x 12 transforms, median of rounds")
    assert [r["mode"] for r in rows] == list(keyed_bench.MODES)
    memory = _printed_table(out, "executor payload files")
    assert memory[0]["executor payload files"] == str(keyed_bench.KEYS)
    curve = _printed_table(out, "x clustered, median of rounds")  # quick: 2 and 20 models
    assert [r["models"] for r in curve] == ["2", "20"]
    assert "KeyedModels on rows clustered by key >= 0.8x" in out  # the targets
    assert "KeyedModels, 20 models, random key order >= 0.8x clustered" in out


def test_call_cost_times_the_engine_s_call_and_the_tf_function_s():
    """bench.call_cost (no Spark, seconds): both ways of calling, per size, one trace."""
    from bench import call_cost

    rows = call_cost.run((8, 40))
    assert [(r["rows"], r["call"]) for r in rows] == [
        (n, way) for n in (8, 40) for way in ("engine (concrete function)", "through the tf.function")]
    assert all(0 < r["thread CPU us"] <= r["process CPU us"] * 1.01 for r in rows)


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_commits_quick_times_the_job_plain_with_commits_and_with_progress():
    """The five runs of the score job side by side; the bench checked each run's rows,
    commits and progress lines (it would have failed), and prints both targets."""
    from bench import commits_bench

    out = _quick_bench("commits", timeout=600)
    rows = {r["job"]: r for r in _printed_table(out, "x plain, median of rounds")}
    assert list(rows) == list(commits_bench.MODES)
    assert all(float(r["rows/s"].replace(",", "")) > 0 for r in rows.values()), rows
    assert rows[commits_bench.PLAIN]["x plain, median of rounds"] == "1.000"
    assert rows[commits_bench.RESUME]["commits"] == "2" and rows[commits_bench.PLAIN]["commits"] == "1"
    assert rows[commits_bench.RESUME]["progress lines"] == "0"
    assert float(rows[commits_bench.PROGRESS]["progress lines"]) > 0
    targets = _target_lines(out)
    assert rows[commits_bench.DEFAULT]["commits"] == "4"  # a commit per file by default
    costs = _printed_table(out, "path calls per commit")
    assert [r["files per group"] for r in costs] == ["1", "8"], costs
    killed = _printed_table(out, "rerun share scored")
    assert killed[0]["equal to an uninterrupted run"] == "True", killed
    for mode in (commits_bench.RESUME, commits_bench.PROGRESS, commits_bench.DEFAULT):
        value = targets[f"score job {mode} ({rows[mode]['commits']} commits) on local[2] >= 0.95x "
                        f"the plain job"]
        assert abs(value - float(rows[mode]["x plain, median of rounds"])) <= 0.006, (value, rows)


@pytest.mark.bench  # minutes: the benchmark sections end to end (make test-bench)
def test_bench_images_quick_times_mobilenet_alone_and_on_image_rows_and_png_bytes():
    """The three modes side by side (the bench checked both transforms' predictions
    against the model alone, or it would have failed), with both targets printed."""
    from bench import images_bench

    out = _quick_bench("images", timeout=900)
    rows = {r["mode"]: r for r in _printed_table(out, "x model alone, median of rounds")}
    assert list(rows) == list(images_bench.MODES)
    assert all(float(r["rows/s"].replace(",", "")) > 0 for r in rows.values()), rows
    assert rows[images_bench.ALONE]["x model alone, median of rounds"] == "1.000"
    assert all(float(r["CPU ms/row, Python"]) > 0 for r in rows.values()), rows
    targets = _target_lines(out)
    for mode in (images_bench.ROWS, images_bench.PNG):
        value = targets[f"MobileNetV2 {mode} >= 0.9x the model alone (2 processes, decoded arrays)"]
        assert abs(value - float(rows[mode]["x model alone, median of rounds"])) <= 0.006, (value, rows)


def test_a_partial_write_keeps_the_other_sections(tmp_path):
    # a file from before sections recorded their runs: the header names the run
    (tmp_path / "benchmarks.md").write_text(
        "# Benchmarks\n\n- command: `python -m bench --write`\n- machine: M0\n- date: 2026-11-30\n"
        "- wall time: 345 s\n\n## Memory: N Python workers holding one model\n\nold memory\n\n"
        "## Dask: sending a model to a task\n\nold dask\n")
    base = {"date": "2026-12-01", "machine": "M", "seconds": 9.0, "flavour": "keras3"}
    write_docs({**base, "command": "python -m bench --only dask --write", "section_seconds": {"dask": 5.0},
                "dask": [{"model": "tower", "keras s": 1.0}]}, str(tmp_path))
    write_docs({**base, "command": "python -m bench --only coldstart --write", "section_seconds": {},
                "coldstart": [{"measure": "PSS", "goal": coldstart_goal("pss", 150.0, 400.0)}]},
               str(tmp_path))
    text = (tmp_path / "benchmarks.md").read_text()
    memory, dask, cold = (text.index(TITLES[s]) for s in ("memory", "dask", "coldstart"))
    assert memory < dask < cold  # the docs' order, whatever ran last
    assert text[memory:dask].count("_Measured by `python -m bench --write` on 2026-11-30 "
                                   "(345 s for the whole run); machine: M0._") == 1
    assert "old memory" in text[memory:dask] and "old dask" not in text
    assert "| tower |   1.000 |" in text[dask:cold]
    assert text[dask:cold].count("`python -m bench --only dask --write` on 2026-12-01 (5 s for this section)") == 1
    assert "`python -m bench --only coldstart --write` on 2026-12-01 (9 s for the whole run)" in text[cold:]
    assert "- [met] PSS, preloading daemon: 62% lower >= 40%" in text[cold:]


def test_coldstart_fails_when_the_daemons_predict_different_bits():
    same = np.array([[0.25], [0.5]], "float32")
    assert_identical("MLP", [("stock", same), ("daemon", same.copy()), ("stock", same.copy())],
                     {"stock", "daemon"})
    with pytest.raises(AssertionError, match="MLP: the predictions with daemon differ"):
        assert_identical("MLP", [("stock", same), ("daemon", np.nextafter(same, 1))], {"stock", "daemon"})
    with pytest.raises(AssertionError, match=r"no predictions from \['daemon'\]"):
        assert_identical("MLP", [("stock", same)], {"stock", "daemon"})


_VERDICT = re.compile(r"(?:\[(met|NOT met)\] (.*)|(met|NOT met): )(?:.*?)(>=|<=) ?([0-9.]+)")


def _verdict_follows(line: str, value: float) -> None:
    """Fail unless the met / NOT met of a target line agrees with its value and limit."""
    match = _VERDICT.match(line)
    assert match, line
    met = (match.group(1) or match.group(3)) == "met"
    limit = float(match.group(5))
    assert met == (value >= limit if match.group(4) == ">=" else value <= limit), line


def _target_lines(out: str) -> dict[str, float]:
    """Printed ``[met] label: value`` lines by label, each checked by :func:`_verdict_follows`."""
    found = {}
    for line in out.splitlines():
        line = line.strip().removeprefix("- ")
        if line.startswith(("[met] ", "[NOT met] ")) and not line.endswith("n/a"):
            label, _, value = line.partition("] ")[2].rpartition(": ")
            _verdict_follows(line, float(value))
            found[label] = float(value)
    return found


def _goal_value(goal: str) -> float:
    """The value of a cold-start goal cell ("met: 0.120 s <= 0.5 s", "NOT met: 12% lower
    >= 40%"), checked by :func:`_verdict_follows`."""
    value = float(re.match(r"(?:NOT )?met: ([0-9.]+)", goal).group(1))
    _verdict_follows(goal, value)
    return value


def test_target_verdicts_are_checked_against_their_values():
    _verdict_follows("[met] x >= 0.9x best: 0.95", 0.95)
    _verdict_follows("NOT met: 12% lower >= 40%", 12)
    with pytest.raises(AssertionError):
        _verdict_follows("[met] x >= 0.9x best: 0.50", 0.5)
    with pytest.raises(AssertionError):
        _verdict_follows("met: 0.900 s <= 0.5 s", 0.9)


def _printed_table(out: str, column: str) -> list[dict[str, str]]:
    """The rows, as cell texts by column name, of the printed table that has ``column``."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and f" {column} |" in line)
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    header = cells(lines[start])
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, cells(line))))
    return rows


# pss_kb's figures of 64 MiB of touched private memory and a 32 MiB file mapped and read,
# taken in a fresh process: the pytest process's other threads and children (a freed
# buffer, a forked child sharing its pages) would move its own figures in between
_PSS_PROBE = """
import gc, json, mmap, sys
import numpy as np
from bench.harness import pss_kb
gc.collect()
gc.disable()
before = pss_kb()
private = np.ones(8 * 2**20)
with open(sys.argv[1], "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
    assert len(mapped[::4096]) == 8192  # every page read
    after = pss_kb()
assert private.sum() == 8 * 2**20
print(json.dumps({k: after[k] - before[k] for k in after}))
"""


def test_pss_tells_private_memory_from_mapped_files(tmp_path):
    """Its figures grow by the private memory (anon) and the mapped file (file), while the
    pytest process's own memory churns (a thread allocating and freeing 64 MiB)."""
    import json
    import threading

    path = tmp_path / "data"
    path.write_bytes(b"\1" * 32 * 2**20)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            held = np.ones(8 * 2**20)
            stop.wait(0.002)
            del held
            stop.wait(0.002)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        proc = subprocess.run([sys.executable, "-c", _PSS_PROBE, str(path)], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        thread.join()
    assert proc.returncode == 0, proc.stderr[-2000:]
    grown = json.loads(proc.stdout)
    assert grown["anon"] >= 63 * 1024, grown
    assert grown["file"] >= 31 * 1024, grown


def test_memory_target_is_read_at_four_workers():
    rows = [{"workers": n, "mode": mode, "x weights": x, "build s mean": 3.0}
            for n, mode, x in [(2, "shared file", 0.9), (4, "copy per worker", 4.2), (4, "shared file", 1.2)]]
    lines = memory_targets(rows)
    assert lines[0] == "[met] shared weights at 4 workers <= 1.5x weights: 1.20"
    assert "4.20x weights" in lines[1]
    rows[-1]["x weights"] = 1.6
    assert memory_targets(rows)[0].startswith("[NOT met]")
    assert memory_targets(rows[:1]) == []  # a --quick run has no 4-worker rows


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
