"""What the score job trusts when it reads its output back (issue 51): a ``--resume`` run
refuses an output, commit log, staging folder or quarantine another user made or could
write, and a commit record naming what the job never writes; a lease folder another user
made stops the job with a line naming that user, not as a live job's. The planted files
belong to a real second unix user (tests/other_user.py)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import spark_keras as sk
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.files import HadoopPaths
from spark_keras.jobs.score.lease import Lease, lease_folder
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.run import score
from spark_keras.jobs.score.trust import hadoop_owner
from tests import models
from tests.conftest import REPO_ROOT, run_score_job
from tests.jobs.test_score_resume import refusal
from tests.other_user import NAME, as_other_user, give_to_other_user, other_user

ROWS = 100  # per input file, one file a group
ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture(scope="module")
def made(spark, tmp_path_factory):
    """Four input files, a model, and a finished resumable output (four groups) with a
    quarantine (``q``), made by this user."""
    folder = tmp_path_factory.mktemp("score-trust")
    (folder / "in").mkdir()
    for f in range(4):
        x = np.random.default_rng(f).standard_normal((ROWS, 4)).astype("float32")
        pq.write_table(pa.table({"id": pa.array(np.arange(f * ROWS, (f + 1) * ROWS), pa.int64()),
                                 "features": pa.array(list(x), pa.list_(pa.float32()))}),
                       folder / "in" / f"part-{f}.parquet")
    sk.save(models.mlp(n_features=4, hidden=8), str(folder / "model.skp"))
    score(spark, HadoopPaths(spark), job_args(folder, folder / "out", folder / "q"))
    return folder


def job_args(folder, out, q=None):
    """A ``--resume`` run's options, one input file a group (``q``: the quarantine)."""
    size = os.path.getsize(folder / "in" / "part-0.parquet")
    quarantine = ["--on-invalid", "null", "--invalid-output", str(q)] if q else []
    return parse_args(["--model", str(folder / "model.skp"), "--input", str(folder / "in"),
                       "--output", str(out), "--features", "features", "--resume",
                       "--commit-bytes", str(size + 10), *quarantine])


def copy(made, tmp_path):
    """A copy of the made output and quarantine in ``tmp_path`` (``out``, ``q``) and the
    options to resume it (its manifest names the copy's quarantine)."""
    out, q = tmp_path / "out", tmp_path / "q"
    shutil.copytree(made / "out", out, symlinks=True)
    shutil.copytree(made / "q", q, symlinks=True)
    manifest = out / "_spark_keras" / "manifest.json"
    found = json.loads(manifest.read_text())
    found["options"]["invalid_output"] = str(q)
    write_json(manifest, found)
    return out, q, job_args(made, out, q)


def write_json(path, found: dict) -> None:
    """Rewrite a file of the commit log (Hadoop's checksum of the old one removed)."""
    path.write_text(json.dumps(found))
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


def tree(path) -> list[tuple[str, int, int]]:
    """Every file and folder under ``path``: (path, size, mtime), links not followed."""
    found = []
    for root, folders, files in os.walk(path):
        for name in folders + files:
            st = os.lstat(os.path.join(root, name))
            found.append((os.path.relpath(os.path.join(root, name), path), st.st_size,
                          st.st_mtime_ns))
    return sorted(found)


def moving(out, index: int, **changes) -> dict:
    """Group ``index`` made a ``.moving`` group (killed while renamed into place), its
    output files gone and its record changed by ``changes``: the record."""
    log = out / "_spark_keras" / "commits"
    record = json.loads((log / f"g{index:05d}.json").read_text())
    (log / f"g{index:05d}.json").unlink()
    for name in record["files"]:
        (out / name).unlink()
    record.update(changes)
    write_json(log / f"g{index:05d}.moving.json", record)
    return record


