"""``max_invalid`` over an action whose tasks Spark retries, on classic Spark and on Spark
Connect, and the whole budget on Connect (count, fraction) with the server in a process
of its own, as in a real deployment: the client learns the stages' tasks from the
server's progress messages, not from a SparkContext (fast cases on the shared classic
session: tests/spark/test_job_budget.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid

import pytest

import spark_keras as sk
from tests.conftest import REPO_ROOT, local_connect_server, make_spark
from tests.models import mlp
from tests.spark.test_job_budget import N_FEATURES, PARTITIONS, ROWS, frame, passed

pytestmark = [pytest.mark.timeout(900)]

_SERVER = """
import sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote("local[2,2]").getOrCreate()
open(sys.argv[1], "w").close()  # ready
sys.stdin.read()  # until the test closes it
spark.stop()
"""


def failing_once(folder: str):
    """A ``mapInPandas`` function that passes its rows on, then fails the task's first
    attempt once they are all through (the scoring before it has reported by then); each
    attempt leaves a file ``<partition>.<attempt>`` in ``folder``."""
    def run(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        for batch in batches:
            yield batch
        open(os.path.join(folder, f"{context.partitionId()}.{context.attemptNumber()}"), "w").close()
        if context.attemptNumber() == 0:
            raise RuntimeError("this attempt fails after its rows were scored")

    return run


def check_retries_count_once(spark, bm, folder) -> None:
    """Every task fails once after its scoring reported (two attempts each): 24 invalid
    rows stay 24 (48 would pass 30); 24 pass 23, the rows seen those of one attempt each."""
    df = frame(spark, [3] * PARTITIONS)

    def scored(name, limit):
        (folder / name).mkdir(parents=True)
        out = bm.transform(df, "features", on_invalid="null", max_invalid=limit)
        return out.mapInPandas(failing_once(str(folder / name)), out.schema)

    assert scored("a", 30).where("prediction is null").count() == 24
    assert sorted(os.listdir(folder / "a")) == \
        sorted(f"{p}.{a}" for p in range(PARTITIONS) for a in (0, 1))
    with pytest.raises(Exception) as raised:
        scored("b", 23).collect()
    assert passed(raised.value) == ("23", 24, PARTITIONS * ROWS)


@contextlib.contextmanager
def connect_server_apart(folder):
    """A Spark Connect session on a local server (local[2,2]) run by another process."""
    from pyspark.sql import SparkSession

    token = uuid.uuid4().hex  # the local server asks its clients for it
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=REPO_ROOT,
               SPARK_CONNECT_AUTHENTICATE_TOKEN=token)
    env.pop("SPARK_REMOTE", None)
    ready = folder / "server-ready"
    with local_connect_server():
        server = subprocess.Popen([sys.executable, "-c", _SERVER, str(ready)], env=env,
                                  cwd=REPO_ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.DEVNULL, text=True)
        try:
            while not ready.exists():
                assert server.poll() is None, "the Connect server did not start"
                time.sleep(0.5)
            session = SparkSession.builder.remote(f"sc://localhost:15002/;token={token}") \
                .getOrCreate()
            try:
                yield session
            finally:
                session.stop()
        finally:
            server.communicate("", timeout=120)


@pytest.mark.slow  # a classic session and a Connect server of their own: ~2.5-4 min here
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_retries_count_once_and_the_budget_on_connect(build_log, tmp_path):
    from pyspark import SparkContext

    classic = make_spark("local[2,2]", build_log)
    try:
        bm = sk.BroadcastModel(classic, mlp(N_FEATURES))
        check_retries_count_once(classic, bm, tmp_path / "classic")
    finally:
        classic.stop()

    with connect_server_apart(tmp_path) as spark:
        assert SparkContext._active_spark_context is None  # stages known from progress only
        bm = sk.BroadcastModel(spark, mlp(N_FEATURES))
        df = frame(spark, [3] * PARTITIONS)
        with pytest.raises(Exception) as raised:
            bm.transform(df, "features", on_invalid="null", max_invalid=20).collect()
        limit, invalid, rows = passed(raised.value)
        assert limit == "20" and 20 < invalid <= 24 and rows == invalid // 3 * ROWS

        one_bad = frame(spark, [200] + [0] * (PARTITIONS - 1))  # 5%, one partition 40%
        started = time.monotonic()
        out = bm.transform(one_bad, "features", on_invalid="null", max_invalid=0.1).toPandas()
        assert out.prediction.isna().sum() == 200
        assert time.monotonic() - started < 60
        three_bad = frame(spark, [200, 200, 200] + [0] * (PARTITIONS - 3))  # 15%
        with pytest.raises(Exception) as raised:
            bm.transform(three_bad, "features", on_invalid="null", max_invalid=0.1).collect()
        assert passed(raised.value) == ("0.1", 600, 4000)
        assert f"in all (the {PARTITIONS} tasks of stage" in str(raised.value)

        check_retries_count_once(spark, bm, tmp_path / "connect")
