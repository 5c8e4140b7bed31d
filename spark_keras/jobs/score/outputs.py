"""What the score job writes, and how: the output (a folder, or a catalog table), its
format and partition columns, and the quarantine of invalid rows (``--invalid-output``).

* The transform is asked for the reasons and the model version's label whenever there is
  a quarantine (under hidden names when ``--error-col`` / ``--version-col`` are not
  given): :meth:`Outputs.main` is the output's rows (hidden columns dropped; invalid rows
  left out with ``--drop-invalid``), :meth:`Outputs.quarantine` the invalid rows, with the
  input's columns as read, the reason and the version.
* Both come from one scored DataFrame, held with ``persist`` while they are written
  (:meth:`Outputs.write`): the model scores each row once.
* A table (``--output-table``) is saved with Spark's writer (``saveAsTable``); a resumable
  run makes it empty first (:func:`create_table`) and commits into its location
  (:func:`table_location`), refreshed after each commit (:func:`refresh_table`).
"""

from __future__ import annotations

import argparse
import contextlib
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator

from spark_keras.jobs.score.errors import JobError

__all__ = ["OUTPUT_FORMATS", "Outputs", "table_exists", "table_location", "create_table",
           "refresh_table", "drop_table"]

OUTPUT_FORMATS = ("parquet", "orc", "json", "csv")
REASON, VERSION = "reason", "model_version"  # the quarantine's columns, unless named
_HIDDEN_REASON, _HIDDEN_VERSION = "__spark_keras_reason", "__spark_keras_version"


@dataclass
class Outputs:
    """Where and how the job writes (see the module's text)."""

    format: str
    partition_by: list[str] | None
    path: str | None  # the output folder; None for a table
    table: str | None
    invalid_path: str | None  # the quarantine's folder
    drop_invalid: bool
    error_col: str | None  # the user's --error-col
    version_col: str | None  # the user's --version-col
    input_columns: list[str]

    @classmethod
    def of(cls, args: argparse.Namespace, input_columns: list[str]) -> "Outputs":
        """The job's outputs, or a :class:`JobError` for options that do not go together
        or name columns the input does not have (before the model is loaded)."""
        outputs = cls(args.output_format, args.partition_by, args.output, args.output_table,
                      args.invalid_output, args.drop_invalid, args.error_col,
                      args.version_col, list(input_columns))
        outputs.check()
        return outputs

    def check(self) -> None:
        if self.drop_invalid and self.invalid_path is None:
            raise JobError("--drop-invalid needs --invalid-output (invalid rows are never "
                           "dropped without being kept elsewhere)")
        for name in self.partition_by or []:
            if name not in self.input_columns:
                raise JobError(f"--partition-by column {name!r} is not a column of the input; "
                               f"it has {self.input_columns}")
        if self.invalid_path is not None:
            for flag, name in (("--error-col", self.reason_col), ("--version-col", self.version)):
                if name in self.input_columns:
                    raise JobError(f"--invalid-output: the input has a column {name!r}, the "
                                   f"quarantine's name for it: name it with {flag}")

    @property
    def reason_col(self) -> str:
        """The quarantine's reason column."""
        return self.error_col or REASON

    @property
    def version(self) -> str:
        """The quarantine's model version column."""
        return self.version_col or VERSION

    def transform_cols(self) -> tuple[str | None, str | None]:
        """``(error_col, version_col)`` to ask the transform for: the user's, and hidden
        ones when the quarantine needs them."""
        if self.invalid_path is None:
            return self.error_col, self.version_col
        return self.error_col or _HIDDEN_REASON, self.version_col or _HIDDEN_VERSION

    def main(self, scored: Any) -> Any:
        """The output's rows of the transform's ``scored``."""
        if self.invalid_path is None:
            return scored
        error_col, version_col = self.transform_cols()
        assert error_col is not None  # there is a quarantine
        if self.drop_invalid:
            scored = scored.where(_col(error_col).isNull())
        hidden = [c for c in (error_col, version_col) if c in (_HIDDEN_REASON, _HIDDEN_VERSION)]
        return scored.drop(*hidden)

    def quarantine(self, scored: Any, group_col: str | None = None) -> Any:
        """The invalid rows of ``scored``: the input's columns (and ``group_col``), the
        reason, the version."""
        error_col, version_col = self.transform_cols()
        assert error_col is not None and version_col is not None  # there is a quarantine
        kept = self.input_columns + ([group_col] if group_col else [])
        return scored.where(_col(error_col).isNotNull()).select(
            *[_col(c) for c in kept],
            _col(error_col).alias(self.reason_col), _col(version_col).alias(self.version))

    def rows_written(self, rows: int, invalid_rows: int) -> dict[str, int]:
        """With a quarantine: the rows the output holds (less the invalid ones with
        ``--drop-invalid``) and those the quarantine holds."""
        if self.invalid_path is None:
            return {}
        return {"rows_written": rows - invalid_rows if self.drop_invalid else rows,
                "rows_quarantined": invalid_rows}

    def check_schema(self, scored: Any) -> None:
        """Refuse (before any write) columns the output's format cannot hold: CSV takes
        numbers, strings, booleans, dates and times, not arrays, maps or structs."""
        if self.format != "csv":
            return
        from pyspark.sql.types import ArrayType, MapType, StructType

        frames = [("the output", self.main(scored))]
        if self.invalid_path is not None:
            frames.append(("the invalid rows' output", self.quarantine(scored)))
        for what, frame in frames:
            nested = [f"{f.name} ({f.dataType.simpleString()})" for f in frame.schema.fields
                      if isinstance(f.dataType, (ArrayType, MapType, StructType))
                      or f.dataType.typeName() in ("udt", "vector")]
            if nested:
                raise JobError(f"--output-format csv cannot hold column(s) {nested} of {what}: "
                               f"give parquet, orc or json")

    def writer(self, frame: Any, partitioned: bool = True, group_col: str | None = None) -> Any:
        """Spark's writer of ``frame`` in the output's format (partitioned unless not
        ``partitioned``: the quarantine is not; by ``group_col`` first if given)."""
        writer = frame.write.format(self.format)
        if self.format == "csv":
            writer = writer.option("header", True)
        if group_col and self.format == "parquet" and not _session_sets(frame, _DICTIONARY):
            # a wave's files are a group's each, small: parquet-mr tries a dictionary on
            # every float column chunk up to its page size (1 MiB: 262,144 distinct
            # floats) before it falls back, hashed then re-encoded; a smaller bound falls
            # back sooner and keeps a dictionary for columns of few values
            writer = writer.option(_DICTIONARY, str(DICTIONARY_BYTES))
        columns = ([group_col] if group_col else []) + \
            (list(self.partition_by or []) if partitioned else [])
        if columns:
            writer = writer.partitionBy(*columns)
        return writer

    def write(self, scored: Any, main: str | None, invalid: str | None,
              overwrite: bool = False, group_col: str | None = None) -> None:
        """Write ``scored``: its invalid rows into the folder ``invalid`` (if there is a
        quarantine), then the output's rows into the folder ``main``, or the table (None;
        replaced if ``overwrite``). Folders are as Spark must be given them. With
        ``group_col`` (a wave of the score job's groups), each value's rows into a folder
        ``<group_col>=<value>`` of each."""
        with _held(scored, self.invalid_path is not None):
            if invalid is not None:
                self.writer(self.quarantine(scored, group_col), partitioned=False,
                            group_col=group_col).save(invalid)
            writer = self.writer(self.main(scored), group_col=group_col)
            if main is not None:
                writer.save(main)
            else:
                assert self.table is not None  # no folder: a table
                with table_errors(self.table):
                    writer.mode("overwrite" if overwrite else "error").saveAsTable(self.table)


