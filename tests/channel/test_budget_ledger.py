"""The driver's ledger of ``max_invalid`` budgets counted over an action
(:mod:`spark_keras.channel.budget_ledger`), fed reports directly, against the stages of a
real local[2] Spark job that runs while the reports come (its tasks wait); the reports
over the real channel, from real tasks: tests/spark/test_job_budget.py."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import pytest

from spark_keras.channel import budget_ledger
from spark_keras.channel.budget_ledger import Ledger, Report
from spark_keras.channel.protocol import Refused


@contextlib.contextmanager
def running_stage(spark, folder, tasks: int):
    """The id of the stage of a job of ``tasks`` tasks that runs until the block ends
    (its running tasks wait for a file)."""
    sc = spark.sparkContext
    folder.mkdir(parents=True, exist_ok=True)
    release = str(folder / "release")

    def wait(rows):
        deadline = time.monotonic() + 300
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return rows

    before = set(sc.statusTracker().getActiveStageIds())
    job = threading.Thread(target=sc.parallelize(range(tasks), tasks).mapPartitions(wait).count)
    job.start()
    try:
        deadline = time.monotonic() + 60
        while not (new := set(sc.statusTracker().getActiveStageIds()) - before):
            assert time.monotonic() < deadline, "the job's stage did not start"
            time.sleep(0.05)
        yield new.pop()
    finally:
        open(release, "w").close()
        job.join(120)


def reporter(ledger: Ledger, stage: int, scope: str | None = None):
    """Reports of ``stage`` under ``scope`` (the stage's own RDD job's if None)."""
    scope = scope or f"stage:{stage}"

    def report(key, partition, rows, invalid, final=False, attempt=0, reasons=()):
        return ledger.answer(Report(key, scope, stage, partition, attempt, rows, invalid, final,
                                    tuple(reasons)))
    return report


def test_the_ledger_counts_each_partition_once_in_a_running_stage(spark, tmp_path):
    """Two attempts of one partition (a retry, a speculative copy) count once, their
    furthest; a count passes at once and stays passed; a fraction is judged once both
    tasks of the stage reported; no partition the stage has not, no stage of another
    scope; the limit
    is the registered one; unregistered budgets and malformed reports are refused; a
    stage that ended or was never made is refused."""
    ledger = Ledger()
    for key, limit in (("k", 5), ("f", 0.1), ("g", 0.1)):
        ledger.register(key, limit)
    with running_stage(spark, tmp_path, 2) as stage:
        report = reporter(ledger, stage)
        assert "passed" not in report("k", 0, 100, 3, reasons=["row 1 NaN"])
        assert "passed" not in report("k", 0, 100, 3, attempt=1)  # its retry: still 3
        assert "passed" not in report("k", 0, 200, 5, attempt=1)  # further: 5
        answer = report("k", 1, 10, 1, reasons=["row 9 NaN"])
        assert answer["passed"].startswith(
            f"max_invalid=5 passed: 6 of 210 rows (2.86%) scored by the tasks of the job of "
            f"stage {stage} were invalid so far; the first: row 1 NaN; row 9 NaN")
        assert report("k", 1, 0, 0)["passed"] == answer["passed"]  # every later report
        # a fraction: each task reports as it begins; judged once both reported their last
        # batch; a task over it alone in its stage (the other not begun) waits
        assert report("f", 0, 100, 50, final=True) == {"reasons": True, "pending": 0.5}
        assert report("f", 1, 0, 0) == {"reasons": True}  # task 1 begins: task 0 may go
        assert report("f", 0, 100, 50, final=True) == {"reasons": True}
        assert "passed" in report("f", 1, 100, 0, final=True)  # 50 of 200
        assert report("g", 1, 0, 0) == {"reasons": True}
        assert report("g", 0, 900, 50, final=True) == {"reasons": True}
        assert "passed" not in report("g", 1, 100, 0, final=True)  # 5%
        with pytest.raises(Refused, match="2 partitions: no partition 2"):
            report("g", 2, 1, 0)
        with pytest.raises(Refused, match=f"stage {stage} is not run by SQL execution 77"):
            reporter(ledger, stage, "sql:77")("g", 0, 1, 0)  # not its scope's stage
        with pytest.raises(Refused, match="no max_invalid budget of that name"):
            report("never-registered", 0, 1, 1)
        assert ledger.limit_of("p.Model-1.20", handle="Model-1") == 20
        assert ledger.limit_of("p.Model-1.0.5", handle="Model-1") == 0.5
        assert ledger.limit_of("p.Model-1.20", handle="Model-2") is None
        assert ledger.limit_of("p.Model-1.1.5", handle="Model-1") is None  # not a limit
    for never in (stage, 10**8):  # ended; never made
        with pytest.raises(Refused, match=f"stage {never} does not run"):
            reporter(ledger, never)("g", 0, 1, 1)
    for bad in ({"name": "k"}, {"name": "k", "task": "1.2.3", "counts": "1.2", "final": "0"}):
        with pytest.raises(Refused, match="a report has name=|more invalid rows than rows"):
            Report.parse(bad, "sql:1")
    report = Report.parse({"name": "k", "task": "1.2.3", "counts": "2.1", "limit": "1e17",
                           "final": "1", "reasons": '["x"]'}, "sql:1")
    assert not hasattr(report, "limit") and report.reasons == ("x",)


def test_a_full_ledger_makes_a_budget_count_alone_and_never_resets_it(
        spark, tmp_path, monkeypatch, caplog):
    """Issue 51 item 6: the counts are bounded by bytes. A count that finds no room goes
    alone (a warning; every later report of it is told so: never a fresh count), a new
    budget finds none either, a passed verdict stays passed; once the action ended, its
    counts go to make room and their verdicts stay."""
    ledger = Ledger()
    for key, limit in (("a", 100), ("b", 100), ("c", 1), ("d", 100), ("e", 100)):
        ledger.register(key, limit)
    fits = 3 * budget_ledger.COUNT_BYTES + 4 * budget_ledger.PARTITION_BYTES
    monkeypatch.setattr(budget_ledger, "MAX_BYTES", fits)
    no_room = {"alone": "no room for its count"}
    with running_stage(spark, tmp_path / "one", 8) as stage, caplog.at_level(logging.WARNING):
        report = reporter(ledger, stage)
        assert "passed" in report("c", 0, 10, 2)  # passed: its partitions go
        assert report("e", 0, 10, 3) == {"reasons": True}
        for partition in range(3):
            assert report("a", partition, 10, 3) == {"reasons": True}
        assert report("a", 3, 10, 3) == no_room
        assert f"max_invalid=100 cannot be judged over the job of stage {stage}: no room" in caplog.text
        assert report("a", 0, 10, 3) == no_room  # never counted anew
        assert report("b", 0, 10, 3) == no_room  # a new budget finds none either
        assert "passed" in report("c", 1, 10, 0)
    monkeypatch.setattr(budget_ledger, "IDLE", 0.0)
    with running_stage(spark, tmp_path / "two", 8) as other:
        for partition in range(4):  # the ended action's counts go to make room
            assert reporter(ledger, other)("d", partition, 10, 3) == {"reasons": True}
    report = reporter(ledger, other, f"stage:{stage}")  # the ended action's budgets: their verdicts stay
    assert "passed" in report("c", 2, 10, 0)
    assert report("a", 1, 10, 0) == no_room
    assert report("e", 1, 10, 0) == {"alone": "its action had ended: its count went to "
                                              "make room"}


def test_a_report_needing_room_asks_spark_about_a_bounded_number_of_counts(
        spark, tmp_path, monkeypatch):
    """A full ledger of idle counts whose stage still runs (a token holder's flood, or many
    budgets of a long action): a report that needs room asks Spark whether their actions
    ended for at most ROOM_CHECKS of them (a JVM call each, under the ledger's lock, which
    every other report and the channel's threads wait for), then counts alone."""
    ledger = Ledger()
    keys = [f"k{i}" for i in range(40)]
    for key in keys + ["late"]:
        ledger.register(key, 100)
    monkeypatch.setattr(budget_ledger, "MAX_BYTES",
                        len(keys) * (budget_ledger.COUNT_BYTES + budget_ledger.PARTITION_BYTES))
    with running_stage(spark, tmp_path / "run", 8) as stage:
        report = reporter(ledger, stage)
        for key in keys:
            assert report(key, 0, 10, 1) == {"reasons": True}
        monkeypatch.setattr(budget_ledger, "IDLE", 0.0)
        asked = []
        runs_any = ledger._stages.runs_any
        monkeypatch.setattr(ledger._stages, "runs_any", lambda seen: asked.append(seen) or runs_any(seen))
        assert report("late", 0, 10, 1) == {"alone": "no room for its count"}
        assert 0 < len(asked) <= budget_ledger.ROOM_CHECKS, len(asked)
