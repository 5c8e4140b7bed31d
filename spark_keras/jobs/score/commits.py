"""The score job's resumable output (``--resume``): the input scored in groups of files,
each published as one commit, and the commit log a rerun reads to score only the rest.

Layout, checked on PySpark 4.3 (the file-index code involved is older than 3.5)::

    output/g00000-part-00000-<uuid>-c000.snappy.parquet    the rows, beside each other
    output/g00001-part-...                                 (gNNNNN-: the group's files)
    output/k=3/g00001-part-...                             (--partition-by k: in folders)
    output/_SUCCESS                                        once every group is committed
    output/_staging-g00002-<hex>/                          a group being written by Spark
    output/_spark_keras/manifest.json                      what the job is (below)
    output/_spark_keras/commits/g00000.json                one record per committed group
    output/_spark_keras/commits/g00002.moving.json         a group being published
    invalid/g00001-part-...                                --invalid-output: the group's
    invalid/_staging-g00002-<hex>/                         invalid rows, in the same commit

* Files, not a folder per group: ``spark.read.parquet(output)`` does not read the files
  of plain subfolders (``output/g00001/part-*``): with no ``key=value`` folder the data
  is unpartitioned and Spark takes the root's own files only (``UNABLE_TO_INFER_SCHEMA``
  when there are none), so one atomic folder rename per group is not open to us.
* Groups: the files Spark reads under ``--input`` (listed with the path layer under
  Spark's own rule for hidden names, and their count checked against
  ``DataFrame.inputFiles()``), sorted by path, cut into runs of at most ``--commit-bytes``
  (default 1 GiB); a larger file is a group of its own. Each group is read with the schema
  of the whole input (so CSV inference and partition columns are those of one whole read),
  scored by the same transform and written by Spark into ``_staging-...`` (names starting
  with ``_`` are invisible to Spark's and pyarrow's readers).
* A commit: the record (the group's files, output file names, rows, invalid rows) is
  written as ``gN.moving.json``; the files are renamed into the output one by one (and
  those of the quarantine, ``--invalid-output``, into its folder);
  ``gN.json`` is written; the ``.moving`` record and the staging folder go. Every small
  file is written whole (a hidden temporary file, renamed). A rerun rolls a ``.moving``
  group forward (the rest of its files from staging) or, when a file is in neither place,
  back (its output files removed, the group scored again); staging folders without a
  record are removed. So a reader sees every committed group whole and no row twice; only
  while a group's files are renamed (a few renames) or after a kill in those moments until
  the next ``--resume``, part of one group.
* A rerun reads back only folders the running user alone writes, takes from a record
  only names of the form the job writes, and removes or renames only what lies under its
  folders (:mod:`.score_trust`).
* The manifest holds the SHA-256 of the model file's bytes, the options that change what
  a row becomes or where it goes (features, output and error columns, id column, resize,
  buckets, on-invalid, version column and label, input format, output format, partition
  columns, the quarantine's folder and ``--drop-invalid``: not the batch size, a matter of
  speed, nor ``--max-invalid``, a limit), each input file's path, size and modification
  time, the commit bound and the groups. A rerun with any of them changed stops (exit 2)
  naming the first difference; ``--overwrite`` starts over.
* The same groups, options and Spark settings make the same tasks and model batches: the
  resumed output holds the same values as an uninterrupted run's. One job at a time per
  output: the run holds a lease on it (:mod:`.score_lease`); a second is refused.
* Each group is a Spark job with as many tasks as its files split into (about one per
  128 MiB): on a large cluster give ``--commit-bytes`` at least twice the cores x 128 MiB.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from spark_keras import storage
from spark_keras.jobs.score import trust
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.lease import Leases
from spark_keras.jobs.score.progress import Heartbeat, Tasks, byte_size, count, eta
from spark_keras.spark.figures import reasons_observed
from spark_keras.spark.paths import Paths, join, listed_by_spark, write_whole

__all__ = ["DEFAULT_COMMIT_BYTES", "LOG", "MANIFEST", "Plan", "plan", "plan_groups",
           "difference", "file_sha256", "run_groups", "has_commit_log", "list_input"]

logger = logging.getLogger("spark_keras.jobs.score")

LOG = "_spark_keras"  # the commit log's folder, inside the output
MANIFEST = "manifest.json"
COMMITS = "commits"
STAGING = trust.STAGING
SUCCESS = "_SUCCESS"
FORMAT = 1  # of the manifest and records
DEFAULT_COMMIT_BYTES = 2**30
_GROUP_FILE = re.compile(r"^g(\d+)-")
_RECORD = re.compile(r"^g(\d+)\.json$")
_MOVING = re.compile(r"^g(\d+)\.moving\.json$")
_TEMPORARY = re.compile(r"^\..*\.tmp-[0-9a-f]{12}$")  # write_whole's, left by a kill
# the options that change what a row becomes, as the manifest names them and as the flags
OPTIONS = {"features": "--features", "output_col": "--output-col", "format": "--format",
           "on_invalid": "--on-invalid", "error_col": "--error-col", "id_col": "--id-col",
           "resize": "--resize", "buckets": "--buckets", "version_col": "--version-col",
           "model_version": "--model-version", "output_format": "--output-format",
           "partition_by": "--partition-by", "invalid_output": "--invalid-output",
           "drop_invalid": "--drop-invalid"}
# what a manifest written before an option existed means by its absence
_BEFORE = {"output_format": "parquet", "drop_invalid": False}


def file_sha256(location: str) -> str:
    """The SHA-256 of the bytes of the file at a local path or URI, streamed."""
    digest = hashlib.sha256()

    class Sink:
        def write(self, chunk: bytes) -> None:
            digest.update(chunk)

    if storage.is_uri(location):
        storage.copy(location, Sink())  # type: ignore[arg-type]
    else:
        try:
            with open(location, "rb") as f:
                while chunk := f.read(8 * 2**20):
                    digest.update(chunk)
        except OSError as exc:
            raise JobError(f"cannot read model {location!r}: {exc.strerror or exc}") from exc
    return digest.hexdigest()


def plan_groups(sizes: Sequence[int], bound: int) -> list[list[int]]:
    """Indices of ``sizes`` cut into consecutive runs of at most ``bound`` bytes (a file
    larger than ``bound`` alone)."""
    groups: list[list[int]] = []
    total = 0
    for index, size in enumerate(sizes):
        if not groups or total + size > bound:
            groups.append([])
            total = 0
        groups[-1].append(index)
        total += size
    return groups


def list_input(paths: Paths, root: str) -> list[tuple[str, int, int]]:
    """``(path under root, size, mtime in ms)`` of every file Spark reads under ``root``
    (``""`` for a root that is a file), sorted."""
    top = paths.status(root)
    if top is None:
        raise JobError(f"input path {root!r} does not exist")
    if not top.is_dir:
        return [("", top.size, top.mtime_ms)]
    found: list[tuple[str, int, int]] = []
    folders = [("", root)]
    while folders:
        prefix, folder = folders.pop()
        for entry in paths.children(folder):
            if not listed_by_spark(entry.name):
                continue
            if entry.is_dir:
                folders.append((f"{prefix}{entry.name}/", join(folder, entry.name)))
            else:
                found.append((f"{prefix}{entry.name}", entry.size, entry.mtime_ms))
    return sorted(found)


def _when(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc) \
        .strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def difference(old: dict, new: dict, input_path: str) -> str | None:
    """What differs between the manifest of the committed groups (``old``) and this run's
    (``new``), in a phrase naming the first difference; None if they agree."""
    if old.get("format") != FORMAT:
        return f"its commit log has format {old.get('format')!r}; this job writes {FORMAT}"
    if old["model_sha256"] != new["model_sha256"]:
        return (f"the model is another one (sha256 {new['model_sha256'][:12]}...; the "
                f"committed groups were scored by {old['model_sha256'][:12]}...)")
    for key, flag in OPTIONS.items():
        before = old["options"].get(key, _BEFORE.get(key))
        now = new["options"].get(key, _BEFORE.get(key))
        if before != now:
            return f"{flag} differs ({now!r} now, {before!r} for the committed groups)"
    if old["commit_bytes"] != new["commit_bytes"]:
        return (f"--commit-bytes differs ({new['commit_bytes']} now, {old['commit_bytes']} "
                f"for the committed groups)")
    before_files = {p: (s, m) for p, s, m in old["files"]}
    now_files = {p: (s, m) for p, s, m in new["files"]}
    changed = []
    for path in sorted(before_files.keys() | now_files.keys()):
        name = join(input_path, path)
        if path not in now_files:
            changed.append(f"input file {name!r} is gone")
        elif path not in before_files:
            changed.append(f"input file {name!r} is new")
        elif before_files[path] != now_files[path]:
            (size0, time0), (size1, time1) = before_files[path], now_files[path]
            changed.append(f"input file {name!r} changed (size {size0} -> {size1} bytes, "
                           f"modified {_when(time0)} -> {_when(time1)})")
    if changed:
        more = f" (and {len(changed) - 1} more input file(s))" if len(changed) > 1 else ""
        return changed[0] + more
    return None


def _manifest_of(paths: Paths, output: str) -> dict | None:
    """The manifest of a resumable run in ``output``; None when there is nothing to
    resume (no output, or a folder holding only a commit log folder without a manifest:
    a run killed before it wrote one)."""
    top = paths.status(output)
    if top is None:
        return None
    trust.trusted(paths, output, "output")
    manifest = join(join(output, LOG), MANIFEST)
    if top.is_dir and paths.exists(manifest):
        trust.trusted(paths, join(output, LOG), "commit log")
        return _read_json(paths, manifest)
    if top.is_dir and all(entry.name == LOG for entry in paths.children(output)):
        return None
    raise JobError(f"output path {output!r} exists and holds no commit log of a resumable "
                   f"run (no {LOG}/{MANIFEST}); pass --overwrite to replace it")


def has_commit_log(paths: Paths, output: str) -> bool:
    """Whether ``output`` is a resumable run's output (finished or not)."""
    return paths.exists(join(join(output, LOG), MANIFEST))


