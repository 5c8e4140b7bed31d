"""Every option the score job's page (docs/guide/score-job.md) refuses to change on
``--resume`` reaches the resume manifest and is refused by its name (issue 51); every other
option of the job is one the page says may change, or names where and how the job runs. No Spark: the
manifest is planned on the client's path layer, as the job plans it."""

from __future__ import annotations

import os
import re

import pytest

from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.main import parse_args
from spark_keras.jobs.score.manifest import OPTIONS, difference, file_sha256, plan
from spark_keras.jobs.score.run import manifest_options
from tests.conftest import REPO_ROOT

# a changed value of each option the page refuses: (both runs', the second run's) options
CHANGES = {
    "--features": ([], ["--features", "features,id"]),
    "--output-col": ([], ["--output-col", "score"]),
    "--format": ([], ["--format", "csv"]),
    "--on-invalid": ([], ["--on-invalid", "null"]),
    "--error-col": ([], ["--error-col", "why"]),
    "--id-col": ([], ["--id-col", "id"]),
    "--resize": ([], ["--resize", "bilinear"]),
    "--buckets": ([], ["--buckets", "4,8"]),
    "--version-col": ([], ["--version-col", "version"]),
    "--model-version": (["--version-col", "version"], ["--model-version", "2"]),
    "--output-format": ([], ["--output-format", "orc"]),
    "--partition-by": ([], ["--partition-by", "k"]),
    "--invalid-output": ([], ["--invalid-output", "q"]),
    "--drop-invalid": (["--invalid-output", "q"], ["--drop-invalid"]),
    "--unsafe-deserialization": ([], ["--unsafe-deserialization"]),
    "--commit-bytes": ([], ["--commit-bytes", "200"]),
}
# options that name where and how the job runs, not what a row becomes (the model file and
# the input files are refused by their digest, sizes and times)
RUNNING = {"--model", "--input", "--output", "--output-table", "--overwrite", "--resume",
           "--master", "--remote", "--progress", "--no-progress", "--progress-seconds",
           "--metrics-json", "--conf", "--properties-file", "--verbose", "--help"}


def readme_resume_flags() -> tuple[list[str], list[str]]:
    """The flags of the page's ``--resume`` refusals: (refused when changed, may change)."""
    with open(os.path.join(REPO_ROOT, "docs", "guide", "score-job.md"), encoding="utf-8") as f:
        text = f.read()
    bullet = re.search(r"^\* \*\*Refusals\.\*\*(.*?)^\* ", text, re.S | re.M)
    assert bullet, "docs/guide/score-job.md: the --resume section's Refusals bullet"
    refused, _, rest = bullet[1].partition("stops the job")
    may_change = rest.partition("may change between runs")[0]
    flags = re.compile(r"`(--[a-z][a-z-]*)")
    return flags.findall(refused), flags.findall(may_change.rpartition("\n\n")[2])


def test_every_option_the_readme_refuses_on_resume_reaches_the_manifest(tmp_path):
    """For each flag the page lists, two runs that differ in it alone plan manifests
    that differ in it, refused naming it; the manifest's options are those the page
    lists (a new one documented, a documented one recorded)."""
    refused, _ = readme_resume_flags()
    assert sorted(refused) == sorted(CHANGES), "give each refused flag a changed value here"
    assert set(OPTIONS.values()) | {"--commit-bytes"} == set(refused)
    (tmp_path / "in").mkdir()
    for name in ("part-0.parquet", "part-1.parquet"):
        (tmp_path / "in" / name).write_bytes(b"rows")
    (tmp_path / "model.keras").write_bytes(b"model")
    base = ["--model", str(tmp_path / "model.keras"), "--input", str(tmp_path / "in"),
            "--output", str(tmp_path / "out"), "--features", "features", "--resume",
            "--commit-bytes", "100"]

    def manifest(argv: list[str]) -> dict:
        args = parse_args(argv)
        return plan(ArrowPaths(), args.input, None, model_sha256=file_sha256(args.model),
                    options=manifest_options(args), commit_bytes=args.commit_bytes,
                    overwrite=False, spark_files=2).manifest

    keys = {flag: key for key, flag in OPTIONS.items()}
    for flag, (both, changed) in CHANGES.items():
        before, after = manifest(base + both), manifest(base + both + changed)
        if flag in keys:  # recorded, and recorded as changed
            key = keys[flag]
            assert before["options"].get(key, "absent") != after["options"].get(key, "absent"), \
                f"{flag} does not reach the manifest's options[{key!r}]"
        said = difference(before, after, str(tmp_path / "in"))
        assert said is not None and (f"{flag} differs" in said or flag == "--invalid-output"), \
            (flag, said)  # a quarantine's rows carry the model version: named first
    (tmp_path / "other.keras").write_bytes(b"another model")
    said = difference(manifest(base),
                      manifest(base + ["--model", str(tmp_path / "other.keras")]), "in")
    assert said is not None and said.startswith("the model is another one"), said


def test_every_option_of_the_job_is_refused_on_resume_or_may_change(capsys, monkeypatch):
    """The job's options (its ``--help``): each is refused when changed on ``--resume``,
    or one the page says may change, or one naming where and how the job runs."""
    refused, may_change = readme_resume_flags()
    assert may_change == ["--batch-size", "--max-invalid", "--import"], may_change
    monkeypatch.setenv("COLUMNS", "2000")  # argparse's width: no flag cut at a line's end
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", capsys.readouterr().out))
    unsorted = options - set(refused) - set(may_change) - RUNNING
    assert not unsorted, f"say in docs/guide/score-job.md whether a change of {sorted(unsorted)} is refused"
