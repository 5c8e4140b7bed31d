"""Every row invalid (issue 55 item 5): the job stops (exit 2, naming the reasons) before
it publishes anything, or before ``_SUCCESS`` with ``--resume``, unless ``--max-invalid``
lets the rows pass (then it warns); and ``--drop-invalid``'s figures (item 8): the rows
written and the rows quarantined. The job's Python entry point in the shared session."""

from __future__ import annotations

import logging

import pytest

import spark_keras as sk
from spark_keras.errors import InvalidRowsError
from spark_keras.jobs.score.errors import outcome
from spark_keras.jobs.score.files import HadoopPaths
from spark_keras.jobs.score.main import scored_line
from spark_keras.jobs.score.run import score
from tests import models
from tests.jobs.test_score_outputs import BAD, FILES, ROWS, job_args, write_data

ALL = FILES * ROWS


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The outputs' data, and a model of 10 features: none of its 6-value rows fits."""
    folder = write_data(tmp_path_factory.mktemp("score-verdict"))
    sk.save(models.mlp(n_features=10, hidden=8, outputs=1), str(folder / "ten.skp"))
    return folder


def test_every_row_invalid_stops_the_job_before_it_publishes(spark, data, tmp_path):
    out = tmp_path / "out"
    args = job_args(data, "--output", str(out), "--on-invalid", "null", model="ten.skp")
    with pytest.raises(InvalidRowsError) as caught:
        score(spark, HadoopPaths(spark), args)
    line, status = outcome(caught.value)
    assert status == 2 and line.startswith(
        f"every row was invalid ({ALL} of {ALL}): 'input: shape' ({ALL - 1} rows), 'input: "
        f"null' (1 row); the output "
        f"is not published. Check --features against the model's inputs, or pass "
        f"--max-invalid {ALL} to write them anyway"), line
    assert not out.exists() and not list(tmp_path.iterdir())  # no staging left either


def test_a_max_invalid_that_lets_every_row_pass_warns(spark, data, tmp_path, caplog):
    out = tmp_path / "out"
    args = job_args(data, "--output", str(out), "--on-invalid", "null", "--max-invalid",
                    str(ALL), model="ten.skp")
    summary = score(spark, HadoopPaths(spark), args)
    assert summary["invalid_rows"] == summary["rows"] == ALL and out.exists()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and r.getMessage().startswith(f"every row was invalid ({ALL} of {ALL})")]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_every_row_invalid_stops_a_resumable_job_before_success(spark, data, tmp_path):
    out = tmp_path / "out"
    args = job_args(data, "--output", str(out), "--on-invalid", "null", model="ten.skp",
                    per_group=2)
    with pytest.raises(InvalidRowsError, match=rf"every row was invalid \({ALL} of {ALL}\): "
                                              rf"'input: shape' \({ALL - 1} rows\), 'input: "
                                              rf"null' \(1 row\); the output stays without "
                                              rf"_SUCCESS"):
        score(spark, HadoopPaths(spark), args)
    assert not (out / "_SUCCESS").exists()


def test_drop_invalid_says_the_rows_written_and_quarantined(spark, data, tmp_path):
    args = job_args(data, "--output", str(tmp_path / "out"), "--on-invalid", "null",
                    "--invalid-output", str(tmp_path / "invalid"), "--drop-invalid")
    summary = score(spark, HadoopPaths(spark), args)
    assert (summary["rows"], summary["rows_written"], summary["rows_quarantined"]) == \
        (ALL, ALL - len(BAD), len(BAD))
    line = scored_line(summary, 1.0)
    assert f"SCORED rows={ALL} invalid_rows={len(BAD)} " in line
    assert f" rows_written={ALL - len(BAD)} rows_quarantined={len(BAD)}" in line, line
    kept = score(spark, HadoopPaths(spark), job_args(
        data, "--output", str(tmp_path / "kept"), "--on-invalid", "null",
        "--invalid-output", str(tmp_path / "invalid-kept")))
    assert (kept["rows_written"], kept["rows_quarantined"]) == (ALL, len(BAD))
