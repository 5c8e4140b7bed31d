"""The ``transform`` front-end (``bm.transform(df, ...)``): ``df`` plus the prediction
(and the reasons, the version's label) computed by an ``arrow_udf`` over the input columns
or, with a resource profile or before PySpark 4.1, every row through ``mapInArrow``; its
arguments checked against the DataFrame's schema on the driver; an observed transform's
figures (:data:`METRICS`)."""

from __future__ import annotations

import functools
import itertools
from typing import Any, Iterator, Sequence

import pyarrow as pa

from spark_keras.errors import ArgumentTypeError, ModelInputError
from spark_keras.executor.resources import check_profile
from spark_keras.handle import ModelHandle
from spark_keras.inference import buckets as bucketing
from spark_keras.inference.options import (
    check_batch_size,
    check_buckets,
    check_error_col,
    check_max_invalid,
    check_on_invalid,
)
from spark_keras.spark import figures as build_figures
from spark_keras.spark import job_budget
from spark_keras.spark.schema_check import check_schema
from spark_keras.spark.scoring import scored_columns
from spark_keras.spark.types import prediction_type
from spark_keras.spark.udf import arrow_udf_of

# What an observed transform reports. ``rows`` and ``invalid_rows`` (a null prediction)
# are counted by the JVM; the builds and the invalid rows by class of reason
# (``invalid_by_reason``: {"input: NaN": 3, ...}) come from the workers in three hidden
# columns, null but on the first row of each batch, summed by ``df.observe`` and dropped
# after
METRICS = ("rows", "invalid_rows", "model_builds", "build_seconds", "invalid_by_reason")
_BUILDS, _BUILD_SECONDS = "__spark_keras_builds", "__spark_keras_build_seconds"
_REASONS = "__spark_keras_reasons"
_HIDDEN = (_BUILDS, _BUILD_SECONDS, _REASONS)


