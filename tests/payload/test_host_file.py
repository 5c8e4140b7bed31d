"""Payload files on disks that fail: a full or read-only host folder (the model is built
from the payload in memory instead, once warned, and cache_info says why), no partial
file left by any writer (host_file.land, sk.save, storage.write), discard against a live
writer, and two processes loading one damaged file."""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing as mp
import os
import resource
import signal
import subprocess
import threading

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras import storage
from spark_keras.payload import host_file
from spark_keras.payload.shipment import Shipment
from spark_keras.payload.stored import open_model
from tests import models

pytestmark = pytest.mark.timeout(300)

SMALL = 16 * 1024  # bytes a "full" folder still takes: less than any payload here


@contextlib.contextmanager
def failing_folder(folder, how: str):
    """``folder`` on a disk that fails: ``"full"`` (ENOSPC past SMALL bytes) or
    ``"read-only"``. As root, a real tmpfs is mounted there; otherwise a full disk is a
    file size limit on this process (EFBIG) and a read-only folder is mode 0555 (EACCES)."""
    folder = str(folder)
    os.makedirs(folder, exist_ok=True)
    # mode 0700: the mount is the payload folder, which must be this user's alone
    options = f"size={SMALL},mode=0700" if how == "full" else "ro,size=64k,mode=0700"
    if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", folder],
                                            capture_output=True).returncode == 0:
        try:
            yield "tmpfs"
        finally:
            subprocess.run(["umount", "-l", folder], check=True)
        return
    if how == "read-only":
        os.chmod(folder, 0o555)
        try:
            yield "mode"
        finally:
            os.chmod(folder, 0o755)
        return
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (SMALL, limits[1]))
    try:
        yield "rlimit"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


def _bytes(n: int = 64 * 1024) -> bytes:
    return np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()


# --- host_file.land on a failing disk -------------------------------------------------------

@pytest.mark.parametrize("how", ["full", "read-only"])
def test_land_names_the_folder_and_leaves_no_partial_file(tmp_path, how):
    folder = tmp_path / "disk"
    payload = _bytes()
    with failing_folder(folder, how):
        with pytest.raises(sk.StorageError, match=f"in the folder '{folder}'") as info:
            host_file.land(str(folder), "m", len(payload), lambda: payload)
        assert isinstance(info.value, sk.StorageError)  # one of the project's errors
        assert not [n for n in os.listdir(folder) if ".tmp-" in n or n == "m.skp"]
    path = host_file.land(str(folder), "m", len(payload), lambda: payload)  # writable again
    assert open(path, "rb").read() == payload


def test_a_write_that_fails_half_way_leaves_no_temporary_file(tmp_path):
    """The file object itself fails mid-way (what a full disk does), through write=."""
    payload = _bytes()
    folder = str(tmp_path / "f")

    def write(out):
        out.write(payload[:1000])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(sk.StorageError, match="No space left on device"):
        host_file.land(folder, "m", len(payload), write=write)
    assert os.listdir(folder) == ["m.skp.lock"]


def test_a_stored_model_that_cannot_be_written_here_names_the_local_folder(tmp_path):
    """Reading the URI succeeded; writing the executor's folder failed: the error is
    about the folder, not "cannot read model file"."""
    sk.save(models.mlp(64, 256, 2), tmp_path / "m.skp")
    _, payload, stored = open_model(f"file://{tmp_path}/m.skp")
    folder = tmp_path / "disk"
    with failing_folder(folder, "full"):
        with pytest.raises(sk.StorageError) as info:
            host_file.land(str(folder), "k", stored.nbytes, write=stored.write_payload)
    assert f"in the folder '{folder}'" in str(info.value), info.value
    assert "cannot read" not in str(info.value)
    assert stored.read_payload() == payload  # the in-memory way a worker falls back to


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_build_shared_falls_back_to_a_private_build_warned_once(tmp_path, caplog, how):
    model = models.mlp(64, 256, 2)
    shipment = Shipment.of(model)
    folder = tmp_path / "disk"
    x = np.random.default_rng(1).standard_normal((5, 64)).astype("float32")
    with failing_folder(folder, how), caplog.at_level(logging.WARNING, logger="spark_keras"):
        for _ in range(2):  # built twice (an evicted model): warned once
            built, nbytes, memory = shipment.build_shared(str(folder), f"fb-{how}", len(shipment.payload))
            np.testing.assert_array_equal(np.asarray(built(x)), np.asarray(model(x)))
            assert nbytes == len(shipment.payload)
            assert not memory["shared"] and memory["private_bytes"] > 0, memory
            assert f"in the folder '{folder}'" in memory["shared_fallback"], memory
        assert not [n for n in os.listdir(folder) if ".tmp-" in n or n.endswith(".skp")]
        warnings = [r for r in caplog.records if f"fb-{how}" in r.getMessage()]
        assert len(warnings) == 1 and "not shared" in warnings[0].getMessage(), warnings

        if how == "read-only":  # a process holding no payload has nothing to fall back on
            with pytest.raises(sk.StorageError, match=f"in the folder '{folder}'"):
                shipment.without_payload().build_shared(str(folder), "other", len(shipment.payload))


