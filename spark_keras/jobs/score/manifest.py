"""The manifest of a resumable score run (``--resume``): what the job is, written first
into its commit log, and the groups its input is scored in; checked against the manifest a
rerun finds, so that only the same job resumes. Committing the groups is
:mod:`spark_keras.jobs.score.commits`.

* Groups: the files Spark reads under ``--input`` (listed with the path layer under
  Spark's own rule for hidden names, and their count checked against
  ``DataFrame.inputFiles()``), sorted by path, cut into runs of at most ``--commit-bytes``
  (default: about a tenth of the input over the groups in flight,
  :mod:`spark_keras.jobs.score.parallel`); a larger file is a group of its own. Each group is read with the schema
  of the whole input (so CSV inference and partition columns are those of one whole read),
  scored by the same transform and written by Spark into a staging folder.
* Each group is a Spark job with as many tasks as its files split into; several are
  scored at once (:mod:`spark_keras.jobs.score.inflight`).
* The manifest holds what the model scores with (the SHA-256 of its config and of its
  weights, :mod:`spark_keras.payload.fingerprint`: the same model saved again is the same;
  a manifest written before those digests existed holds the SHA-256 of the model file's
  bytes, compared then), the options that change what
  a row becomes or where it goes (features, output and error columns, id column, resize,
  buckets, on-invalid, version column and label, input format, output format, partition
  columns, the quarantine's folder, ``--drop-invalid`` and ``--unsafe-deserialization``:
  not ``--import``, nor the batch size, a matter of
  speed, nor ``--max-invalid``, a limit), each input file's path, size and modification
  time, the commit bound and the groups. A rerun with any of them changed stops (exit 2)
  naming the first difference; ``--overwrite`` starts over.
* The same groups, options and Spark settings make the same tasks and model batches: the
  resumed output holds the same values as an uninterrupted run's.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from spark_keras import storage
from spark_keras.jobs.score import trust
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import Paths, join, listed_by_spark
from spark_keras.jobs.score.parallel import default_commit_bytes

__all__ = ["FORMAT", "LOG", "MANIFEST", "OPTIONS", "Plan", "plan",
           "plan_groups", "difference", "file_sha256", "has_commit_log", "list_input",
           "read_log_file", "utc_time"]

LOG = "_spark_keras"  # the commit log's folder, inside the output
MANIFEST = "manifest.json"
FORMAT = 1  # of the manifest and records
# the options that change what a row becomes, as the manifest names them and as the flags
OPTIONS = {"features": "--features", "output_col": "--output-col", "format": "--format",
           "on_invalid": "--on-invalid", "error_col": "--error-col", "id_col": "--id-col",
           "resize": "--resize", "buckets": "--buckets", "version_col": "--version-col",
           "model_version": "--model-version", "output_format": "--output-format",
           "partition_by": "--partition-by", "invalid_output": "--invalid-output",
           "drop_invalid": "--drop-invalid", "unsafe_deserialization": "--unsafe-deserialization"}
# what a manifest written before an option existed means by its absence
_BEFORE = {"output_format": "parquet", "drop_invalid": False, "unsafe_deserialization": False}


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


def utc_time(ms: int) -> str:
    """A time in milliseconds since the epoch, as the commit log writes it (UTC)."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc) \
        .strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def difference(old: dict, new: dict, input_path: str) -> str | None:
    """What differs between the manifest of the committed groups (``old``) and this run's
    (``new``), in a phrase naming the first difference; None if they agree."""
    if old.get("format") != FORMAT:
        return f"its commit log has format {old.get('format')!r}; this job writes {FORMAT}"
    model = _model_difference(old, new)
    if model:
        return model
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
                           f"modified {utc_time(time0)} -> {utc_time(time1)})")
    if changed:
        more = f" (and {len(changed) - 1} more input file(s))" if len(changed) > 1 else ""
        return changed[0] + more
    return None


