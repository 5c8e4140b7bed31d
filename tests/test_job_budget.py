"""``max_invalid`` over every task of an action (``max_invalid_scope="action"``): the
tasks report their counts to the driver's ledger over its channel (real local Spark, the
shared session; task retries: tests/test_job_budget_retries.py; Spark Connect:
tests/test_job_budget_connect.py)."""

from __future__ import annotations

import contextlib
import re

import pytest

import spark_keras as sk
from spark_keras.errors import InvalidRowsError
from spark_keras.spark import budget_ledger, channel_client
from spark_keras.spark.channel_server import Refused
from spark_keras.spark.versions import active_context

from .models import mlp

N_FEATURES = 4
PARTITIONS, ROWS = 8, 500


def frame(spark, bad: list[int]):
    """``id long, features array<double>``: PARTITIONS partitions of ROWS rows each (ids in
    order), the first ``bad[p]`` rows of partition ``p`` NaN (invalid)."""
    from pyspark.sql import functions as F

    part = F.floor(F.col("id") / ROWS).cast("int")
    bad_here = F.element_at(F.array(*[F.lit(b) for b in bad]), part + 1)
    value = F.when(F.col("id") % ROWS < bad_here, F.lit(float("nan"))) \
        .otherwise(F.col("id").cast("double") / (PARTITIONS * ROWS))
    return spark.range(0, PARTITIONS * ROWS, 1, PARTITIONS) \
        .withColumn("features", F.array(*[value] * N_FEATURES))


def passed(exc: BaseException) -> tuple[str, int, int]:
    """(max_invalid, invalid rows, rows seen) of the InvalidRowsError a job failed with."""
    text = str(exc)
    found = re.search(r"InvalidRowsError: max_invalid=([0-9.]+) passed: ([0-9]+) of ([0-9]+) rows",
                      text)
    assert found, text[-3000:]
    return found.group(1), int(found.group(2)), int(found.group(3))


@pytest.fixture(scope="module")
def bm(spark):
    handle = sk.BroadcastModel(spark, mlp(N_FEATURES))
    yield handle
    handle.destroy()


def test_a_count_passed_by_many_tasks_each_under_it_aborts(spark, bm):
    """8 tasks of 500 rows with 3 invalid rows each: 24 invalid rows pass max_invalid=20
    though no task does; the error names the limit, the action's count when it passed,
    the rows seen then and the first reasons. Each task alone stays under it."""
    df = frame(spark, [3] * PARTITIONS)
    # counted per task, by choice: no task passes 20
    out = bm.transform(df, "features", on_invalid="null", max_invalid=20,
                       max_invalid_scope="task").where("prediction is null").count()
    assert out == 24
    with pytest.raises(Exception) as raised:
        bm.transform(df, "features", on_invalid="null", max_invalid=20).collect()
    limit, invalid, rows = passed(raised.value)
    # it passed at the 7th task's report (each task reports its one batch): 21 of 3500
    assert limit == "20" and 20 < invalid <= 24 and rows == invalid // 3 * ROWS, (invalid, rows)
    assert "scored by the tasks of SQL execution" in str(raised.value)
    assert "the first: column 'features': NaN" in str(raised.value)
    with pytest.raises(Exception, match=r"max_invalid=20 passed: 2[1-4] of"):
        df.select(bm.predict_udf(on_invalid="null", max_invalid=20)("features")).collect()
    with pytest.raises(sk.ArgumentError, match="max_invalid_scope"):
        bm.transform(df, "features", on_invalid="null", max_invalid=2, max_invalid_scope="job")


def test_a_fraction_is_judged_on_the_whole_action(spark, bm):
    """max_invalid=0.1: one partition 40% invalid in a job 5% invalid passes (the task alone
    would fail); a job 15% invalid fails, once every task of the stage has reported."""
    one_bad = frame(spark, [200] + [0] * (PARTITIONS - 1))  # 200 of 4000: 5%
    out = bm.transform(one_bad, "features", on_invalid="null", max_invalid=0.1)
    assert out.where("prediction is null").count() == 200
    with pytest.raises(Exception, match=r"max_invalid=0.1 passed: 200 of 500 rows .* of this task"):
        bm.transform(one_bad, "features", on_invalid="null", max_invalid=0.1,
                     max_invalid_scope="task").collect()
    three_bad = frame(spark, [200, 200, 200] + [0] * (PARTITIONS - 3))  # 600 of 4000: 15%
    with pytest.raises(Exception) as raised:
        bm.transform(three_bad, "features", on_invalid="null", max_invalid=0.1).collect()
    assert passed(raised.value) == ("0.1", 600, 4000)
    assert f"in all (the {PARTITIONS} tasks of stage" in str(raised.value)


def test_rows_scored_twice_in_one_action_count_once(spark, bm):
    """A sort scores every partition twice (its sampling job, then the sort's); a filter on
    the reasons is evaluated below the exchange on every row, then again above it on the
    rows kept: the action counts its largest stage, 24 invalid rows (48 would pass 25)."""
    df = frame(spark, [3] * PARTITIONS)
    out = bm.transform(df, "features", on_invalid="null", max_invalid=25).orderBy("id").collect()
    assert sum(r.prediction is None for r in out) == 24 and len(out) == 4000
    kept = bm.transform(df.repartition(3).coalesce(1), "features", on_invalid="null",
                        error_col="error", max_invalid=24).where("error is not null")
    assert len(kept.collect()) == 24