def transform(handle: ModelHandle, df: Any, input_cols: str | Sequence[str],
              output_col: str, *, batch_size: int, on_invalid: str = "error",
              profile: Any = None, error_col: str | None = None, observe: Any = None,
              max_invalid: float | None = None, id_col: str | None = None,
              version_col: str | None = None, key_col: str | None = None,
              scorer: Any = None, buckets: Any = None, max_invalid_scope: str = "action",
              observe_by: tuple[str, Sequence[Any]] | None = None) -> Any:
    """``df`` plus ``output_col`` (and ``error_col``: why each invalid row is, null for
    scored rows; it needs ``on_invalid="null"``; and ``version_col``: the label of the
    model version that scored each row), observed as ``observe`` (an
    ``Observation`` or a name) with :data:`METRICS` if given (with ``observe_by``, a column
    and its values: each metric per value ``v``, named ``"<metric>@<v>"``, over the rows
    holding it: the score job's groups written by one Spark job); scoring fails once the
    invalid rows of the action's tasks (of each task, under ``max_invalid_scope="task"``)
    pass ``max_invalid`` (:mod:`spark_keras.inference.limits`). Errors and reasons name a
    row by its ``id_col`` value if given.

    On PySpark >= 4.1 only the input columns go to Python and only the new columns come
    back (an ``arrow_udf``); with a ``profile`` (a ``ResourceProfile``, PySpark >= 4.0),
    or on an older PySpark, every row goes through ``mapInArrow``.

    With ``key_col`` (:class:`~spark_keras.spark.keyed.KeyedModels`), that column goes to
    the workers first and ``scorer`` (with :func:`~.scoring.scored_columns`'s parameters) scores
    each batch's rows with the model of their key (whose models the caller checks take
    ``buckets``, :func:`~spark_keras.inference.buckets.checked`)."""
    from pyspark.sql.types import StringType, StructField

    check_on_invalid(on_invalid)
    check_profile(profile)
    batch_size = check_batch_size(batch_size)
    max_invalid = check_max_invalid(max_invalid, on_invalid)
    job_budget.check_scope(max_invalid_scope)
    buckets = bucketing.checked(handle, buckets) if scorer is None else check_buckets(buckets)
    _check_observe(observe)
    names = [input_cols] if isinstance(input_cols, str) else list(input_cols)
    schema = df.schema  # one analysis (a round trip on Connect) for every check below
    columns = schema.names
    sent = names if id_col is None else [*names, id_col]  # the columns the workers get
    if key_col is not None:
        sent = [key_col, *sent]
    for role, wanted in (("key_col", [key_col]), ("id_col", [id_col]), ("input column(s)", names)):
        missing = [c for c in wanted if c is not None and c not in columns]
        if missing:
            what = f"{role}={missing[0]!r} is" if role.endswith("_col") else f"{role} {missing}"
            raise ModelInputError(f"{what} not in the DataFrame; it has {columns}")
    for c in sent:
        if columns.count(c) > 1:
            raise ModelInputError(f"input column {c!r} is ambiguous: the DataFrame has "
                                  f"{columns.count(c)} columns of that name ({columns}); "
                                  f"rename or drop one first")
    if output_col in columns:
        raise ModelInputError(f"output column {output_col!r} already exists in the DataFrame")
    check_schema(handle, schema, names)  # what every batch would refuse, refused now
    fields = [StructField(output_col, prediction_type(handle.signature))]
    if error_col is not None:
        _check_error_col(error_col, on_invalid, output_col, columns)
        fields.append(StructField(error_col, StringType()))
    if version_col is not None:
        _check_new_col("version", version_col, [output_col, error_col], columns)
        fields.append(StructField(version_col, StringType()))
    if observe is not None:
        from pyspark.sql.types import DoubleType, LongType

        for hidden in set(_HIDDEN) & set(columns):
            raise ModelInputError(f"column {hidden!r} of the DataFrame is one an observed "
                                  f"transform adds for its figures: rename it")
        fields += [StructField(_BUILDS, LongType()), StructField(_BUILD_SECONDS, DoubleType()),
                   StructField(_REASONS, build_figures.reasons_type())]
    limit = job_budget.limit_for(handle, max_invalid, max_invalid_scope, df.sparkSession)
    score_batches = functools.partial(scorer or scored_columns, handle, names, batch_size=batch_size,
                                      on_invalid=on_invalid, reasons=error_col is not None,
                                      figures=observe is not None, max_invalid=limit,
                                      id_col=id_col, version=version_col is not None,
                                      buckets=buckets)
    udf = None if profile is not None else arrow_udf_of(score_batches, len(sent), fields)
    if udf is not None:
        return _with_udf_columns(df, udf, sent, fields, observe, observe_by)
    scored = _with_mapinarrow_columns(df, score_batches, sent, fields, profile)
    if observe is None:
        return scored
    return scored.observe(observe, *_metrics(_column, output_col, observe_by)).drop(*_HIDDEN)


def _metrics(column: Any, output_col: str, by: tuple[str, Sequence[Any]] | None = None) -> list:
    """The :data:`METRICS` aggregates over the prediction and the three hidden figures
    columns, each found by ``column(name)``: the batches' counts by class of reason
    (``[{reason, rows}, ...]``, on the first row of the batches that have invalid rows)
    summed into one map. With ``by`` (a column, its values): the metrics of each value's
    rows, named ``"<metric>@<value>"``."""
    from pyspark.sql import functions as F

    if by is not None:
        return [metric.alias(f"{name}@{value}") for value in by[1]
                for name, metric in zip(METRICS, _aggregates(column, output_col,
                                                             _column(by[0]) == F.lit(value)))]
    return [value.alias(name) for name, value in zip(METRICS, _aggregates(column, output_col))]


def _aggregates(column: Any, output_col: str, where: Any = None) -> tuple:
    """:func:`_metrics`' aggregates, unnamed, over the rows ``where`` holds (all if None)."""
    from pyspark.sql import functions as F

    def only(value: Any) -> Any:
        return value if where is None else F.when(where, value)

    def add(acc: Any, entry: Any) -> Any:
        return F.map_zip_with(acc, F.create_map(entry["reason"], entry["rows"]),
                              lambda _, a, b: F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0)))

    by_reason = F.aggregate(F.flatten(F.collect_list(only(column(_REASONS)))),
                            F.create_map().cast("map<string,bigint>"), add)
    invalid = column(output_col).isNull()
    return (F.count(only(F.lit(1))),
            F.count(F.when(invalid if where is None else where & invalid, 1)),
            F.coalesce(F.sum(only(column(_BUILDS))), F.lit(0)),
            F.coalesce(F.sum(only(column(_BUILD_SECONDS))), F.lit(0.0)),
            build_figures.reasons_metric(by_reason))