def _model_difference(old: dict, new: dict) -> str | None:
    """The model's difference: its config or its weights (their digests, when both
    manifests have them), else its file's bytes."""
    before, now = old.get("model_digests"), new.get("model_digests")
    if before and now:
        parts = [part for part in ("config", "weights") if before.get(part) != now.get(part)]
        if not parts:
            return None
        said = "; ".join(f"its {part} sha256 {str(now.get(part))[:12]}... now, "
                         f"{str(before.get(part))[:12]}... for the committed groups"
                         for part in parts)
        return f"the model is another one ({' and '.join(parts)} differ: {said})"
    if old["model_sha256"] != new["model_sha256"]:
        return (f"the model is another one (sha256 {new['model_sha256'][:12]}...; the "
                f"committed groups were scored by {old['model_sha256'][:12]}...)")
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
        return read_log_file(paths, manifest)
    if top.is_dir and all(entry.name == LOG for entry in paths.children(output)):
        return None
    raise JobError(f"output path {output!r} exists and holds no commit log of a resumable "
                   f"run (no {LOG}/{MANIFEST}); pass --overwrite to replace it")


def has_commit_log(paths: Paths, output: str) -> bool:
    """Whether ``output`` is a resumable run's output (finished or not)."""
    return paths.exists(join(join(output, LOG), MANIFEST))


def read_log_file(paths: Paths, path: str) -> dict:
    """The JSON object a file of the commit log holds; a damaged one stops the job."""
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
         options: dict, commit_bytes: int | None, overwrite: bool, spark_files: int | None,
         slots: int = 1,
         invalid_output: str | None = None,
         model_digests: dict | None = None) -> Plan:
    """The groups of this run, or a :class:`JobError` (exit 2) saying why the output
    cannot be resumed: another model, other options or input files, or an output that is
    not a resumable run's (unless ``overwrite``). Nothing is written.

    Args:
        output: the output folder; None for a table this run makes (nothing to resume).
        options: the values of :data:`OPTIONS`' keys.
        commit_bytes: the bound of a group; None: the committed groups' (else the default,
            :func:`~spark_keras.jobs.score.parallel.default_commit_bytes` of the input's
            bytes and ``slots``).
        spark_files: how many files Spark reads under ``input_path``
            (``len(df.inputFiles())``), checked against the path layer's listing (None:
            not checked: the check before Spark starts).
        model_digests: the model's config and weights digests
            (:func:`spark_keras.payload.fingerprint.fingerprint`), compared instead of
            ``model_sha256`` when both manifests have them.
        invalid_output: the quarantine's folder (``--invalid-output``), if any.
    """
    files = list_input(paths, input_path)
    if spark_files is not None and len(files) != spark_files:
        raise JobError(f"Spark reads {spark_files} file(s) under {input_path!r} but the job "
                       f"lists {len(files)}: it cannot cut this input into commits")
    old = None if overwrite or output is None else _manifest_of(paths, output)
    if old is None and not overwrite and invalid_output is not None \
            and paths.exists(invalid_output):
        raise JobError(f"invalid rows' output path {invalid_output!r} exists; pass "
                       f"--overwrite to replace it")
    bound = commit_bytes or (old["commit_bytes"] if old else
                             default_commit_bytes(sum(size for _, size, _ in files), slots))
    manifest = {"format": FORMAT, "model_sha256": model_sha256, "model_digests": model_digests,
                "options": json.loads(json.dumps(options)),  # tuples as JSON keeps them
                "commit_bytes": bound, "files": [list(f) for f in files],
                "groups": plan_groups([size for _, size, _ in files], bound)}
    if old is not None:
        what = difference(old, manifest, input_path)
        if what:
            raise JobError(f"cannot resume {output!r}: {what}; pass --overwrite to start over")
    return Plan(paths, input_path, output, manifest, resume=old is not None,
                invalid_output=invalid_output)