def _read_json(paths: Paths, path: str) -> dict:
    try:
        found = json.loads(paths.read_bytes(path))
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
        return found
    except ValueError as exc:
        raise JobError(f"commit log file {path!r} is damaged ({exc}); pass --overwrite to "
                       f"start over") from exc


@dataclass
class Plan:
    """A resumable run, checked against what its output holds (see :func:`plan`).
    ``output`` is None until a table's location is known (a table made by this run)."""

    paths: Paths
    input: str
    output: str | None
    manifest: dict
    resume: bool  # the output holds a commit log of this very job
    invalid_output: str | None = None  # the quarantine's folder

    @property
    def log(self) -> str:
        assert self.output is not None  # known once the run begins
        return join(self.output, LOG)

    def roots(self) -> list[tuple[str, str]]:
        """``(record key prefix, folder)`` of each place a commit publishes files: the
        output (``files``) and the quarantine (``invalid_files``)."""
        assert self.output is not None
        found = [("", self.output)]
        if self.invalid_output is not None:
            found.append(("invalid_", self.invalid_output))
        return found

    def group_files(self, index: int) -> list[str]:
        """The input files of group ``index``, as paths the path layer takes."""
        return [join(self.input, self.manifest["files"][i][0])
                for i in self.manifest["groups"][index]]

    def group_bytes(self, index: int) -> int:
        return sum(self.manifest["files"][i][1] for i in self.manifest["groups"][index])


