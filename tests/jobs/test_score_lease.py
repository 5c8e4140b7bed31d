"""One job at a time per output (issue 46's review): the lease a resumable score run holds
on its output (:mod:`spark_keras.jobs.score.lease`), on local files through the path layer
the job uses on Spark Connect (``ArrowPaths``), with real processes; and two real score
jobs started together on one output (slow)."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from spark_keras.jobs.score import lease as score_lease
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.lease import Lease, Leases, lease_folder
from tests.conftest import REPO_ROOT


@pytest.fixture
def quick(monkeypatch):
    """Beats every 0.2 s, a foreign holder stale after 2 s (the module's settings)."""
    monkeypatch.setattr(score_lease, "BEAT_SECONDS", 0.2)
    monkeypatch.setattr(score_lease, "STALE_SECONDS", 2.0)


def _holder(folder, token: str, **info) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"holder-{token}.json")
    with open(path, "w") as f:
        json.dump(info, f)
    return path


def test_a_second_job_is_refused_while_the_first_holds_the_output(tmp_path, quick):
    out = str(tmp_path / "scored")
    first = Lease(ArrowPaths(), out)
    first.take()
    assert lease_folder(out) == str(tmp_path / ".scored.spark-keras-lease")
    with pytest.raises(JobError, match=rf"output '{out}' is being written by another score job "
                                       rf"\(pid {os.getpid()} on host"):
        Lease(ArrowPaths(), out).take()
    first.check()
    first.release()
    assert not os.path.exists(lease_folder(out))  # nothing left beside the output
    with Lease(ArrowPaths(), out) as again:  # free again
        again.check()


def test_a_job_holds_every_folder_it_writes_or_none(tmp_path, quick):
    """Leases (the output and the quarantine): one spelling of a place is one lease; when
    another job holds one of the folders the job takes none (the one it took first is
    given back), and check() fails when any one was taken over."""
    out, q = str(tmp_path / "out"), str(tmp_path / "q")
    assert len(Leases(ArrowPaths(), [out, None, out + "/.", q])._leases) == 2
    other = Lease(ArrowPaths(), out)  # sorts after q's: taken second
    other.take()
    with pytest.raises(JobError, match=rf"output '{out}' is being written by another"):
        Leases(ArrowPaths(), [out, q]).take()
    assert not os.path.exists(lease_folder(q))  # q's, taken first, was given back
    other.release()
    with Leases(ArrowPaths(), [out, q]) as both:
        both.check()
        for token in os.listdir(lease_folder(q)):
            os.remove(os.path.join(lease_folder(q), token))  # q's lease taken over
        with pytest.raises(JobError, match=rf"output '{q}': another score job holds it now"):
            both.check()
    assert not os.path.exists(lease_folder(out))


def test_the_lease_of_a_job_that_died_on_this_host_is_taken_over(tmp_path, quick):
    """A SIGKILLed driver leaves its holder file: its process is gone, so a rerun takes
    the output at once (and so after a pid reused by another process)."""
    out = str(tmp_path / "scored")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import socket

    stale = _holder(lease_folder(out), "0" * 28, host=socket.gethostname(), pid=dead.pid,
                    pid_start="1", started="earlier")
    reused = _holder(lease_folder(out), "1" * 28, host=socket.gethostname(), pid=os.getpid(),
                     pid_start="1", started="earlier")  # this pid, another start time
    started = time.monotonic()
    with Lease(ArrowPaths(), out):
        assert not os.path.exists(stale) and not os.path.exists(reused)
    assert time.monotonic() - started < 1.9  # no waiting for beats


def test_a_holder_on_another_host_counts_while_its_beats_go_on(tmp_path, quick):
    out = str(tmp_path / "scored")
    folder = lease_folder(out)
    token = "0" * 28
    _holder(folder, token, host="another-host", pid=1, started="earlier")
    stop = threading.Event()

    def beats() -> None:  # what that host's job writes
        n = 0
        while not stop.wait(0.2):
            open(os.path.join(folder, f"beat-{token}-{n:012d}"), "w").close()
            if n:
                os.remove(os.path.join(folder, f"beat-{token}-{n - 1:012d}"))
            n += 1

    beating = threading.Thread(target=beats)
    beating.start()
    try:
        with pytest.raises(JobError, match="on host 'another-host'"):
            Lease(ArrowPaths(), out).take()
    finally:
        stop.set()
        beating.join()
    started = time.monotonic()
    with Lease(ArrowPaths(), out):  # its beats stalled: taken over after STALE_SECONDS
        assert time.monotonic() - started >= 2.0
        assert not os.path.exists(os.path.join(folder, f"holder-{token}.json"))