_DICTIONARY = "parquet.dictionary.page.size"
DICTIONARY_BYTES = 64 * 1024  # a wave's parquet dictionaries: up to 16,384 floats


def _session_sets(frame: Any, key: str) -> bool:
    """Whether the session's settings give the Hadoop setting ``key`` (kept then)."""
    try:
        return frame.sparkSession.conf.get(f"spark.hadoop.{key}", None) is not None
    except Exception:  # a setting the session cannot tell: taken as not set
        return False


@contextlib.contextmanager
def _held(frame: Any, hold: bool) -> Iterator[None]:
    """``frame`` persisted while in the block (if ``hold``): two writes of it score once."""
    if not hold:
        yield
        return
    from pyspark import StorageLevel

    frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        yield
    finally:
        frame.unpersist()


def _col(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


# --- catalog tables ----------------------------------------------------------------------------

@contextlib.contextmanager
def table_errors(name: str) -> Iterator[None]:
    """What Spark's analysis refuses of table ``name`` (a database that does not exist, a
    bad name) stops the job as a bad option does, in one line."""
    from pyspark.errors import AnalysisException, ParseException

    try:
        yield
    except (AnalysisException, ParseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobError(f"--output-table {name!r}: {first}") from exc


def table_exists(spark: Any, name: str) -> bool:
    with table_errors(name):
        return bool(spark.catalog.tableExists(name))


def table_location(spark: Any, name: str) -> str:
    """The folder of table ``name`` (``DESCRIBE TABLE EXTENDED``'s ``Location``), or a
    :class:`JobError` for a table that has none (a view)."""
    with table_errors(name):
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
    for row in rows:
        if row[0] == "Location" and row[1]:
            return str(row[1])
    raise JobError(f"--output-table {name!r} has no location (a view?): the job writes "
                   f"file tables")


def table_folder(spark: Any, name: str) -> str | None:
    """The folder table ``name`` has, or where Spark makes it as a managed table (its
    database's folder, the name in lower case); None if that cannot be told (a name
    quoted with backticks, another catalog's)."""
    if table_exists(spark, name):
        return table_location(spark, name)
    parts = [part.strip() for part in name.split(".")]  # as Spark's parser reads it
    if parts[0] == "spark_catalog" and len(parts) == 3:
        parts = parts[1:]
    if "`" in name or len(parts) > 2:
        return None
    with table_errors(name):
        database = parts[0] if len(parts) == 2 else spark.catalog.currentDatabase()
        location = spark.catalog.getDatabase(database).locationUri
    # a URI, percent-encoded (a table's Location is not): a space is %20 there
    return f"{urllib.parse.unquote(location).rstrip('/')}/{parts[-1].lower()}"


def create_table(spark: Any, name: str, outputs: Outputs, schema: Any) -> str:
    """Table ``name``, made empty with ``schema`` (the output's format and partition
    columns) by Spark's writer; its location."""
    empty = spark.createDataFrame([], schema)
    with table_errors(name):
        outputs.writer(empty).mode("error").saveAsTable(name)
    return table_location(spark, name)


def refresh_table(spark: Any, name: str, partitioned: bool) -> None:
    """Make the files committed into table ``name``'s location visible: its partitions
    found (``RECOVER PARTITIONS``) and the session's listing of it refreshed."""
    with table_errors(name):
        if partitioned:
            spark.sql(f"ALTER TABLE {name} RECOVER PARTITIONS")
        spark.sql(f"REFRESH TABLE {name}")


def drop_table(spark: Any, name: str) -> None:
    with table_errors(name):
        spark.sql(f"DROP TABLE IF EXISTS {name}")