def plan(paths: Paths, input_path: str, output: str | None, *, model_sha256: str,
         options: dict, commit_bytes: int | None, overwrite: bool, spark_files: int,
         invalid_output: str | None = None) -> Plan:
    """The groups of this run, or a :class:`JobError` (exit 2) saying why the output
    cannot be resumed: another model, other options or input files, or an output that is
    not a resumable run's (unless ``overwrite``). Nothing is written.

    Args:
        output: the output folder; None for a table this run makes (nothing to resume).
        options: the values of :data:`OPTIONS`' keys.
        commit_bytes: the bound of a group; None: the committed groups' (else the default).
        spark_files: how many files Spark reads under ``input_path``
            (``len(df.inputFiles())``), checked against the path layer's listing.
        invalid_output: the quarantine's folder (``--invalid-output``), if any.
    """
    files = list_input(paths, input_path)
    if len(files) != spark_files:
        raise JobError(f"Spark reads {spark_files} file(s) under {input_path!r} but the job "
                       f"lists {len(files)}: it cannot cut this input into commits")
    old = None if overwrite or output is None else _manifest_of(paths, output)
    if old is None and not overwrite and invalid_output is not None \
            and paths.exists(invalid_output):
        raise JobError(f"invalid rows' output path {invalid_output!r} exists; pass "
                       f"--overwrite to replace it")
    bound = commit_bytes or (old["commit_bytes"] if old else DEFAULT_COMMIT_BYTES)
    manifest = {"format": FORMAT, "model_sha256": model_sha256,
                "options": json.loads(json.dumps(options)),  # tuples as JSON keeps them
                "commit_bytes": bound, "files": [list(f) for f in files],
                "groups": plan_groups([size for _, size, _ in files], bound)}
    if old is not None:
        what = difference(old, manifest, input_path)
        if what:
            raise JobError(f"cannot resume {output!r}: {what}; pass --overwrite to start over")
    return Plan(paths, input_path, output, manifest, resume=old is not None,
                invalid_output=invalid_output)


