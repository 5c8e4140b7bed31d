"""The commits section's fixed cost of one commit (:func:`spark_keras.jobs.score.commits.commit`):
the lease checked, the group's staged files listed, its record written (``.moving``, then final: each a file
written and renamed), the lease checked before the record and each rename (a listing of
the lease folder), each file renamed into the output, the ``.moving`` record and the
staging folder removed. Timed on the local filesystem through Hadoop's FileSystem (the
classic job's path layer, :class:`~spark_keras.jobs.score.files.HadoopPaths`), and the
path layer's calls counted, by kind: on an object store each is a request (a rename is a
copy and a delete there)."""

from __future__ import annotations

import collections
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

REPEATS = 20


def described() -> str:
    """What the docs say of this table."""
    return ("A commit's fixed cost (`spark_keras.jobs.score.commits.commit`, and the lease "
            "check before it): the lease folder listed, the group's staging folder listed, "
            "its record written twice (`.moving`, then final: a file written and renamed "
            "each), each file renamed into the output (the lease's beat age checked before "
            "each), the `.moving` record and the staging folder removed; timed on the local "
            "filesystem through Hadoop's FileSystem (the classic job's path layer, each call "
            "a Py4J round trip), with the path layer's calls counted by kind (on an object "
            "store each is a request, a rename a copy and a delete). Staged files of 1 KiB, "
            f"median of {REPEATS} commits.")


def _counting(paths: Any, calls: collections.Counter) -> Any:
    """``paths`` whose every call is counted in ``calls`` by method name."""

    class Counting:
        def __getattr__(self, name: str) -> Any:
            method = getattr(paths, name)

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls[name] += 1
                return method(*args, **kwargs)
            return counted
    return Counting()


def run(spark: Any, files_per_group: tuple[int, ...] = (1, 8), repeats: int = REPEATS) -> list[dict]:
    """One row per group size: milliseconds per commit (median) and path calls per commit."""
    from spark_keras.jobs.score import commits
    from spark_keras.jobs.score.files import HadoopPaths
    from spark_keras.jobs.score.lease import Leases
    from spark_keras.jobs.score.manifest import FORMAT, Plan

    rows = []
    for files in files_per_group:
        work = tempfile.mkdtemp(prefix="commit-cost-")
        calls: collections.Counter = collections.Counter()
        paths = _counting(HadoopPaths(spark), calls)
        out = os.path.join(work, "out")
        plan = Plan(paths, os.path.join(work, "input"), out,
                    {"format": FORMAT, "files": [["part-0.parquet", 1, 0]],
                     "groups": [[0]] * repeats}, resume=False)
        seconds = []
        try:
            with Leases(paths, [out]) as leases:
                commits.begin(plan)
                for index in range(repeats):
                    tag = f"_staging-g{index:05d}-{index:012x}"
                    os.makedirs(os.path.join(out, tag))
                    for j in range(files):  # what Spark wrote: not timed
                        with open(os.path.join(out, tag, f"part-{j:05d}-x.parquet"), "wb") as f:
                            f.write(b"x" * 1024)
                    calls.clear()
                    started = time.perf_counter()
                    leases.check()  # as the job does before each commit
                    commits.commit(plan, index, {"": os.path.join(out, tag)},
                                   {"format": FORMAT, "group": index, "rows": 1,
                                    "invalid_rows": 0}, leases.held)
                    seconds.append(time.perf_counter() - started)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        rows.append({"files per group": files,
                     "ms per commit (median)": 1000 * statistics.median(seconds),
                     "path calls per commit": sum(calls.values()),
                     "renames": calls["move"], "listings": calls["children"],
                     "writes": calls["create"], "deletes": calls["delete"],
                     "exists/status": calls["exists"] + calls["status"]})
    return rows


def measure(quick: bool = False) -> list[dict]:
    """:func:`run` in a local[2] session of its own."""
    from bench.sessions import local_session

    spark = local_session("commit-cost", driver_memory="1g")
    try:
        return run(spark, repeats=3 if quick else REPEATS)
    finally:
        spark.stop()