def acl(*writers: int) -> bytes:
    """A POSIX ACL as Linux keeps it in ``system.posix_acl_*`` (version 2, then entries of
    tag u16, permissions u16, id u32): the owner rwx, each user of ``writers`` rwx, the
    owning group r-x, mask rwx, others r-x (``setfacl -m u:<writer>:rwx``)."""
    anyone = 0xFFFFFFFF
    entries = [(0x01, 7, anyone), *[(0x02, 7, uid) for uid in writers], (0x04, 5, anyone),
               (0x10, 7, anyone), (0x20, 5, anyone)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


@pytest.fixture
def shared():
    """A folder of this user's that every user may enter (0755, in the sticky /tmp)."""
    folder = tempfile.mkdtemp(prefix="spark-keras-shared-", dir="/tmp")
    os.chmod(folder, 0o755)
    yield Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def team_folder(shared: Path) -> Path:
    """A team folder in ``shared`` whose default ACL lets the other user write whatever
    is made in it (``setfacl -d -m u:spark-keras-other:rwx team``)."""
    team = shared / "team"
    team.mkdir(mode=0o755)
    os.setxattr(team, "system.posix_acl_default", acl(other_user().pw_uid))
    return team


def other_user_writes(folder) -> bool:
    """Whether the other user, in a process of its own, can make a file in ``folder``."""
    try:
        as_other_user("/bin/sh", "-c", 'echo planted > "$0/planted-by-other"', str(folder))
    except subprocess.CalledProcessError:
        return False
    return True


# --- item 1: folders the job reads back --------------------------------------------------------

def _group_writable(path) -> None:
    os.chown(path, -1, other_user().pw_gid)  # a group with another user in it
    os.chmod(path, 0o775)


def _staging_of_another_user(out, q) -> str:
    """A group killed while renamed into place, one file still in its staging folder,
    that folder (and the file) the other user's."""
    log = out / "_spark_keras" / "commits"
    record = json.loads((log / "g00003.json").read_text())
    (log / "g00003.json").rename(log / "g00003.moving.json")
    staging = out / record["staging"]
    staging.mkdir(parents=True)  # in its wave's folder
    kept = record["files"][0]
    (out / kept).rename(staging / kept.split("-", 1)[1])
    give_to_other_user(staging)
    return f"staging folder '{staging}' is owned by user '{NAME}'"


UNTRUSTED = {
    "output of another user": (lambda out, q: give_to_other_user(out),
                               "output '{out}' is owned by user '" + NAME + "'"),
    "output writable by others": (lambda out, q: os.chmod(out, 0o777),
                                  "output '{out}' is writable by its group and others "
                                  "(mode 0777)"),
    "commit log of another user": (lambda out, q: give_to_other_user(out / "_spark_keras"),
                                   "commit log '{out}/_spark_keras' is owned by user '"
                                   + NAME + "'"),
    "commits folder writable by a group": (
        lambda out, q: _group_writable(out / "_spark_keras" / "commits"),
        "commit log '{out}/_spark_keras/commits' is writable by its group (mode 0775)"),
    "quarantine of another user": (lambda out, q: give_to_other_user(q),
                                   "invalid rows' output '{q}' is owned by user '" + NAME + "'"),
    # 0775, its group the user's own: taken for the user's (umask 002) while the ACL let
    # the other user write it
    "commits folder whose ACL lets another user write": (
        lambda out, q: os.setxattr(out / "_spark_keras" / "commits", "system.posix_acl_access",
                                   acl(other_user().pw_uid)),
        "commit log '{out}/_spark_keras/commits' is writable by user '" + NAME + "' through "
        "its ACL (mode 0775)"),
    # the folder holding the output: whoever may write it can swap the output once checked
    "output in another user's folder": (
        lambda out, q: os.chown(out.parent, other_user().pw_uid, other_user().pw_gid),
        "the folder '{parent}' (holding '{parent}/|is owned by user '" + NAME
        + "', who may replace what it holds"),
    "output in a folder all write, not sticky": (
        lambda out, q: os.chmod(out.parent, 0o777),
        "the folder '{parent}' (holding '{parent}/|is writable by its group and others and "
        "not sticky (mode 0777)"),
    "staging folder of another user": (_staging_of_another_user, None),
}


@pytest.mark.parametrize("case", list(UNTRUSTED))
def test_a_folder_another_user_made_or_could_write_is_refused_before_it_is_read(
        spark, made, tmp_path, case):
    """Each folder a ``--resume`` run reads back, made by the other user or writable by
    others: exit 2, one line naming the folder, its owner or mode, and the fix; nothing
    under the output changed (without the check the run resumed it, exit 0)."""
    out, q, args = copy(made, tmp_path)
    plant, said = UNTRUSTED[case]
    said = plant(out, q) or said.format(out=out, q=q, parent=tmp_path)
    before = tree(tmp_path)
    line = refusal(spark, args)
    assert all(part in line for part in said.split("|")), line  # the output's or lease's holder
    assert "nothing was read from it" in line and any(
        fix in line for fix in ("remove it", "chmod go-w", "a folder of your own")), line
    assert tree(tmp_path) == before


def test_the_jobs_own_folders_under_a_shared_folders_default_acl_are_its_own(spark, made,
                                                                            shared):
    """The audit's attack: in a team folder whose default ACL lets the other user write,
    with Hadoop's umask 002, the job's output and commit log came out 0775, their group
    the user's own (taken for the user's), while their ACL let the other user write them:
    it rewrote two committed groups and the victim's ``--resume`` exited 0 with 200 of
    400 rows its. Now the job makes its folders without that ACL, writable by no one
    else: the other user (a process of its own) cannot write them, and ``--resume``
    takes them as the user's."""
    out = team_folder(shared) / "out"
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    umask = conf.get("fs.permissions.umask-mode")
    conf.set("fs.permissions.umask-mode", "002")
    try:
        first = score(spark, HadoopPaths(spark), job_args(made, out))
        for folder in (out, out / "_spark_keras", out / "_spark_keras" / "commits"):
            assert not other_user_writes(folder), (folder, oct(os.stat(folder).st_mode))
        again = score(spark, HadoopPaths(spark), job_args(made, out))
    finally:
        conf.set("fs.permissions.umask-mode", umask) if umask else \
            conf.unset("fs.permissions.umask-mode")
    assert (first["rows"], again["rows"], again["rows_skipped"]) == (4 * ROWS, 0, 4 * ROWS)


@pytest.mark.slow  # the victim's job as a process of its own: about 40 s
def test_a_resumable_output_another_user_planted_in_a_shared_folder_is_refused(spark, made,
                                                                               tmp_path):
    """The issue's attack: in a sticky folder all write (as /tmp), the other user made
    the victim's output from public facts (the model's digest, the input files' sizes and
    times, the options), with two groups committed whose rows it chose (prediction
    999.0). The victim's documented ``--resume`` run ran to exit 0 with
    ``rows_skipped=200``; now it stops, exit 2, naming the owner, and takes nothing."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    out = shared / "scored"
    shutil.copytree(made / "out", out)
    manifest = out / "_spark_keras" / "manifest.json"
    found = json.loads(manifest.read_text())
    found["options"].update(on_invalid="error", invalid_output=None, model_version=None)
    write_json(manifest, found)
    log = out / "_spark_keras" / "commits"
    for index in (2, 3):  # two groups left for the victim to score
        record = json.loads((log / f"g{index:05d}.json").read_text())
        (log / f"g{index:05d}.json").unlink()
        for name in record["files"]:
            (out / name).unlink()
    for part in out.glob("g*.parquet"):  # the attacker's predictions
        table = pq.read_table(part)
        pq.write_table(table.set_column(table.schema.get_field_index("prediction"), "prediction",
                                        pa.array([999.0] * table.num_rows, pa.float32())), part)
    (out / "_SUCCESS").unlink()
    give_to_other_user(out)
    before = tree(out)
    size = os.path.getsize(made / "in" / "part-0.parquet")
    proc = run_score_job("--model", str(made / "model.skp"), "--input", str(made / "in"),
                         "--output", str(out), "--features", "features", "--resume",
                         "--commit-bytes", str(size + 10), "--master", "local[1]")
    said = proc.stdout + proc.stderr
    assert proc.returncode == 2, said[-3000:]
    assert f"error: output '{out}' is owned by user '{NAME}', not by '{ME}'" in proc.stderr, \
        said[-3000:]
    assert "SCORED" not in proc.stdout
    assert tree(out) == before


# --- item 1: the names a record gives, and paths kept under their folder ------------------------

def _victim(tmp_path, *files: str):
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    for name in files:
        (victim / name).write_bytes(b"precious")
    return victim


NAMES = {
    # rolled back (a file in neither place): the other name removed, the victim's folder
    "a file name climbing out": (
        lambda out, tmp: dict(files=["g00003-part-gone.parquet", "../victim"]),
        "names files '../victim', not a name this job writes for group 3"),
    # rolled forward: a planted file renamed into the victim's folder (a .pth runs at start)
    "a file renamed out": (
        lambda out, tmp: dict(files=["../victim/g00003-part-zz-evil.pth"]),
        "names files '../victim/g00003-part-zz-evil.pth', not a name this job writes"),
    # rolled forward from the victim's folder into the output
    "a staging folder outside": (
        lambda out, tmp: dict(staging="../victim", files=["g00003-part-secret.parquet"]),
        "names staging '../victim', not a name this job writes for group 3"),
    # a name the job writes, under a partition folder that is a link out of the output
    "a partition folder linking out": (
        lambda out, tmp: dict(files=["g00003-part-gone.parquet",
                                     "k=9/g00003-part-precious.parquet"]),
        "/k=9/g00003-part-precious.parquet' is not inside '{out}'"),
}


@pytest.mark.parametrize("case", list(NAMES))
def test_a_record_naming_what_the_job_never_writes_is_refused(spark, made, tmp_path, case):
    """A ``.moving`` record (of an output this user owns: copied, restored, damaged)
    naming a path out of the output: refused, exit 2, before any delete or rename;
    without the checks the rerun removed the victim's folder, renamed a planted file
    into it, or took the victim's file into the output."""
    out, _, args = copy(made, tmp_path)
    victim = _victim(tmp_path, "g00003-part-precious.parquet", "part-secret.parquet")
    (out / "victim").mkdir()  # what the renamed-out case's staging name points at
    (out / "victim" / "part-zz-evil.pth").write_bytes(b"import os")
    (out / "k=9").symlink_to(victim)
    record = moving(out, 3)
    (out / record["staging"]).mkdir(parents=True)
    changes, said = NAMES[case]
    write_json(out / "_spark_keras" / "commits" / "g00003.moving.json",
               {**record, **changes(out, tmp_path)})
    before = tree(tmp_path)
    line = refusal(spark, args)
    assert said.format(out=out) in line, line
    assert tree(tmp_path) == before
    assert sorted(os.listdir(victim)) == ["g00003-part-precious.parquet", "part-secret.parquet"]


# --- item 2: the lease ------------------------------------------------------------------------

_TAKE = """
import sys
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.lease import Lease
from spark_keras.jobs.score.arrow_paths import ArrowPaths
try:
    with Lease(ArrowPaths(), sys.argv[1]):
        print('took', flush=True)
except JobError as exc:
    print('refused', exc, flush=True)
    sys.exit(2)
"""


@pytest.mark.parametrize("planted", ["of another user", "writable by others"])
def test_a_lease_folder_another_user_planted_is_refused_naming_its_owner(tmp_path, planted):
    """The other user made the lease folder of the victim's output with a holder naming
    pid 1 (alive as long as the host): every run was refused as if a live job held the
    output. Now the refusal names the folder's owner (or mode) and the fix."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    out = str(shared / "scored")
    folder = lease_folder(out)
    os.makedirs(folder)
    with open(os.path.join(folder, f"holder-{'0' * 28}.json"), "w") as f:
        json.dump({"host": os.uname().nodename, "pid": 1, "started": "forever"}, f)
    if planted == "of another user":
        give_to_other_user(folder)
        said = f"is owned by user '{NAME}'"
    else:
        os.chmod(folder, 0o777)
        said = "is writable by its group and others (mode 0777)"
    proc = subprocess.run([sys.executable, "-c", _TAKE, out], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"the lease folder of output '{out}', '{folder}' {said}" in proc.stdout, proc.stdout
    assert "being written by another score job" not in proc.stdout


def test_a_lease_made_under_umask_002_is_the_users_own(tmp_path):
    """A umask of 002 (Ubuntu's for users with a group of their own) made the lease
    folder writable by that group; the job makes it writable by no one else, so it is
    not refused (the group is no longer taken for the user)."""
    out = str(tmp_path / "scored")
    old = os.umask(0o002)
    try:
        with Lease(ArrowPaths(), out) as lease:
            assert os.stat(lease.folder).st_mode & 0o777 == 0o755
            lease.check()
    finally:
        os.umask(old)


def test_a_lease_under_a_shared_folders_default_acl_is_written_by_no_one_else(shared):
    """The audit's attack: the lease folder the job made in a team folder whose default
    ACL lets the other user write showed 0775 with the user's own group (taken for the
    user's) while its ACL let the other user drop in a holder naming pid 1, which held
    every later run back. Now the other user (a process of its own) cannot write it."""
    out = str(team_folder(shared) / "scored")
    with Lease(ArrowPaths(), out) as lease:
        assert not other_user_writes(lease.folder), oct(os.stat(lease.folder).st_mode)
        lease.check()
    with Lease(ArrowPaths(), out):  # and the next run takes it
        pass


def test_a_holder_file_of_another_user_is_refused_naming_its_owner(tmp_path):
    """A holder file naming pid 1 (alive as long as the host) owned by the other user, in
    the user's own lease folder: refused naming its owner and the fix, not taken for a
    live job's (the refusal was "being written by another score job (pid 1 ...)")."""
    out = str(tmp_path / "scored")
    folder = lease_folder(out)
    os.makedirs(folder)
    holder = os.path.join(folder, f"holder-{'0' * 28}.json")
    with open(holder, "w") as f:
        json.dump({"host": os.uname().nodename, "pid": 1, "started": "forever"}, f)
    os.chown(holder, other_user().pw_uid, other_user().pw_gid)
    proc = subprocess.run([sys.executable, "-c", _TAKE, out], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"holds '{holder}', a holder file of user '{NAME}'" in proc.stdout, proc.stdout
    assert f"have '{NAME}' (or root) remove it" in proc.stdout, proc.stdout
    assert "being written by another score job" not in proc.stdout


# --- Hadoop's report of owners ------------------------------------------------------------------

def test_hadoop_reports_a_paths_owner_mode_and_the_running_user(spark, tmp_path):
    """What the check reads on HDFS, from Hadoop's FileSystem (here its local one)."""
    folder = tmp_path / "planted"
    folder.mkdir()
    os.chmod(folder, 0o757)
    give_to_other_user(folder)
    assert hadoop_owner(spark, f"file://{folder}") == (NAME, ME, 0o757)
    assert hadoop_owner(spark, f"file://{tmp_path}/nothing") is None