# --- the commit log ----------------------------------------------------------------------------

def _begin(plan: Plan) -> dict[int, dict]:
    """Make the output ready: a fresh one (an old output removed: ``--overwrite``) gets
    the manifest; a resumed one is recovered (:func:`_recover`). The records of the
    groups committed so far, by index."""
    paths = plan.paths
    if not plan.resume:
        for _, root in plan.roots():
            if paths.exists(root):
                paths.delete(root)
        write_whole(paths, join(plan.log, MANIFEST),
                    json.dumps({**plan.manifest, "created": _when(int(time.time() * 1000))}))
        _trusted(plan)  # made by this run, not by another user in the meantime
        return {}
    return _recover(plan)


def _trusted(plan: Plan) -> None:
    """The output and quarantine made if missing; an output, commit log or quarantine the
    running user does not alone write refused (:func:`~.score_trust.trusted`)."""
    for key, root in plan.roots():
        if not plan.paths.exists(root):
            plan.paths.make_folder(root)
        trust.trusted(plan.paths, root, "invalid rows' output" if key else "output")
    trust.trusted(plan.paths, plan.log, "commit log")
    trust.trusted(plan.paths, join(plan.log, COMMITS), "commit log")


def _recover(plan: Plan) -> dict[int, dict]:
    """Finish what a killed run left: ``.moving`` groups rolled forward (or back, see the
    module docstring), staging folders and temporary files removed, the files of groups
    without a record removed; refuse files nobody committed and committed files gone."""
    paths = plan.paths
    _trusted(plan)
    commits = join(plan.log, COMMITS)
    records: dict[int, dict] = {}
    moving: dict[int, dict] = {}
    for entry in paths.children(commits) if paths.exists(commits) else []:
        path = join(commits, entry.name)
        if (found := _RECORD.match(entry.name) or _MOVING.match(entry.name)) is not None:
            record = _read_json(paths, path)
            trust.check_record(record, int(found[1]), path)
            (records if found.re is _RECORD else moving)[int(found[1])] = record
        elif _TEMPORARY.match(entry.name):
            trust.remove(paths, commits, entry.name)
    for index, record in sorted(moving.items()):
        if index not in records and _roll_forward(plan, record):
            write_whole(paths, join(commits, f"g{index:05d}.json"), json.dumps(record))
            records[index] = record
        paths.delete(join(commits, f"g{index:05d}.moving.json"))
    for key, root in plan.roots():
        known = {name for record in records.values() for name in record.get(f"{key}files", [])}
        for entry in paths.children(root):
            if entry.name.startswith(STAGING):
                trust.remove(paths, root, entry.name)
        held = {name for name, _, _ in list_input(paths, root)}
        for name in sorted(held - known):
            found = _GROUP_FILE.match(name.rpartition("/")[2])
            if found is None or int(found[1]) in records:
                raise JobError(f"output {root!r} holds {name!r}, which its commit log "
                               f"does not know; pass --overwrite to start over")
            trust.remove(paths, root, name)  # a group that was never committed
        missing = sorted(known - held)
        if missing:
            raise JobError(f"output {root!r} lacks {missing[0]!r} of a committed group; "
                           f"pass --overwrite to start over")
    return records


