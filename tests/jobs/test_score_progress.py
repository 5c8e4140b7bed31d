"""The score job's progress lines against known counts (issue 55 item 4, issue 53 item 3):
the number formats, a resumable run's line after its commits, a plain run's line with
rows, rows/s and an ETA (on Spark: tests/jobs/test_score_resume.py's progress case)."""

from __future__ import annotations

import re
import time

import pytest

from spark_keras.jobs.score.manifest import Plan
from spark_keras.jobs.score.progress import Progress, Running, count, scoring_line


@pytest.mark.parametrize("n, text", [(0, "0"), (999, "999"), (1000, "1,000"), (9999, "9,999"),
                                     (10_000, "10.0k"), (24_000, "24.0k"), (100_000, "100.0k"),
                                     (240_000, "240.0k"), (999_949, "999.9k"),
                                     (999_950, "1.0M"), (2_400_000, "2.4M"),
                                     (3_400_000_000, "3.4B")])
def test_counts_read_as_their_value(n, text):
    assert count(n) == text


def test_a_commit_line_gives_the_rows_committed():
    """24 groups of 10,000 rows (1,000 of them invalid): 240.0k rows, 1,000 invalid."""
    files = [[f"part-{i}.parquet", 1000, 0] for i in range(24)]
    plan = Plan(paths=None, input="in", output="out",
                manifest={"files": files, "groups": [[i] for i in range(24)]}, resume=False)
    progress = Progress(plan, {})
    for i in range(24):
        progress.add(i, {"rows": 10_000, "invalid_rows": 1000 if i == 0 else 0,
                         "model_builds": 1, "build_seconds": 0.1})
    assert re.fullmatch(r"committed 24 of 24 groups, 240\.0k rows \(1,000 invalid\), "
                        r"[\d.,]+[kMB]? rows/s, ETA 00:00:00", progress.line()), progress.line()


def test_a_plain_runs_line_gives_rows_rows_per_second_and_an_eta():
    started = time.perf_counter() - 10.0  # 10 s in
    line = scoring_line(started, total_rows=240_000)(Running(0, 2, 60_000))
    assert re.fullmatch(r"scoring: 60\.0k of 240\.0k rows, 6,000 rows/s, 0 of 2 tasks, "
                        r"00:00:10 elapsed, ETA 00:00:30", line), line
    unknown = scoring_line(started)(Running(1, 4, 12_345))  # a CSV input: ETA by tasks
    assert re.fullmatch(r"scoring: 12\.3k rows, 1,234 rows/s, 1 of 4 tasks, 00:00:10 "
                        r"elapsed, ETA 00:00:30", unknown), unknown
    connect = scoring_line(started, 240_000)(Running(1, 4))  # no rows: by tasks
    assert connect == "scoring: 1 of 4 tasks, 00:00:10 elapsed, ETA 00:00:30", connect
    assert scoring_line(started)(None) == "scoring: no Spark stage running, 00:00:10 elapsed"


def test_the_rows_of_a_running_query_are_its_python_nodes_output_rows(spark, tmp_path):
    """Four partitions of 1,000 rows through ``mapInArrow``, the last held until told:
    the running query has returned 3,000 rows (what the progress lines count); none once
    it ended (once Spark's listener bus has told its status store)."""
    import os
    import threading

    from pyspark import TaskContext

    from spark_keras.jobs.score.progress import scored_rows

    gate = str(tmp_path / "go")

    def held(batches):
        for batch in batches:
            while TaskContext.get().partitionId() == 3 and not os.path.exists(gate):
                time.sleep(0.05)
            yield batch

    store = spark._jsparkSession.sharedState().statusStore()
    query = spark.range(0, 4000, 1, 4).mapInArrow(held, "id long")
    thread = threading.Thread(target=lambda: query.write.parquet(str(tmp_path / "out")))
    thread.start()
    try:
        seen, deadline = 0, time.monotonic() + 120
        while seen < 3000 and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = scored_rows(store)
        assert seen == 3000
    finally:
        open(gate, "w").close()
        thread.join()
    # the execution's end reaches the status store through Spark's listener bus, after
    # the write returned (under load, seconds later)
    deadline = time.monotonic() + 30
    while scored_rows(store) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert scored_rows(store) == 0
