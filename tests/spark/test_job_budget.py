"""``max_invalid`` over every task of an action (``max_invalid_scope="action"``): the
tasks report their counts to the driver's ledger over its channel (real local Spark, the
shared session; task retries: tests/spark/test_job_budget_retries.py; Spark Connect:
tests/test_job_budget_connect.py)."""

from __future__ import annotations

import contextlib
import re

import pytest

import spark_keras as sk
from spark_keras.channel import budget_ledger, version_server
from spark_keras.channel import client as channel_client
from spark_keras.channel.credentials import budget_scope
from spark_keras.errors import InvalidRowsError
from spark_keras.spark import job_budget
from tests.models import mlp

N_FEATURES = 4
PARTITIONS, ROWS = 8, 500


def frame(spark, bad: list[int], rows: int = ROWS):
    """``id long, features array<double>``: ``len(bad)`` partitions of ``rows`` rows each
    (ids in order), the first ``bad[p]`` rows of partition ``p`` NaN (invalid)."""
    from pyspark.sql import functions as F

    part = F.floor(F.col("id") / rows).cast("int")
    bad_here = F.element_at(F.array(*[F.lit(b) for b in bad]), part + 1)
    value = F.when(F.col("id") % rows < bad_here, F.lit(float("nan"))) \
        .otherwise(F.col("id").cast("double") / (len(bad) * rows))
    return spark.range(0, len(bad) * rows, 1, len(bad)) \
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
    with pytest.raises(Exception, match=r"max_invalid=20 passed: 2[1-4] of"):  # the handle's
        df.select("features").rdd.mapPartitions(  # token, its budget p.<handle>.20
            lambda rows: bm.predict_partition([r[0] for r in rows], on_invalid="null",
                                              max_invalid=20)).collect()
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


def new_budget(make):
    """``(make()'s value, the key of the budget it registered, that budget's address)``."""
    before = set(budget_ledger.ledger._budgets)
    made = make()
    (key,) = set(budget_ledger.ledger._budgets) - before
    return made, key, version_server._server.address_for(budget_scope(key))


def reporting_first(address, key: str, counts: str):
    """A ``mapInPandas`` function that reports ``counts`` (a forger's report: ``limit=1e17``)
    for budget ``key`` in its task's scope, stage and partition, then passes its rows on."""
    def run(batches):
        from pyspark import TaskContext

        from spark_keras.channel import client as channel_client
        from spark_keras.executor.task_version import task_scope

        context = TaskContext.get()
        channel_client.report(address, {
            "name": key, "scope": task_scope()[1], "counts": counts, "limit": "1e17",
            "final": "0", "task": f"{context.stageId()}.{context.partitionId()}.0"})
        yield from batches

    return run


def test_a_report_names_its_budget_and_a_running_stage_never_its_limit(spark, bm):
    """Issue 51 item 5, over the real channel with the budget's own token: a report that
    says ``limit=1e17`` before the budget's tasks report changes nothing (the driver's
    registered limit decides: 24 invalid rows pass 20); a report naming a stage that
    does not run (ended, never made) is refused; a budget the driver never registered is
    refused; a handle's token reports no budget but its ``predict_partition``'s."""
    df = frame(spark, [3] * PARTITIONS)
    column, key, address = new_budget(
        lambda: bm.predict_udf(on_invalid="null", max_invalid=20)("features").alias("prediction"))
    forged = df.mapInPandas(reporting_first(address, key, "0.0"), df.schema)
    with pytest.raises(Exception, match=r"max_invalid=20 passed: 2[1-4] of"):
        forged.select("id", column).collect()
    tracker = spark.sparkContext.statusTracker()
    ended = max(tracker.getJobInfo(max(tracker.getJobIdsForGroup(None))).stageIds)
    fields = {"name": key, "scope": "sql:1", "counts": "1000000.1000000", "limit": "1",
              "final": "1"}
    for stage in (ended, 10**8):
        with pytest.raises(sk.SparkKerasError, match=f"409.*stage {stage} does not run"):
            channel_client.report(address, {**fields, "task": f"{stage}.0.0"})
    clean = frame(spark, [0] * PARTITIONS)  # passes: no forged count was kept
    assert clean.select("id", column).where("prediction is null").count() == 0
    unknown = version_server._server.address_for(budget_scope("never-made"))
    with pytest.raises(sk.SparkKerasError, match="404"):
        channel_client.report(unknown, {**fields, "name": "never-made", "task": "1.0.0"})
    wrong = channel_client.Address((*address[:2], "not-the-token", *address[3:]))
    with pytest.raises(sk.SparkKerasError, match="403"):
        channel_client.report(wrong, {**fields, "task": "1.0.0"})
    for name in (key, f"p.another-handle.{20!r}"):  # a handle's token: its own budgets only
        with pytest.raises(sk.SparkKerasError, match="403"):
            channel_client.report(bm._versions, {**fields, "name": name, "task": "1.0.0"})