def _roll_forward(plan: Plan, record: dict) -> bool:
    """Move the rest of a ``.moving`` group's files from its staging folders; if one is in
    neither place, remove those already moved (the group is scored again). Whether the
    group is whole in its outputs."""
    paths = plan.paths
    moves = []
    for key, root in plan.roots():
        staging = join(root, record.get(f"{key}staging", ""))
        trust.trusted(paths, staging, "staging folder")
        for name in record.get(f"{key}files", []):
            target = join(root, name)
            if not paths.exists(target):
                moves.append((root, join(staging, trust.staged(name)), target))
    if any(not paths.exists(source) for _, source, _ in moves):
        for key, root in plan.roots():
            for name in record.get(f"{key}files", []):
                trust.remove(paths, root, name)
        return False
    for root, source, target in moves:
        trust.move_into(paths, root, source, target)
    return True


def _commit(plan: Plan, index: int, staging: dict[str, str], record: dict) -> dict:
    """Publish the group Spark wrote into the ``staging`` folders (by record key prefix,
    see :meth:`Plan.roots`; see the module docstring)."""
    paths = plan.paths
    moves = []
    record = dict(record)
    for key, root in plan.roots():
        folder = staging[key]
        staged = [name for name, _, _ in list_input(paths, folder)]
        record[f"{key}staging"] = folder.rstrip("/").rpartition("/")[2]
        record[f"{key}files"] = [trust.published(index, name) for name in staged]
        moves += [(root, join(folder, name), join(root, trust.published(index, name)))
                  for name in staged]
    commits = join(plan.log, COMMITS)
    moving = join(commits, f"g{index:05d}.moving.json")
    trust.check_record(record, index, moving)  # what a rerun takes: the names it writes
    write_whole(paths, moving, json.dumps(record))
    for root, source, target in moves:
        trust.move_into(paths, root, source, target)
    write_whole(paths, join(commits, f"g{index:05d}.json"), json.dumps(record))
    paths.delete(moving)
    for folder in staging.values():
        paths.delete(folder)
    return record


# --- running ---------------------------------------------------------------------------------

class Progress:
    """This run's figures, summed over the groups it committed, and the line and summary
    an operator reads after each commit."""

    def __init__(self, plan: Plan, committed: dict[int, dict]) -> None:
        self._plan = plan
        self.total = len(plan.manifest["groups"])
        self.skipped = len(committed)
        self.rows_skipped = sum(int(r["rows"]) for r in committed.values())
        self._left = sum(plan.group_bytes(i) for i in range(self.total) if i not in committed)
        self._done_bytes = 0
        self.groups = self.rows = self.invalid_rows = self.builds = 0
        self.build_seconds = 0.0
        self.by_reason: dict[str, int] = {}
        self._started = time.perf_counter()

    def started(self) -> str:
        left = f"{self.total - self.skipped} group(s), {byte_size(self._left)} of input"
        if self.skipped:
            return (f"resuming {self._plan.output!r}: {self.skipped} of {self.total} groups "
                    f"({count(self.rows_skipped)} rows) committed before; scoring {left}")
        return f"scoring {left} into {self._plan.output!r}"

    def add(self, index: int, record: dict) -> None:
        self.groups += 1
        self.rows += int(record["rows"])
        self.invalid_rows += int(record["invalid_rows"])
        self.builds += int(record["model_builds"])
        self.build_seconds += float(record["build_seconds"])
        for reason, rows in record.get("invalid_by_reason", {}).items():
            self.by_reason[reason] = self.by_reason.get(reason, 0) + int(rows)
        self._done_bytes += self._plan.group_bytes(index)

    def eta(self) -> float | None:
        seconds = time.perf_counter() - self._started
        left = self._left - self._done_bytes
        if not left:
            return 0.0
        return left * seconds / self._done_bytes if self._done_bytes else None

    def line(self, group: int | None = None, tasks: Tasks = None) -> str:
        """After a commit; or while ``group`` is scored, with its running ``tasks`` (the
        ETA counts the part of its bytes their share done)."""
        seconds = time.perf_counter() - self._started
        done: float = self._done_bytes
        if group is not None and tasks is not None and tasks[1]:
            done += self._plan.group_bytes(group) * tasks[0] / tasks[1]
        text = (f"committed {self.skipped + self.groups} of {self.total} groups, "
                f"{count(self.rows_skipped + self.rows)} rows "
                f"({count(self.invalid_rows)} invalid), "
                f"{count(self.rows / max(seconds, 1e-9))} rows/s, "
                f"ETA {eta(seconds, done, self._left)}")
        if group is not None:
            text += f"; group {group + 1}: " + \
                ("no Spark stage running" if tasks is None else f"{tasks[0]} of {tasks[1]} tasks")
        return text

    def summary(self) -> dict:
        """The job's figures (those of a run without ``--resume``, for this run's rows)
        and the commit figures: ``rows_skipped``, ``groups`` (committed by this run),
        ``groups_skipped``, ``groups_total``, ``eta_seconds`` and ``done``."""
        seconds = time.perf_counter() - self._started
        eta = self.eta()
        return {"rows": self.rows, "invalid_rows": self.invalid_rows,
                "invalid_by_reason": dict(sorted(self.by_reason.items())),
                "seconds": round(seconds, 3),
                "rows_per_second": round(self.rows / seconds, 1) if seconds else None,
                "model_builds": self.builds, "build_seconds": round(self.build_seconds, 3),
                "rows_skipped": self.rows_skipped, "groups": self.groups,
                "groups_skipped": self.skipped, "groups_total": self.total,
                "eta_seconds": None if eta is None else round(eta, 1),
                "done": self.skipped + self.groups == self.total}


