"""The jobs the package installs: ``score`` (:mod:`spark_keras.jobs.score`).

Each job is a module with ``main(argv, prog) -> int`` that is also runnable as a file, so
that ``spark-submit`` (which takes a ``.py`` file, not a module) can run it from the
installed package: :func:`job_file` gives its path. A job is a package whose ``main`` module
is that file (``score/main.py``); its other parts are modules beside it.
"""

from __future__ import annotations

import importlib
import os

__all__ = ["JOBS", "job_file"]

JOBS: dict[str, str] = {"score": "Score a parquet or CSV dataset with a Keras model on Spark."}


def job_file(name: str) -> str:
    """The absolute path of job ``name``'s ``.py`` file, to give ``spark-submit``."""
    if name not in JOBS:
        from spark_keras.errors import ArgumentError

        raise ArgumentError(f"unknown job {name!r}; the jobs are {sorted(JOBS)}")
    module = importlib.import_module(f"{__name__}.{name}.main")
    assert module.__file__ is not None  # a job's main is a module file
    return os.path.abspath(module.__file__)
