"""What the score job answers before Spark starts (:func:`before_spark`): its options,
the paths (a missing input or model, an output that exists), a model file that is no
model, feature and id columns the input does not have, and a ``--resume`` the output
refuses (:func:`spark_keras.jobs.score.manifest.plan`, less the count of the files Spark
reads). Each from the files alone, in well under a second: the input's columns from a
Parquet footer or a CSV header line (and ``k=v`` partition folders), the model's kind
from its first bytes, its digests without Keras (:mod:`spark_keras.payload.fingerprint`).

Local paths only (plain paths and ``file:`` URIs); with any other URI these answers come
once Spark (or the Connect client's ``pyarrow.fs``) opens it, as before. The columns are
those of the first file Spark's listing gives (the schema Spark takes without
``mergeSchema``); an input this cannot read (a compressed CSV, a damaged footer) is left
for Spark to read and judge."""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import itertools
from typing import Any, Sequence

from spark_keras.jobs.score import manifest
from spark_keras.jobs.score.arrow_paths import ArrowPaths
from spark_keras.jobs.score.checks import check_options, check_paths, path_errors
from spark_keras.jobs.score.errors import JobError
from spark_keras.jobs.score.files import join
from spark_keras.payload import fingerprint
from spark_keras.spark.paths import file_uri_path, scheme

__all__ = ["before_spark", "check_columns", "input_columns", "model_digests"]

_COMPRESSED = (".bz2", ".deflate", ".lz4", ".snappy", ".zst", ".xz", ".br")


def _local(path: str | None) -> bool:
    return path is None or scheme(path) in (None, "file")


def model_digests(location: str) -> dict[str, str] | None:
    """The config and weights digests of a local model file
    (:func:`spark_keras.payload.fingerprint.fingerprint`); None for another URI (its
    file's SHA-256 stands for it in the manifest)."""
    if not _local(location):
        return None
    return fingerprint.fingerprint(file_uri_path(location) if scheme(location) == "file"
                                   else location)


def before_spark(args: argparse.Namespace, fmt: str, features: Sequence[str],
                 options: dict) -> None:
    """Every answer the driver can give from the files, before Spark starts (see the
    module's text); ``fmt``: the input's format, ``options``: the manifest's options
    (:func:`spark_keras.jobs.score.run.manifest_options`)."""
    check_options(args)
    if not all(map(_local, (args.model, args.input, args.output, args.invalid_output))):
        return
    paths = ArrowPaths()
    check_paths(paths, args)
    model = file_uri_path(args.model) if scheme(args.model) == "file" else args.model
    try:
        kind = fingerprint.kind(model)
    except OSError as exc:
        raise JobError(f"cannot load model {args.model!r}: {exc.strerror or exc}") from exc
    if kind is None:
        raise JobError(f"cannot load model {args.model!r}: it is neither a spark_keras "
                       f"payload nor a .keras file")
    with path_errors():
        columns = input_columns(paths, args.input, fmt)
    if columns is not None:
        check_columns(features, args.id_col, columns)
    if args.resume and args.output is not None and not args.overwrite:
        with path_errors():
            manifest.plan(paths, args.input, args.output,
                          model_sha256=manifest.file_sha256(model),
                          model_digests=model_digests(args.model), options=options,
                          commit_bytes=args.commit_bytes, overwrite=False, spark_files=None,
                          invalid_output=args.invalid_output)


def check_columns(features: Sequence[str], id_col: str | None, columns: Sequence[str]) -> None:
    """Refuse feature columns and an ``--id-col`` the input does not have."""
    missing = [c for c in features if c not in columns]
    if missing:
        raise JobError(f"feature column(s) {missing} not in the input; it has {list(columns)}")
    if id_col is not None and id_col not in columns:
        raise JobError(f"--id-col {id_col!r} is not a column of the input; it has "
                       f"{list(columns)}")


def input_columns(paths: ArrowPaths, root: str, fmt: str) -> list[str] | None:
    """The columns Spark reads from the local input ``root`` (``fmt``: parquet or csv):
    its first data file's (a Parquet footer, a CSV header line as Spark names it) and
    its ``k=v`` partition folders'; None when this cannot tell."""
    files = [f for f in manifest.list_input(paths, root)
             if not f[0].rpartition("/")[2].startswith("_") and f[1] > 0]
    if not files:
        return None
    relative = files[0][0]
    partitions = [part.partition("=")[0] for part in relative.split("/")[:-1] if "=" in part]
    location = join(root, relative) if relative else root
    local = file_uri_path(location) if scheme(location) == "file" else location
    names: list[str] | None = None
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            names = list(pq.read_schema(local).names)
        elif not local.lower().endswith(_COMPRESSED):
            names = _csv_header(local)
    except (OSError, ValueError, UnicodeDecodeError):  # pyarrow's ArrowInvalid is one
        return None
    return None if names is None else names + [p for p in partitions if p not in names]


def _csv_header(local: str, lines: int = 100) -> list[str] | None:
    """The column names Spark's CSV reader (``header``) takes from the local file: its
    first line that is not blank (Spark skips those), a UTF-8 byte order mark dropped (as
    Spark drops it), an empty name as ``_c<i>``; None when Spark would name them another
    way than this can tell: a quote in the line (Spark's quoting escapes with ``\\``, not
    ``""``), names repeated (Spark adds their places, case-insensitively), no line found."""
    opener: Any = gzip.open if local.lower().endswith(".gz") else open
    with opener(local, "rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        line = next((line for line in itertools.islice(text, lines) if line.strip()), None)
    if line is None or '"' in line:
        return None
    names = [name or f"_c{i}" for i, name in enumerate(next(csv.reader([line]), []))]
    folded = [name.lower() for name in names]
    return names if len(set(folded)) == len(folded) else None
