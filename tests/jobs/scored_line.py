"""The score job's SCORED line, as the tests of its processes read it."""

from __future__ import annotations

import re


def summary(proc) -> dict:
    """The figures of the job's one SCORED line."""
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SCORED ")]
    assert len(lines) == 1, (proc.stdout + proc.stderr)[-3000:]
    found = re.fullmatch(r"SCORED rows=(\d+) invalid_rows=(\d+) seconds=\S+ rows_per_second=\S+ "
                         r"model_builds=(\d+) build_seconds=(\S+) wall_seconds=\S+", lines[0])
    assert found, lines[0]
    return {"rows": int(found[1]), "invalid_rows": int(found[2]),
            "model_builds": int(found[3]), "build_seconds": float(found[4])}


def assert_built_once_per_worker(figures: dict) -> None:
    # local[2]: one or two Python workers, each built the model once, while the query ran
    assert 1 <= figures["model_builds"] <= 2 and figures["build_seconds"] > 0, figures