_HOLD = """
import sys
from spark_keras.jobs.score import lease as score_lease
from spark_keras.jobs.score.arrow_paths import ArrowPaths
score_lease.BEAT_SECONDS = 0.2
with score_lease.Lease(ArrowPaths(), sys.argv[1]):
    print("taken", flush=True)
    sys.stdin.read()  # until the test closes it
"""


def test_a_job_of_another_pid_namespace_of_this_host_counts_while_its_beats_go_on(
        tmp_path, quick):
    """Containers sharing the host's network share its host name, not its pids (docker
    --net=host, Kubernetes' hostNetwork): a live job in another pid namespace (its pid 1
    here is this namespace's init, of another start time) was judged dead and its output
    taken over at once; now it is watched as another host's, by its beats."""
    if subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("unshare of a pid namespace is not permitted here")
    out = str(tmp_path / "scored")
    holder = subprocess.Popen(["unshare", "-pf", "--mount-proc", sys.executable, "-c", _HOLD, out],
                              cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "taken"
        with pytest.raises(JobError, match=r"is being written by another score job \(pid 1 on host"):
            Lease(ArrowPaths(), out).take()
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0

def test_a_job_whose_lease_was_taken_over_stops_before_its_next_commit(tmp_path, quick):
    out = str(tmp_path / "scored")
    lease = Lease(ArrowPaths(), out)
    lease.take()
    try:
        for name in os.listdir(lease.folder):  # what a job judging it dead removes
            os.remove(os.path.join(lease.folder, name))
        with pytest.raises(JobError, match="another score job holds it now"):
            lease.check()
    finally:
        lease.release()


def test_one_output_one_lease_however_it_is_spelled(tmp_path, quick):
    """``out``, ``out/``, ``out/.``, ``x/../out``, ``file://.../out`` and a symlink to its
    folder are one place, so one lease; a filesystem's or bucket's root is refused."""
    (tmp_path / "x").mkdir()
    (tmp_path / "link").symlink_to(tmp_path)
    out = str(tmp_path / "out")
    with Lease(ArrowPaths(), out) as held:
        for spelling in (out + "/", out + "/.", str(tmp_path / "x" / ".." / "out"),
                         "file://" + out, str(tmp_path / "link" / "out")):
            assert lease_folder(ArrowPaths().place(spelling)) == held.folder, spelling
            with pytest.raises(JobError, match="is being written by another score job"):
                Lease(ArrowPaths(), spelling).take()
    for root in ("/", "s3a://bucket", "s3a://bucket/"):
        with pytest.raises(JobError, match="is the root of its filesystem or bucket"):
            Lease(ArrowPaths(), root)


def test_a_damaged_holder_file_is_taken_over_at_once(tmp_path, quick):
    """Holder files are written whole: one that is not a holder's (empty, not JSON, a pid
    that is not a number) is no job's."""
    out = str(tmp_path / "scored")
    folder = lease_folder(out)
    os.makedirs(folder)
    for token, text in (("0" * 28, ""), ("1" * 28, "{not json"),
                        ("2" * 28, json.dumps({"host": "h", "pid": "999999"}))):
        with open(os.path.join(folder, f"holder-{token}.json"), "w") as f:
            f.write(text)
    started = time.monotonic()
    with Lease(ArrowPaths(), out):
        assert time.monotonic() - started < 1.9
        assert len([n for n in os.listdir(folder) if n.startswith("holder-")]) == 1


_CLAIM_AND_HOLD = """
import sys, time
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.lease import Lease
from spark_keras.jobs.score.arrow_paths import ArrowPaths
lease = Lease(ArrowPaths(), sys.argv[1])
try:
    lease.take()
except JobError as exc:
    print('refused', exc, flush=True)
    sys.exit(2)
for _ in range(6):
    time.sleep(1)
    lease.check()
lease.release()
print('held', flush=True)
"""


@pytest.mark.slow  # ~15 s: the module's own 30 s / 5 s settings, in processes
def test_a_claimant_that_stalled_comes_after_the_job_that_took_the_output(tmp_path):
    """The review's race: a job watching a stalled holder of another host is stopped
    (SIGSTOP: any stall), that holder goes, another job takes the output, the first
    continues: it must not take the output too (its claim is ordered by when it is
    written, not when the job began)."""
    import signal

    out = str(tmp_path / "scored")
    folder = lease_folder(out)
    _holder(folder, "0" * 28, host="another-host", pid=1, started="earlier")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    run = [sys.executable, "-c", _CLAIM_AND_HOLD, out]
    late = subprocess.Popen(run, stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(4)  # watching the foreign holder's beats
    os.kill(late.pid, signal.SIGSTOP)
    for name in os.listdir(folder):  # that job ends
        os.remove(os.path.join(folder, name))
    first = subprocess.Popen(run, stdout=subprocess.PIPE, text=True, env=env)
    time.sleep(5)
    os.kill(late.pid, signal.SIGCONT)
    said = {"first": first.communicate(timeout=60)[0], "late": late.communicate(timeout=60)[0]}
    assert (first.returncode, late.returncode) == (0, 2), said
    assert "held" in said["first"] and "is being written by another score job" in said["late"], \
        said


def _claim(out: str, start: float, results) -> None:
    time.sleep(max(0.0, start - time.time()))
    try:
        with Lease(ArrowPaths(), out):
            time.sleep(1.5)  # holds it while the others decide
        results.put("took")
    except JobError as exc:
        results.put(str(exc))


def test_of_jobs_claiming_an_output_at_once_one_takes_it(tmp_path):
    out = str(tmp_path / "scored")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    start = time.time() + 4  # spawned interpreters import first
    claims = [ctx.Process(target=_claim, args=(out, start, results)) for _ in range(4)]
    for p in claims:
        p.start()
    for p in claims:
        p.join(60)
    outcomes = sorted(results.get(timeout=5) for _ in claims)
    assert outcomes.count("took") == 1, outcomes
    assert all("one job at a time per output" in o for o in outcomes if o != "took"), outcomes
    assert not os.path.exists(lease_folder(out))


def _job(args: list[str], log) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.Popen([sys.executable, "-m", "spark_keras.jobs.score", *args],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)


@pytest.mark.slow  # two score jobs, each with its own local Spark (~2 min)
@pytest.mark.heavy  # make test-heavy: CI's time goes to the versions machine's new contexts
def test_two_resumable_jobs_on_one_output_one_runs_the_other_is_refused(tmp_path):
    """The review's case: two ``--resume`` jobs started together on one output left a
    group twice in it and one of them exited 0. Now one is refused (exit 2) before it
    removes or writes anything; the other's output holds every row once."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    import spark_keras as sk
    from tests import models

    data = tmp_path / "in"
    data.mkdir()
    for f in range(6):
        ids = np.arange(f * 100, (f + 1) * 100)
        x = np.random.default_rng(f).standard_normal((100, 4)).astype("float32")
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()),
                                 "features": pa.array(list(x), pa.list_(pa.float32()))}),
                       data / f"part-{f}.parquet")
    sk.save(models.mlp(n_features=4, hidden=8), str(tmp_path / "model.skp"))
    size = os.path.getsize(data / "part-0.parquet")
    args = ["--model", str(tmp_path / "model.skp"), "--input", str(data), "--output",
            str(tmp_path / "out"), "--features", "features", "--master", "local[1]",
            "--resume", "--commit-bytes", str(size + 10)]
    logs = [open(tmp_path / f"job{i}.log", "w+") for i in range(2)]
    jobs = [_job(args, log) for log in logs]
    codes = [job.wait(600) for job in jobs]
    said = []
    for log in logs:
        log.seek(0)
        said.append(log.read())
        log.close()
    assert sorted(codes) == [0, 2], (codes, [s[-2000:] for s in said])
    refused = said[codes.index(2)]
    assert "is being written by another score job" in refused \
        or "was claimed at the same moment by another score job" in refused, refused[-2000:]
    table = pq.read_table(tmp_path / "out", columns=["id"])
    ids = table["id"].to_pylist()
    assert sorted(ids) == list(range(600)), (len(ids), len(set(ids)))
    assert not os.path.exists(lease_folder(str(tmp_path / "out")))