def reporting_others(limits):
    """A ``mapInPandas`` function whose tasks first report, for each of ``limits`` (other
    budgets of this driver), a last batch with no rows, then pass their rows on."""
    def run(batches):
        from spark_keras.spark import job_budget

        for limit in limits:
            job_budget.budget_of(limit).finish()
        yield from batches

    return run


def test_other_budgets_reporting_during_an_action_leave_its_count(spark, bm):
    """Issue 51 item 6: 65 other budgets report in each task of an action (as 65
    micro-batches of a stream would on the same driver) before its scoring does: the
    action's count is kept whole, and 8 tasks of 3 invalid rows pass max_invalid=20 (the
    ledger kept 64 counts: the action's was dropped and restarted, and the job passed)."""
    others = [job_budget.limit_for(bm, 5) for _ in range(65)]
    df = frame(spark, [3] * PARTITIONS)
    busy = df.mapInPandas(reporting_others(others), df.schema)
    with pytest.raises(Exception) as raised:
        bm.transform(busy, "features", on_invalid="null", max_invalid=20).collect()
    limit, invalid, rows = passed(raised.value)
    assert limit == "20" and 20 < invalid <= 24, (invalid, rows)


def test_a_fraction_is_judged_on_the_tasks_that_score_with_it(spark, bm):
    """Issue 51 item 10: a stage some of whose tasks do not score with the budget (a union
    with unscored rows; a union of two transforms) is judged on the tasks that did: 400
    of 400 scored rows invalid pass max_invalid=0.1 (the fraction was never judged: the
    job passed); 30 of 400 (one partition 30% invalid) do not (each task alone would)."""
    from pyspark.sql import functions as F

    def scored(bad):
        return bm.transform(frame(spark, bad, rows=100), "features", on_invalid="null",
                            max_invalid=0.1)

    unscored = frame(spark, [0] * 4, rows=100) \
        .withColumn("prediction", F.lit(None).cast(scored([0]).schema["prediction"].dataType))
    with pytest.raises(Exception) as raised:
        scored([100] * 4).unionByName(unscored).collect()
    assert passed(raised.value) == ("0.1", 400, 400)
    assert "in all (the 4 of the 8 tasks of stage" in str(raised.value)
    with pytest.raises(Exception) as raised:
        scored([100] * 4).unionByName(scored([100] * 4)).collect()
    assert passed(raised.value) == ("0.1", 400, 400)
    mixed = scored([30, 0, 0, 0]).unionByName(unscored).collect()
    assert len(mixed) == 800 and sum(r.prediction is None for r in mixed) == 430


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


def forging(address, key: str, counts: str, partitions=None, scopes=None):
    """A ``mapInPandas`` function whose tasks first file forged reports for budget ``key``
    in their stage (a token holder's): ``counts`` for each of ``partitions`` (the task's
    own if None) under each of ``scopes`` (the task's own if None); refusals ignored."""
    def run(batches):
        import contextlib

        from pyspark import TaskContext

        from spark_keras.channel import client as channel_client
        from spark_keras.errors import SparkKerasError
        from spark_keras.executor.task_version import task_scope

        context, own = TaskContext.get(), task_scope()[1]
        for scope in scopes(own) if scopes else [own]:
            for partition in partitions or [context.partitionId()]:
                with contextlib.suppress(SparkKerasError):
                    channel_client.report(address, {
                        "name": key, "scope": scope, "counts": counts, "final": "0",
                        "task": f"{context.stageId()}.{partition}.0"})
        yield from batches

    return run