def _with_mapinarrow_columns(df: Any, score_batches: Any, names: list[str], fields: list,
                             profile: Any) -> Any:
    """``df`` plus ``fields``, every row through ``mapInArrow`` (in a stage run with
    ``profile`` if given)."""
    from pyspark.sql.types import StructType

    columns = df.columns
    if len(set(columns)) < len(columns):
        # mapInArrow names every column of df (a join's output may hold two of one name):
        # the repeated ones travel under unique names and get theirs back after
        df = df.toDF(*[c if columns.count(c) == 1 else f"__spark_keras_column_{i}"
                       for i, c in enumerate(columns)])
    schema = StructType(df.schema.fields + fields)
    out_names = [f.name for f in fields]

    def predict(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches, to_score = itertools.tee(batches)  # one batch in, its results out
        scored = score_batches([batch.column(c) for c in names] for batch in to_score)
        for batch, arrays in zip(batches, scored):
            yield pa.RecordBatch.from_arrays([*batch.columns, *arrays],
                                             names=[*batch.schema.names, *out_names])

    # PySpark 3.5's mapInArrow has no profile parameter
    scored = df.mapInArrow(predict, schema) if profile is None \
        else df.mapInArrow(predict, schema, profile=profile)
    return scored if df.columns == columns else scored.toDF(*columns, *out_names)


# the struct of an arrow_udf's several results, unpacked right after it
_RESULTS = "__spark_keras_results"


def _with_udf_columns(df: Any, udf: Any, names: list[str], fields: list, observe: Any,
                      observe_by: tuple[str, Sequence[Any]] | None = None) -> Any:
    """``df`` plus ``fields``, computed by ``udf`` over the ``names`` columns only, the
    hidden build columns observed as ``observe`` (if given) and dropped.

    The observation sits right over the udf's struct of results, so the one projection
    that unpacks it also drops the hidden columns (observing the unpacked columns would
    need a second projection after it to drop them, copying every row again; Spark
    collapses ``withColumns`` and ``drop`` into one). The columns of ``df`` are never
    named again: a join's output may hold two columns of one name."""
    inputs = [_column(c) for c in names]
    if len(fields) == 1:
        return df.withColumn(fields[0].name, udf(*inputs))
    results = df.withColumn(_RESULTS, udf(*inputs))
    if observe is not None:
        results = results.observe(observe, *_metrics(_column(_RESULTS).getField,
                                                     fields[0].name, observe_by))
    return results.withColumns({f.name: _column(_RESULTS)[f.name]
                                for f in fields if f.name not in _HIDDEN}).drop(_RESULTS)


def _column(name: str) -> Any:
    """The top-level column ``name``, whatever its name holds (dots, backticks)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _check_error_col(error_col: Any, on_invalid: str, output_col: str,
                     columns: Sequence[str]) -> None:
    check_error_col(error_col, on_invalid)
    _check_new_col("error", error_col, [output_col], columns)


def _check_new_col(what: str, name: Any, taken: list[str | None], columns: Sequence[str]) -> None:
    """A column ``transform`` adds (``what``: error, version) must be a new name."""
    if not isinstance(name, str) or not name:
        raise ArgumentTypeError(f"{what}_col must be a non-empty column name, not {name!r}")
    if name in taken or name in columns:
        raise ModelInputError(f"{what} column {name!r} already exists in the DataFrame "
                              f"or is another column transform adds")


def _check_observe(observe: Any) -> None:
    """``observe`` must be None, a name, or a ``pyspark.sql.Observation`` (classic or
    Spark Connect)."""
    if observe is None or (isinstance(observe, str) and observe):
        return
    from pyspark.sql.observation import Observation

    classes: list[type] = [Observation]
    try:
        from pyspark.sql.connect.observation import Observation as ConnectObservation

        classes.append(ConnectObservation)
    except ImportError:  # no Connect client packages (grpc...): no Connect observations
        pass
    if not isinstance(observe, tuple(classes)):
        raise ArgumentTypeError(f"observe must be a pyspark.sql.Observation or a non-empty "
                                f"name (streaming queries), not {observe!r}")