def run_groups(plan: Plan, leases: Leases, read: Callable[[list[str]], Any],
               score: Callable[[Any], tuple[Any, Any]],
               write: Callable[[Any, str, str | None], None], qualify: Callable[[str], str],
               on_commit: Callable[[dict], None], heartbeat: Heartbeat,
               published: Callable[[], None] = lambda: None) -> dict:
    """Score and commit every group not committed yet, while this job holds the
    ``leases`` of its output and quarantine (checked before each commit); the summary
    (:meth:`Progress.summary`).

    Args:
        read: the DataFrame of some input files (paths the path layer takes).
        score: ``(scored DataFrame, its Observation)`` of a DataFrame.
        write: writes a scored DataFrame into a staging folder of the output and one of
            the quarantine (None without one), as Spark must be given them.
        qualify: a path as Spark must be given it.
        on_commit: called with the summary after each commit.
        heartbeat: logs :meth:`Progress.line` while a group is scored.
        published: called once the files readers see have changed (after the recovery
            and each commit): a table's listing refreshed.
    """
    assert plan.output is not None  # known once the run begins
    committed = _begin(plan)
    published()
    progress = Progress(plan, committed)
    logger.info(progress.started())
    for index in range(progress.total):
        if index in committed:
            continue
        tag = f"{STAGING}g{index:05d}-{uuid.uuid4().hex[:12]}"
        staging = {key: join(root, tag) for key, root in plan.roots()}
        started = time.perf_counter()
        try:
            with heartbeat.beating(functools.partial(progress.line, index)):
                scored, observation = score(read(plan.group_files(index)))
                invalid = staging.get("invalid_")
                write(scored, qualify(staging[""]), None if invalid is None else qualify(invalid))
        except BaseException:
            for folder in staging.values():
                try:
                    plan.paths.delete(folder)
                except Exception as exc:  # must not hide why the group failed
                    logger.warning("cannot remove the staging folder %s: %s", folder, exc)
            raise
        figures = observation.get
        record = {"format": FORMAT, "group": index,
                  "input_files": [plan.manifest["files"][i][0]
                                  for i in plan.manifest["groups"][index]],
                  "rows": int(figures["rows"]), "invalid_rows": int(figures["invalid_rows"]),
                  "invalid_by_reason": reasons_observed(figures["invalid_by_reason"]),
                  "model_builds": int(figures["model_builds"]),
                  "build_seconds": round(float(figures["build_seconds"]), 3),
                  "seconds": round(time.perf_counter() - started, 3),
                  "committed": _when(int(time.time() * 1000))}
        leases.check()
        progress.add(index, _commit(plan, index, staging, record))
        published()
        logger.info(progress.line())
        on_commit(progress.summary())
    leases.check()
    for _, root in plan.roots():
        if not plan.paths.exists(join(root, SUCCESS)):
            plan.paths.create(join(root, SUCCESS), b"")
    return progress.summary()