def test_made_up_partitions_take_no_slot_of_a_stage(spark, bm):
    """A token holder's reports of made-up partitions 10**6+ while the action's stage runs
    are refused: before, they filled the stage's 8 slots, every task's report was refused
    ('one too many'), each task counted alone and 24 invalid rows passed max_invalid=20."""
    df = frame(spark, [3] * PARTITIONS)
    column, key, address = new_budget(
        lambda: bm.predict_udf(on_invalid="null", max_invalid=20)("features").alias("prediction"))
    squat = df.mapInPandas(forging(address, key, "0.0", range(10**6, 10**6 + PARTITIONS)),
                           df.schema)
    with pytest.raises(Exception, match=r"max_invalid=20 passed: 2[1-4] of"):
        squat.select("id", column).collect()


def test_a_refused_report_fails_the_task_never_counts_alone(spark, bm):
    """A budget the driver no longer knows (404): the task fails naming the refusal; before,
    it counted alone and 24 invalid rows in 8 tasks passed max_invalid=20."""
    column, key, _ = new_budget(
        lambda: bm.predict_udf(on_invalid="null", max_invalid=20)("features").alias("prediction"))
    del budget_ledger.ledger._budgets[key]
    with pytest.raises(Exception, match=r"the driver refused this task's report .*404"):
        frame(spark, [3] * PARTITIONS).select("id", column).collect()


def test_a_report_counts_only_in_the_scope_that_runs_its_stage(spark, bm):
    """A token holder files, from another job's running stage, 1000 invalid rows under the
    next SQL executions' scopes (sql:<n+1>...): refused; before, the count was kept, passed
    max_invalid=20 at once and a clean action later failed with that verdict."""
    column, key, address = new_budget(
        lambda: bm.predict_udf(on_invalid="null", max_invalid=20)("features").alias("prediction"))

    def future(own: str) -> list[str]:
        number = int(own.rpartition(":")[2])
        return [f"sql:{n}" for n in range(number + 1, number + 20)]

    poison = spark.range(0, 2, 1, 2).mapInPandas(
        forging(address, key, "1000.1000", scopes=future), "id long")
    assert len(poison.collect()) == 2
    clean = frame(spark, [0] * PARTITIONS).select("id", column)
    assert clean.where("prediction is null").count() == 0
    with pytest.raises(Exception, match=r"max_invalid=20 passed: 2[1-4] of"):
        frame(spark, [3] * PARTITIONS).select("id", column).collect()


def test_a_partitions_rows_and_invalid_rows_are_one_reports(spark, bm):
    """A token holder reports rows=10**18 with no invalid row for each partition of the
    action's own stage and scope: each task's own report (250 of 500 invalid) replaces it;
    before, the largest rows and invalid rows were kept apart and 50% passed 0.1."""
    column, key, address = new_budget(
        lambda: bm.predict_udf(on_invalid="null", max_invalid=0.1)("features").alias("prediction"))
    df = frame(spark, [ROWS // 2] * PARTITIONS)
    forged = df.mapInPandas(forging(address, key, "999999999999999999.0"), df.schema)
    with pytest.raises(Exception) as raised:
        forged.select("id", column).collect()
    assert passed(raised.value)[0] == "0.1"


def test_an_action_whose_every_row_is_invalid_is_warned(spark, bm, caplog):
    """Every row NaN under a count that lets them pass (issue 55 item 5): the driver warns
    once, naming the rows and the first reason; one valid row: no warning."""
    import logging

    caplog.set_level(logging.WARNING, logger="spark_keras")
    rows = bm.transform(frame(spark, [ROWS, ROWS]), "features", on_invalid="null",
                        max_invalid=10**6).collect()
    assert len(rows) == 2 * ROWS and all(r.prediction is None for r in rows)
    warned = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("every row (")]
    assert len(warned) == 1, warned
    assert re.match(rf"every row \({2 * ROWS}\) scored by the tasks of SQL execution \d+ was "
                    rf"invalid \(max_invalid=1000000 let them pass\): its predictions are all "
                    rf"null; the first: column 'features': NaN", warned[0]), warned
    caplog.clear()
    bm.transform(frame(spark, [ROWS, ROWS - 1]), "features", on_invalid="null",
                 max_invalid=10**6).collect()
    assert not [r for r in caplog.records if r.getMessage().startswith("every row (")]