def test_the_ledger_counts_each_partition_once_and_is_bounded(spark, monkeypatch):
    """The driver's ledger itself: two attempts of one partition (a retry, a speculative
    copy) count once, their furthest; two stages count as the larger; a fraction waits for
    the stage's number of tasks; past MAX_PARTITIONS a task counts alone; malformed
    reports are refused."""
    ledger = budget_ledger.Ledger()
    context = active_context()
    budget_ledger.stage_tasks.learn(context, 900_001, 2)

    def report(partition, attempt, rows, invalid, limit="5", final=False, stage=900_001,
               key="k", reasons=()):
        return ledger.answer(budget_ledger.Report(key, "sql:77", stage, partition, attempt, rows,
                                                  invalid, float(limit) if "." in limit
                                                  else int(limit), final, tuple(reasons)))

    assert "passed" not in report(0, 0, 100, 3, reasons=["row 1 NaN"])
    assert "passed" not in report(0, 1, 100, 3)  # its retry: still 3
    assert "passed" not in report(0, 1, 200, 5)  # further: 5
    answer = report(1, 0, 10, 1, reasons=["row 9 NaN"])
    assert answer["passed"].startswith("max_invalid=5 passed: 6 of 210 rows (2.86%) scored by "
                                       "the tasks of SQL execution 77 were invalid so far; "
                                       "the first: row 1 NaN; row 9 NaN")
    assert report(1, 1, 0, 0)["passed"] == answer["passed"]  # every later report of it
    # another stage scoring the rows again (or some of them) counts as the largest stage
    assert "passed" not in report(0, 0, 100, 3, key="s")
    assert "passed" not in report(0, 0, 100, 3, key="s", stage=900_003)
    assert "passed" not in report(1, 0, 100, 2, key="s", stage=900_003)  # 5 in that stage
    assert "passed" in report(1, 0, 100, 3, key="s", stage=900_003)
    # a fraction: judged once both tasks of the stage reported their last batch
    assert report(0, 0, 100, 50, limit="0.1", final=True, key="f") == {"reasons": True}
    assert "passed" in report(1, 0, 100, 0, limit="0.1", final=True, key="f")
    assert "passed" not in report(1, 0, 100, 0, limit="0.1", final=True, key="g")
    assert "passed" not in report(0, 0, 900, 50, limit="0.1", final=True, key="g")  # 5%
    assert report(0, 0, 100, 50, limit="0.1", final=True, key="h", stage=900_002) \
        == {"reasons": True, "pending": budget_ledger.PENDING_RETRY}  # its tasks unknown
    monkeypatch.setattr(budget_ledger, "MAX_PARTITIONS", 2)
    assert "alone" in report(2, 0, 1, 0, key="g")
    for bad in ({"name": "k"}, {"name": "k", "task": "1.2.3", "counts": "1.2", "limit": "1",
                                "final": "0"},
                {"name": "k", "task": "1.2.3", "counts": "2.1", "limit": "1.5", "final": "0"}):
        with pytest.raises(Refused):
            budget_ledger.Report.parse(bad, "sql:1")
    assert budget_ledger.Report.parse({"name": "k", "task": "1.2.3", "counts": "2.1",
                                       "limit": "1e-05", "final": "1",
                                       "reasons": '["x"]'}, "sql:1").limit == 1e-05


def test_a_report_needs_the_drivers_token(spark, bm):
    """Reports are authenticated as the version requests are: a wrong token is refused."""
    forged = channel_client.Address((bm._versions.host, bm._versions.port, "not-the-token",
                                     bm._versions.fingerprint))
    fields = {"name": "k", "scope": "sql:1", "task": "1.0.0", "counts": "10.10",
              "limit": "1", "final": "0"}
    with pytest.raises(sk.SparkKerasError, match="403"):
        channel_client.report(forged, fields)
    assert "passed" in channel_client.report(bm._versions, fields)


def test_outside_a_task_a_call_counts_alone(bm):
    """``predict_partition`` called on the driver (no Spark task): the call's rows alone."""
    rows = [[float("nan")] * N_FEATURES] * 3 + [[0.5] * N_FEATURES] * 7
    assert sum(p is None for p in bm.predict_partition(rows, on_invalid="null", max_invalid=3)) == 3
    with pytest.raises(InvalidRowsError, match="max_invalid=2 passed: 3 of 10 rows"):
        list(bm.predict_partition(rows, on_invalid="null", max_invalid=2))


def test_a_stream_counts_each_micro_batch(spark, bm, tmp_path):
    """In a streaming query the budget is each micro-batch's (its tasks together): two
    micro-batches of 6 invalid rows stay under max_invalid=8; under 5 the first fails."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "in"
    source.mkdir()
    for i in range(2):
        ids = list(range(i * 100, (i + 1) * 100))
        features = [[float("nan")] * N_FEATURES if j % 100 < 6 else [0.5] * N_FEATURES
                    for j in ids]
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                                 "features": pa.array(features, pa.list_(pa.float64()))}),
                       source / f"part-{i}.parquet")

    def run(limit: int, name: str):
        stream = spark.readStream.schema("id long, features array<double>") \
            .option("maxFilesPerTrigger", 1).parquet(str(source)).repartition(2, "id")
        query = (bm.transform(stream, "features", on_invalid="null", max_invalid=limit)
                 .writeStream.format("memory").queryName(name)
                 .option("checkpointLocation", str(tmp_path / name))
                 .trigger(availableNow=True).start())
        with contextlib.suppress(Exception):  # a failed query raises here: see exception()
            query.awaitTermination(120)
        return query

    fine = run(8, "budget_fine")
    assert fine.exception() is None and fine.lastProgress["batchId"] == 1
    assert spark.table("budget_fine").where("prediction is null").count() == 12
    over = run(5, "budget_over")
    assert over.exception() is not None
    assert re.search(r"max_invalid=5 passed: 6 of 100 rows .* micro-batch 0 of streaming query",
                     str(over.exception())), str(over.exception())[-2000:]