# --- sk.save and storage.write ----------------------------------------------------------------

def _leftovers(folder) -> list[str]:
    return [n for n in os.listdir(folder) if ".tmp-" in n]


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_save_and_write_fail_with_storage_errors_and_leave_nothing(tmp_path, how):
    model = models.mlp(64, 256, 2)
    folder = tmp_path / "disk"
    with failing_folder(folder, how):
        with pytest.raises(sk.StorageError, match=f"cannot write '{folder}/m.skp'"):
            sk.save(model, folder / "m.skp")
        assert os.listdir(folder) == []
        with pytest.raises(sk.StorageError, match=f"cannot write '{folder}/w.skp'"):
            storage.write(str(folder / "w.skp"), sk.dumps(model))
        assert os.listdir(folder) == []
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(sk.StorageError, match="cannot write '.*/file/m.skp'"):
        sk.save(model, tmp_path / "file" / "m.skp")
    with pytest.raises(sk.StorageError, match="cannot write '.*/file/m.skp'"):
        storage.write(str(tmp_path / "file" / "m.skp"), b"x")
    sk.save(model, folder / "m.skp")  # a sound folder: a whole file, nothing else
    assert os.listdir(folder) == ["m.skp"] and not _leftovers(tmp_path)


# --- discard against a live writer ------------------------------------------------------------

def _slow_writer(folder, payload, started, go, results) -> None:
    def write(out):
        out.write(payload[:100])
        started.set()  # holding the lock, half-way through its temporary file
        go.wait(60)
        out.write(payload[100:])

    try:
        path = host_file.land(folder, "m", len(payload), write=write)
        results.put(("landed", path))  # (the discard waiting may remove it at once)
    except BaseException as exc:  # noqa: BLE001  (reported to the test)
        results.put(("failed", repr(exc)))


def test_discard_waits_for_a_live_writer(tmp_path):
    payload = _bytes()
    folder = str(tmp_path / "f")
    ctx = mp.get_context("spawn")
    started, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    writer = ctx.Process(target=_slow_writer, args=(folder, payload, started, go, results))
    writer.start()
    try:
        assert started.wait(120)
        discarding = threading.Thread(target=host_file.discard, args=(folder, "m"))
        discarding.start()
        discarding.join(1.0)
        assert discarding.is_alive()  # waits for the writer's lock
        names = sorted(os.listdir(folder))
        assert names[0] == "m.skp.lock" and names[1].startswith("m.skp.tmp-"), names
    finally:
        go.set()
    assert results.get(timeout=60) == ("landed", host_file.path_for(folder, "m"))  # renamed
    writer.join(30)
    discarding.join(30)
    assert not discarding.is_alive()
    assert os.listdir(folder) == []  # then discard removed it, lock file included
    path = host_file.land(folder, "m", len(payload), lambda: payload)  # and it lands again
    assert open(path, "rb").read() == payload


def _open_count(path: str) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found += os.readlink(f"/proc/self/fd/{fd}") == path
    return found


def test_a_waiter_on_a_removed_lock_file_takes_the_new_one(tmp_path):
    """A process granted the lock on a lock file discard removed meanwhile lets it go
    and takes the new one: it never writes beside a process holding the new file."""
    import fcntl
    import time

    lock = str(tmp_path / "m.skp.lock")
    holding, release = threading.Event(), threading.Event()

    def waiter():  # a separate open file: flock excludes it as it would another process
        with host_file._locked(lock):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=waiter)
    with host_file._locked(lock):  # as discard holds it
        thread.start()
        deadline = time.monotonic() + 30
        while _open_count(lock) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the waiter has opened this lock file
        assert _open_count(lock) == 2 and not holding.is_set()
        os.remove(lock)  # what discard does before it lets go
    try:
        assert holding.wait(30)
        fd = os.open(lock, os.O_RDWR)  # the lock file a newcomer finds: the waiter holds it
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        release.set()
        thread.join(30)


# --- two processes loading one damaged file -----------------------------------------------------

class RepairedMeanwhile(keras.layers.Layer):
    """Runs ``during_load`` (once) while the loader rebuilds the model: what another
    process does at that moment."""

    during_load = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        hook, type(self).during_load = type(self).during_load, None
        if hook is not None:
            hook()

    def call(self, x):
        return x


