"""The score job's resumable output (``--resume``): the input scored in groups of files,
each published as one commit, and the commit log a rerun reads to score only the rest.

Layout, checked on PySpark 4.3 (the file-index code involved is older than 3.5)::

    output/g00000-part-00000-<uuid>-c000.snappy.parquet    the rows, beside each other
    output/g00001-part-...                                 (gNNNNN-: the group's files)
    output/k=3/g00001-part-...                             (--partition-by k: in folders)
    output/_SUCCESS                                        once every group is committed
    output/_staging-w00002-<hex>/                          a wave of groups written by Spark
    output/_staging-w00002-<hex>/__spark_keras_group=5/    (one Spark job): group 5's files
    output/_spark_keras/manifest.json                      what the job is
    output/_spark_keras/commits/g00000.json                one record per committed group
    output/_spark_keras/commits/g00002.moving.json         a group being published
    invalid/g00001-part-...                                --invalid-output: the group's
    invalid/_staging-g00002-<hex>/                         invalid rows, in the same commit

* Files, not a folder per group: ``spark.read.parquet(output)`` does not read the files
  of plain subfolders (``output/g00001/part-*``): with no ``key=value`` folder the data
  is unpartitioned and Spark takes the root's own files only (``UNABLE_TO_INFER_SCHEMA``
  when there are none), so one atomic folder rename per group is not open to us.
* Groups (:mod:`spark_keras.jobs.score.manifest`): runs of the input's files, each
  scored by Spark into ``_staging-...`` (names starting with ``_`` are invisible to
  Spark's and pyarrow's readers): several groups by one Spark job, a wave
  (:mod:`spark_keras.jobs.score.inflight`), each group's files in a folder of its own
  (``partitionBy`` on a hidden column holding the group's index).
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
  folders (:mod:`spark_keras.jobs.score.trust`).
* What the job is (the model, options, input files, groups) is the manifest
  (:mod:`spark_keras.jobs.score.manifest`); a rerun of another job stops. One job at a
  time per output: the run holds a lease on it (:mod:`spark_keras.jobs.score.lease`); a
  second is refused.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Callable

from spark_keras.jobs.score import trust
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import join, write_whole
from spark_keras.jobs.score.manifest import MANIFEST, Plan, list_input, read_log_file, utc_time

__all__ = ["begin", "commit", "SUCCESS"]

logger = logging.getLogger("spark_keras.jobs.score")

COMMITS = "commits"
STAGING = trust.STAGING
SUCCESS = "_SUCCESS"
_GROUP_FILE = re.compile(r"^g(\d+)-")
_RECORD = re.compile(r"^g(\d+)\.json$")
_MOVING = re.compile(r"^g(\d+)\.moving\.json$")
_TEMPORARY = re.compile(r"^\..*\.tmp-[0-9a-f]{12}$")  # write_whole's, left by a kill


def begin(plan: Plan) -> dict[int, dict]:
    """Make the output ready: a fresh one (an old output removed: ``--overwrite``) gets
    the manifest; a resumed one is recovered (:func:`_recover`). The records of the
    groups committed so far, by index."""
    paths = plan.paths
    if not plan.resume:
        for _, root in plan.roots():
            if paths.exists(root):
                paths.delete(root)
        trust.make_folder(paths, join(plan.log, COMMITS))  # writable by no one else
        write_whole(paths, join(plan.log, MANIFEST),
                    json.dumps({**plan.manifest, "created": utc_time(int(time.time() * 1000))}))
        _trusted(plan)  # made by this run, not by another user in the meantime
        return {}
    return _recover(plan)


def _trusted(plan: Plan) -> None:
    """The output and quarantine made if missing; an output, commit log or quarantine the
    running user does not alone write refused (:func:`~spark_keras.jobs.score.trust.trusted`)."""
    for key, root in plan.roots():
        if not plan.paths.exists(root):
            trust.make_folder(plan.paths, root)
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
            record = read_log_file(paths, path)
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


def commit(plan: Plan, index: int, staging: dict[str, str], record: dict,
           held: Callable[[], None]) -> dict:
    """Publish the group Spark wrote into the ``staging`` folders (by record key prefix,
    see :meth:`Plan.roots`; see the module docstring); the record written. ``held``
    raises unless this job still holds its output: called before the record and before
    each rename, so a driver that lost its lease while inside a commit (paused past the
    takeover) renames nothing more."""
    paths = plan.paths
    moves = []
    record = dict(record)
    for key, root in plan.roots():
        folder = staging[key]
        # none: a wave's group without rows for this output (Spark wrote no folder)
        staged = [name for name, _, _ in list_input(paths, folder)] \
            if paths.exists(folder) else []
        trust.inside(paths, root, folder)
        record[f"{key}staging"] = folder[len(root.rstrip("/")) + 1:]  # under the root
        record[f"{key}files"] = [trust.published(index, name) for name in staged]
        moves += [(root, join(folder, name), join(root, trust.published(index, name)))
                  for name in staged]
    commits = join(plan.log, COMMITS)
    moving = join(commits, f"g{index:05d}.moving.json")
    trust.check_record(record, index, moving)  # what a rerun takes: the names it writes
    held()
    write_whole(paths, moving, json.dumps(record))
    for root, source, target in moves:
        held()
        trust.move_into(paths, root, source, target)
    write_whole(paths, join(commits, f"g{index:05d}.json"), json.dumps(record))
    paths.delete(moving)
    for folder in staging.values():
        paths.delete(folder)
    return record
