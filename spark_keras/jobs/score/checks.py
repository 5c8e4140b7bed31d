"""The score job's checks of its options and paths, before any session starts or any
model is loaded: options that do not go together, a metrics file that cannot be written,
an output that exists (unless ``--overwrite`` or ``--resume``), a missing input or model,
and places that hold one another. A path the job cannot use stops it as a bad option
does (:func:`path_errors`)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
from typing import Iterator

from spark_keras.errors import ArgumentError, StorageError
from spark_keras.inference.options import FLAGS, check_buckets, check_error_col, check_max_invalid
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import Paths
from spark_keras.jobs.score.manifest import has_commit_log

__all__ = ["path_errors", "check_paths", "check_options", "check_apart"]


@contextlib.contextmanager
def path_errors() -> Iterator[None]:
    """A path the job cannot use stops it, as a bad option does."""
    try:
        yield
    except StorageError as exc:
        raise JobError(str(exc)) from exc


def check_paths(paths: Paths, args: argparse.Namespace) -> None:
    """Refuse an existing output or invalid rows' output (unless ``--overwrite``), a
    missing input, and places that hold one another."""
    with path_errors():
        check_apart(paths, [("--input", args.input), ("--output", args.output),
                             ("--invalid-output", args.invalid_output)])
        if args.output is not None:
            paths.check_output(args.output)
        if args.output is not None and paths.exists(args.output) \
                and not (args.overwrite or args.resume):
            resumable = has_commit_log(paths, args.output)
            raise JobError(f"output path {args.output!r} exists; pass --overwrite to replace it"
                           + (" (or --resume to continue it)" if resumable else ""))
        if args.invalid_output is not None:
            paths.check_output(args.invalid_output)
            if paths.exists(args.invalid_output) and not (args.overwrite or args.resume):
                raise JobError(f"invalid rows' output path {args.invalid_output!r} exists; "
                               f"pass --overwrite to replace it")
        if not paths.exists(args.input):
            raise JobError(f"input path {args.input!r} does not exist")
        if not paths.exists(args.model):  # before any stage reads the input
            raise JobError(f"cannot load model {args.model!r}: {args.model!r} does not exist")


def check_options(args: argparse.Namespace) -> None:
    """Refuse options that do not go together, and a metrics file that cannot be written,
    before any session starts."""
    try:
        check_error_col(args.error_col, args.on_invalid, FLAGS)
        args.max_invalid = check_max_invalid(args.max_invalid, args.on_invalid, FLAGS)
        args.buckets = check_buckets(args.buckets, FLAGS)
    except ArgumentError as exc:
        raise JobError(str(exc)) from None
    if args.invalid_output is not None and args.on_invalid != "null":
        raise JobError("--invalid-output needs --on-invalid null (with --on-invalid error "
                       "an invalid row fails the job)")
    if args.drop_invalid and args.invalid_output is None:
        raise JobError("--drop-invalid needs --invalid-output (invalid rows are never "
                       "dropped without being kept elsewhere)")
    if args.metrics_json is not None:
        folder = os.path.dirname(os.path.abspath(args.metrics_json))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise JobError(f"--metrics-json {args.metrics_json!r}: folder {folder!r} does not "
                           f"exist or is not writable")


def check_apart(paths: Paths, given: list[tuple[str, str | None]]) -> None:
    """Refuse an output, quarantine and input (``given``: flag, path) that hold one
    another: a fresh run removes its outputs (the input with them), and a resumed one
    lists them (files of the other would be files nobody committed, or input files Spark
    does not read)."""
    places = [(flag, path, paths.place(path)) for flag, path in given if path is not None]
    for (flag, path, where), (other_flag, other, other_where) in itertools.combinations(places, 2):
        if where == other_where:
            raise JobError(f"{other_flag} {other!r} is {flag} {path!r} itself: give it a "
                           f"folder of its own")
    for (flag, path, where), (outer_flag, outer, outer_where) in itertools.permutations(places, 2):
        if where.startswith(outer_where.rstrip("/") + "/"):
            raise JobError(f"{flag} {path!r} is inside {outer_flag} {outer!r}: give it a "
                           f"folder outside")