def _repair(folder: str, nbytes: int, payload_file: str, damaged, results) -> None:
    """Another process: it found the file damaged and rewrites it."""
    payload = open(payload_file, "rb").read()
    path = host_file.land(folder, "m", nbytes, lambda: payload, damaged=tuple(damaged))
    results.put(host_file.identity(path))


def test_a_file_repaired_by_another_process_while_loading_is_used(tmp_path):
    model = keras.Sequential([keras.Input((4,)), RepairedMeanwhile(), keras.layers.Dense(3)])
    shipment = Shipment.of(model)
    folder = str(tmp_path / "f")
    path = host_file.land(folder, "m", len(shipment.payload), lambda: shipment.payload)
    with open(path, "r+b") as f:  # damaged in place (same inode), in the last tensor
        f.seek(-8, os.SEEK_END)
        last = f.read(1)
        f.seek(-8, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    damaged = host_file.identity(path)
    (tmp_path / "payload").write_bytes(shipment.payload)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()

    def another_process_repairs_it():
        proc = ctx.Process(target=_repair, args=(folder, len(shipment.payload),
                                                 str(tmp_path / "payload"), damaged, results))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0

    RepairedMeanwhile.during_load = another_process_repairs_it
    try:
        built, _, memory = shipment.build_shared(folder, "m", len(shipment.payload))
    finally:
        RepairedMeanwhile.during_load = None
    repaired = results.get(timeout=10)
    assert repaired != damaged
    assert host_file.identity(path) == repaired  # used as it is, not rewritten again
    x = np.ones((2, 4), "float32")
    np.testing.assert_array_equal(np.asarray(built(x)), np.asarray(model(x)))
    assert memory["shared"]


# --- through real Spark ---------------------------------------------------------------------------
# --- what dead processes leave: reclaim ------------------------------------------------------

_USER = """
import sys, time
from spark_keras.payload import host_file
folder, owner = sys.argv[1], int(sys.argv[2])
host_file.join(folder, "m", owner=owner)  # held until this process dies
host_file.land(folder, "m", 7, lambda: b"payload")
print("ready", flush=True)
time.sleep(600)
"""


def _user(folder: str, owner: subprocess.Popen) -> subprocess.Popen:
    """A process using ``folder``'s file of model "m", on behalf of ``owner``."""
    import sys

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proc = subprocess.Popen([sys.executable, "-c", _USER, folder, str(owner.pid)], env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_reclaim_removes_what_dead_owners_left_and_nothing_in_use(tmp_path):
    """Two executors (a, c: plain processes), each with a worker that joined and landed
    model "m" in its own folder: reclaim leaves a folder alone while its owner lives
    (even with no user left) or while a live process uses its file, and removes the file,
    the users and lock files and the folder once both are gone."""
    a, c = (str(tmp_path / name / host_file.FOLDER_NAME) for name in ("blockmgr-a", "blockmgr-c"))
    owners = {name: subprocess.Popen(["sleep", "600"]) for name in "ac"}
    users = {"a": _user(a, owners["a"]), "c": _user(c, owners["c"])}
    try:
        assert host_file.reclaim([a, c], "m") == []
        owners["a"].kill()
        owners["a"].wait()
        assert host_file.reclaim([a, c], "m") == []  # a's worker still uses its file
        users["c"].kill()
        users["c"].wait()
        assert host_file.reclaim([a, c], "m") == []  # c's executor lives on
        users["a"].kill()
        users["a"].wait()
        assert host_file.reclaim([a, c], "m") == [host_file.path_for(a, "m")]
        assert not os.path.exists(a)  # the emptied folder too
        assert sorted(os.listdir(c)) == ["m.skp", "m.skp.lock", "m.skp.users"]
        assert host_file.reclaim([a, c], "m") == []
        fd = host_file.join(a, "m", owner=os.getpid())  # the folder can be used again
        assert host_file.land(a, "m", 3, lambda: b"new") == host_file.path_for(a, "m")
        assert host_file.leave(fd, a, "m") and os.listdir(a) == []  # the last user removes it
    finally:
        for proc in [*owners.values(), *users.values()]:
            proc.kill()
            proc.wait()



@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_a_full_executor_folder_scores_from_memory(spark, tmp_path):
    """spark.local.dir's payload folder is full (or read-only): BroadcastModel still
    scores, from the broadcast payload (or the URI read into memory), and each worker's
    cache_info says why its weights are not shared."""
    from spark_keras.executor.transport.executor_file import executor_folder
    from tests.conftest import worker_cache_infos

    model = models.mlp(64, 256, 2)
    sk.save(model, tmp_path / "m.skp")
    x = np.random.default_rng(3).standard_normal((32, 64)).astype("float32")
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(32)],
                               "id long, f array<float>").repartition(4)
    want = np.asarray(model(x))
    folder = spark.sparkContext.parallelize([0], 1).map(lambda _: executor_folder()).collect()[0]
    assert folder
    how = "full" if os.geteuid() == 0 else "read-only"  # a worker process has no rlimit of ours
    with failing_folder(folder, how):
        for where in (model, f"file://{tmp_path}/m.skp"):
            bm = sk.BroadcastModel(spark, where)
            got = bm.transform(df, "f").orderBy("id").toPandas()["prediction"]
            np.testing.assert_allclose(np.stack(got.to_numpy()), want, atol=1e-6)
            memory = [i["memory_by_key"][bm.key] for i in worker_cache_infos(spark).values()
                      if bm.key in i["memory_by_key"]]
            assert memory, "no worker holds the model"
            for m in memory:
                assert not m["shared"] and f"in the folder '{folder}'" in m["shared_fallback"], m
            bm.destroy()
        assert not [n for n in os.listdir(folder) if ".tmp-" in n or n.endswith(".skp")]


# --- the folder holding a payload folder (Dask's scratch folder) -------------------------

def test_a_holder_that_is_another_users_link_is_refused_and_nothing_is_made(tmp_path):
    """The audit's Dask attack: in a sticky folder all write (Dask's temporary-directory),
    the other user made ``dask-scratch-space`` a symbolic link to another sticky folder of
    root's; the holder was judged through the link (``os.stat``) and taken, and the link's
    owner, re-pointing it, had 61 of 400 builds load its model. Now the link is judged
    itself: another user's is refused, naming it, before anything is made behind it; the
    user's own link to a folder that passes is taken."""
    from spark_keras.errors import LocalWriteError
    from spark_keras.private_folder import private_folder
    from tests.other_user import NAME, other_user

    shared, target = tmp_path / "tmp", tmp_path / "vartmp"
    for folder in (shared, target):
        folder.mkdir()
        os.chmod(folder, 0o1777)
    link = shared / "dask-scratch-space"
    link.symlink_to(target)
    os.chown(link, other_user().pw_uid, other_user().pw_gid, follow_symlinks=False)
    with pytest.raises(LocalWriteError, match=f"the folder '{link}' is a symbolic link owned "
                                              f"by user '{NAME}', who may point it elsewhere"):
        private_folder(str(link / host_file.FOLDER_NAME), holder=True)
    assert os.listdir(target) == []
    os.chown(link, os.geteuid(), os.getegid(), follow_symlinks=False)  # the user's own link
    private_folder(str(link / host_file.FOLDER_NAME), holder=True)
    assert os.listdir(target) == [host_file.FOLDER_NAME]


def test_a_holder_of_another_user_is_refused_before_anything_is_made_in_it(tmp_path):
    """A payload folder asked for in another user's folder: refused, naming the holder,
    with nothing made in it (the folder used to be made first, then refused)."""
    from spark_keras.errors import LocalWriteError
    from spark_keras.private_folder import private_folder
    from tests.other_user import NAME, other_user

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user().pw_uid, other_user().pw_gid)
    with pytest.raises(LocalWriteError, match=f"the folder '{theirs}' \\(holding .*\\) is owned "
                                              f"by user '{NAME}', who may replace what it holds"):
        private_folder(str(theirs / host_file.FOLDER_NAME), holder=True)
    assert os.listdir(theirs) == []


def test_a_file_replaced_between_its_check_and_its_mapping_is_refused(tmp_path):
    """The digest check and the mapping see one file: a payload file swapped for another
    model's (same size, loads) after it passed ``verify`` and before it is mapped is
    refused with the digest's refusal, never built from."""
    from spark_keras.payload.digest import check_file, file_digest

    first, second = models.mlp(name="first"), models.mlp(name="first")
    second.set_weights([w + 1.0 for w in first.get_weights()])
    payload, other = sk.dumps(first), sk.dumps(second)
    assert len(payload) == len(other) and payload != other
    folder, key = str(tmp_path / "payloads"), "m"
    path = host_file.land(folder, key, len(payload), lambda: payload)
    expected = file_digest(path)
    swapped = []

    def verify(found: str) -> None:  # the check passes; then another process swaps the file
        check_file(found, expected, "model m")
        if not swapped:
            swapped.append(found)
            with open(f"{found}.swap", "wb") as f:
                f.write(other)
            os.replace(f"{found}.swap", found)

    host_file._verified.clear()  # a fresh process: the file found written is checked
    with pytest.raises(sk.PayloadError, match="replaced or altered"):
        Shipment.of(first, payload=payload).build_shared(folder, key, len(payload),
                                                         lambda: payload,
                                                         verify=verify)
    assert swapped
