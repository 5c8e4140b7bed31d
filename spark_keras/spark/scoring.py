"""Spark front-ends of the scoring engine (:mod:`spark_keras.inference.engine`): the UDF,
the ``mapInArrow`` transform and the ``mapPartitions`` helper. They only move data:
Arrow batches, pandas batches or Python rows in, through one engine, and predictions out
as an Arrow column, a pandas column or one value per row."""

from __future__ import annotations

import functools
import itertools
from typing import Any, Iterable, Iterator, Sequence, Tuple, Union

import pyarrow as pa

from spark_keras.errors import ArgumentTypeError, ModelInputError
from spark_keras.executor.resources import check_profile
from spark_keras.handle import ModelHandle
from spark_keras.inference import buckets as bucketing
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import Scored, score
from spark_keras.inference.limits import InvalidBudget
from spark_keras.inference.options import (
    Buckets,
    check_batch_size,
    check_buckets,
    check_error_col,
    check_max_invalid,
    check_on_invalid,
)
from spark_keras.inference.outputs import to_arrow, to_rows
from spark_keras.inference.preprocess import columns_of_rows
from spark_keras.spark import figures as build_figures
from spark_keras.spark import job_budget
from spark_keras.spark.job_budget import MaxInvalid
from spark_keras.spark.schema_check import check_schema
from spark_keras.spark.types import prediction_type, spark_type


def _column_name(col: Any) -> str:
    if isinstance(col, str):
        return col
    text = str(col)  # Column<'features'>
    return text[8:-2] if text.startswith("Column<'") and text.endswith("'>") else text


class PredictUDF:
    """Callable like a UDF: ``udf("features")``, ``udf("a", "b", "c")`` or
    ``udf(struct(*cols))`` gives a Column.

    The column names are bound when it is called, so input errors raised on executors
    name the column at fault.
    """

    def __init__(self, handle: ModelHandle, *, return_type: Any = None,
                 batch_size: int, on_invalid: str = "error",
                 max_invalid: float | None = None, buckets: Any = None,
                 max_invalid_scope: str = "action") -> None:
        check_on_invalid(on_invalid)
        self.max_invalid = check_max_invalid(max_invalid, on_invalid)
        self.max_invalid_scope = job_budget.check_scope(max_invalid_scope)
        self.buckets = bucketing.checked(handle, buckets)
        self.handle = handle
        self.returnType = spark_type(return_type) if return_type is not None \
            else prediction_type(handle.signature)
        self.batch_size = check_batch_size(batch_size)
        self.on_invalid = on_invalid

    def __call__(self, *columns: Any) -> Any:
        if not columns:
            raise ModelInputError("predict_udf needs at least one input column")
        from pyspark.sql.types import StructField

        names = [_column_name(c) for c in columns]
        # each column made is a budget of its own
        max_invalid = job_budget.limit_for(self.handle, self.max_invalid, self.max_invalid_scope)
        score_batches = functools.partial(_scored_columns, self.handle, names,
                                          batch_size=self.batch_size, on_invalid=self.on_invalid,
                                          reasons=False, figures=False,
                                          max_invalid=max_invalid, buckets=self.buckets)
        udf = _arrow_udf_of(score_batches, len(names), [StructField("prediction", self.returnType)])
        if udf is None:  # PySpark < 4.1: a pandas UDF
            run = functools.partial(score, self.handle, batch_size=self.batch_size,
                                    on_invalid=self.on_invalid,
                                    reasons=self.max_invalid is not None, buckets=self.buckets)
            udf = _make_pandas_udf(names, self.returnType, run, max_invalid)
        return udf(*columns)


def _make_pandas_udf(names: list[str], return_type: Any, run: Any,
                     max_invalid: MaxInvalid = None):
    import operator

    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import StructType

    def predict(batches):
        budget = job_budget.budget_of(max_invalid)
        for batch in batches:
            series = list(batch) if isinstance(batch, (tuple, list)) else [batch]
            scored = run(cols.from_pandas(names, series))
            budget.add(scored)
            out = to_arrow(scored)
            if isinstance(out, pa.StructArray):
                yield pa.Table.from_arrays(out.flatten(), names=[f.name for f in out.type]).to_pandas()
            else:
                yield out.to_pandas()
        budget.finish()

    # an iterator-of-batches pandas UDF, told by type hints (a struct column, such as an
    # ML Vector, arrives as a DataFrame)
    column = Union[pd.Series, pd.DataFrame]
    item = column if len(names) == 1 else Tuple[column, ...]
    # (a type made at run time, for pandas_udf to read: mypy cannot check it)
    predict.__annotations__ = {"batches": Iterator[item],  # type: ignore[valid-type]
                               "return": Iterator[pd.Series]}
    udf = pandas_udf(predict, return_type)  # type: ignore[call-overload]  # typed at run time
    if not isinstance(udf.returnType, StructType):
        return udf

    def struct_or_null(*columns):
        # a pandas UDF cannot return a null struct: an invalid row comes back with every
        # field null (a valid one never has a null field), so make that row null
        col = udf(*columns)
        every_null = functools.reduce(operator.and_, [col[f.name].isNull() for f in udf.returnType.fields])
        return F.when(every_null, F.lit(None).cast(udf.returnType)).otherwise(col)

    return struct_or_null


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
              scorer: Any = None, buckets: Any = None, max_invalid_scope: str = "action") -> Any:
    """``df`` plus ``output_col`` (and ``error_col``: why each invalid row is, null for
    scored rows; it needs ``on_invalid="null"``; and ``version_col``: the label of the
    model version that scored each row), observed as ``observe`` (an
    ``Observation`` or a name) with :data:`METRICS` if given; scoring fails once the
    invalid rows of the action's tasks (of each task, under ``max_invalid_scope="task"``)
    pass ``max_invalid`` (:mod:`spark_keras.inference.limits`). Errors and reasons name a
    row by its ``id_col`` value if given.

    On PySpark >= 4.1 only the input columns go to Python and only the new columns come
    back (an ``arrow_udf``); with a ``profile`` (a ``ResourceProfile``, PySpark >= 4.0),
    or on an older PySpark, every row goes through ``mapInArrow``.

    With ``key_col`` (:class:`~spark_keras.spark.keyed.KeyedModels`), that column goes to
    the workers first and ``scorer`` (with :func:`_scored_columns`'s parameters) scores
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
    score_batches = functools.partial(scorer or _scored_columns, handle, names, batch_size=batch_size,
                                      on_invalid=on_invalid, reasons=error_col is not None,
                                      figures=observe is not None, max_invalid=limit,
                                      id_col=id_col, version=version_col is not None,
                                      buckets=buckets)
    udf = None if profile is not None else _arrow_udf_of(score_batches, len(sent), fields)
    if udf is not None:
        return _with_udf_columns(df, udf, sent, fields, observe)
    scored = _with_mapinarrow_columns(df, score_batches, sent, fields, profile)
    if observe is None:
        return scored
    return scored.observe(observe, *_metrics(_column, output_col)).drop(*_HIDDEN)


def _metrics(column: Any, output_col: str) -> list:
    """The :data:`METRICS` aggregates over the prediction and the three hidden figures
    columns, each found by ``column(name)``: the batches' counts by class of reason
    (``[{reason, rows}, ...]``, on the first row of the batches that have invalid rows)
    summed into one map."""
    from pyspark.sql import functions as F

    def add(acc: Any, entry: Any) -> Any:
        return F.map_zip_with(acc, F.create_map(entry["reason"], entry["rows"]),
                              lambda _, a, b: F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0)))

    by_reason = F.aggregate(F.flatten(F.collect_list(column(_REASONS))),
                            F.create_map().cast("map<string,bigint>"), add)
    values = (F.count(F.lit(1)), F.count(F.when(column(output_col).isNull(), 1)),
              F.coalesce(F.sum(column(_BUILDS)), F.lit(0)),
              F.coalesce(F.sum(column(_BUILD_SECONDS)), F.lit(0.0)), build_figures.reasons_metric(by_reason))
    return [value.alias(name) for name, value in zip(METRICS, values)]


def _scored_columns(handle: ModelHandle, names: list[str],
                    batches: Iterator[Sequence[pa.Array]], *, batch_size: int,
                    on_invalid: str, reasons: bool, figures: bool,
                    max_invalid: MaxInvalid = None, id_col: str | None = None,
                    version: bool = False, buckets: Buckets = None) -> Iterator[list[pa.Array]]:
    """Per batch of input columns (in ``names`` order, then ``id_col``'s values, which
    name the rows in errors and reasons): the prediction, the reasons
    (``reasons``), the version's label (``version``) and the hidden figures columns
    (``figures``: the builds this process made for this query that this stage has not
    reported, see :mod:`.figures`, and the batch's invalid rows by class of reason). The
    batches are one task's, scored by one version of the model: its invalid rows are held
    against ``max_invalid`` (:mod:`.job_budget`); ``buckets`` (checked) pads variable-length
    rows (:mod:`spark_keras.inference.buckets`)."""
    handle = handle.for_task()
    budget = job_budget.budget_of(max_invalid)
    if figures:
        query, stage = build_figures.task_ids()
        seen = build_figures.builds_of(handle.key)
    for arrays in batches:
        arrays = list(arrays)
        ids = None if id_col is None else (id_col, arrays.pop())
        scored, out = batch_columns(handle, names, arrays, batch_size=batch_size,
                                    on_invalid=on_invalid, reasons=reasons, version=version,
                                    ids=ids, budget=budget, buckets=buckets, explain=figures)
        if figures:
            now = build_figures.builds_of(handle.key)
            build_figures.ledger.add(handle.key, query, now[0] - seen[0], now[1] - seen[1])
            seen = now
            # an empty batch cannot carry them: they go with the next batch
            reported = build_figures.ledger.report(handle.key, query, stage) if scored.rows \
                else (0, 0.0)
            out += build_figures.builds_columns(scored.rows, *reported)
            out.append(build_figures.reasons_column(scored))
        yield out
    budget.finish()


def batch_columns(handle: ModelHandle, names: list[str], arrays: Sequence[pa.Array], *,
                  batch_size: int, on_invalid: str, reasons: bool, version: bool,
                  ids: tuple[str, Any] | None, budget: InvalidBudget,
                  buckets: Buckets = None, positions: Any = None, explain: bool = False
                  ) -> tuple[Scored, list[pa.Array]]:
    """One batch scored by ``handle`` (a task's version), its variable-length rows padded
    into ``buckets`` if given: the prediction column, then the reasons (``reasons``) and the
    version's label (``version``); its invalid rows are held against ``budget``.
    ``positions``: the rows' numbers in the batch, when they are some of its rows.
    ``explain``: the reasons and their classes made (in the :class:`Scored`) even when
    not returned."""
    scored = score(handle, cols.from_arrow(names, list(arrays)), batch_size=batch_size,
                   on_invalid=on_invalid, reasons=reasons or budget.active or explain,
                   ids=ids, buckets=buckets, positions=positions)
    budget.add(scored)
    out = [to_arrow(scored)]
    if reasons:
        out.append(_reasons(scored))
    if version:
        out.append(pa.repeat(handle.version, scored.rows))
    return scored, out


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


def _arrow_udf_of(score_batches: Any, n_inputs: int, fields: list) -> Any:
    """An iterator ``arrow_udf`` returning ``fields`` (one column, or a struct of them),
    or None before PySpark 4.1."""
    try:
        from pyspark.sql.pandas.functions import arrow_udf
    except ImportError:
        return None
    from pyspark.sql.types import StructType

    def predict(batches):
        inputs = (list(b) if isinstance(b, (tuple, list)) else [b] for b in batches)
        for arrays in score_batches(inputs):
            if len(fields) == 1:
                yield arrays[0]
            else:
                yield pa.StructArray.from_arrays(arrays, names=[f.name for f in fields])

    item = pa.Array if n_inputs == 1 else Tuple[pa.Array, ...]
    predict.__annotations__ = {"batches": Iterator[item],  # type: ignore[valid-type]  # as above
                               "return": Iterator[pa.Array]}
    return arrow_udf(predict,  # type: ignore[call-overload]  # typed at run time, as above
                     fields[0].dataType if len(fields) == 1 else StructType(fields))


# the struct of an arrow_udf's several results, unpacked right after it
_RESULTS = "__spark_keras_results"


def _with_udf_columns(df: Any, udf: Any, names: list[str], fields: list, observe: Any) -> Any:
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
        results = results.observe(observe, *_metrics(_column(_RESULTS).getField, fields[0].name))
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


def _reasons(scored: Scored) -> pa.Array:
    """Why each row was not scored (null for scored rows), as an Arrow string column."""
    if scored.reasons is None:
        return pa.nulls(scored.rows, pa.string())
    return pa.array(scored.reasons, type=pa.string())


def predict_rows(handle: ModelHandle, rows: Iterable[Any], *, batch_size: int,
                 on_invalid: str = "error", max_invalid: float | None = None,
                 id_col: str | None = None, buckets: Any = None,
                 max_invalid_scope: str = "action") -> Iterator[Any]:
    """One prediction per row, in order (None for invalid rows under ``"null"``); the
    rows are one task's, their invalid ones held against ``max_invalid`` (with those of
    the job's other tasks that score with this handle and limit, unless
    ``max_invalid_scope="task"``); with ``id_col`` each row's field of that name names it
    in errors and is not an input; ``buckets`` checked against this process's model (the
    task's: there is no driver here)."""
    check_on_invalid(on_invalid)
    batch_size = check_batch_size(batch_size)
    limit = check_max_invalid(max_invalid, on_invalid)
    budget = job_budget.budget_of(job_budget.partition_limit(handle, limit, max_invalid_scope))
    handle = handle.for_task()  # one version for the whole partition
    buckets = bucketing.checked(handle, buckets)
    signature = handle.predictor.signature  # this process's model's (input names)
    buffer: list[Any] = []
    position = 0
    for row in rows:
        buffer.append(row)
        if len(buffer) >= batch_size:
            yield from _score_rows(handle, signature, buffer, position, batch_size, on_invalid,
                                   budget, id_col, buckets)
            position += len(buffer)
            buffer = []
    if buffer:
        yield from _score_rows(handle, signature, buffer, position, batch_size, on_invalid,
                               budget, id_col, buckets)
    budget.finish()


def _without_id(row: Any, id_col: str, index: int, lenient: bool) -> tuple[Any, Any]:
    """``row``'s ``id_col`` value, and the row without it: its one other value, or a
    tuple (a dict, for a dict row) of the others. A row without that field is refused,
    or, when ``lenient`` (``on_invalid="null"``: one row must not cost the others), kept
    whole with a null id (it is then named by its number)."""
    if isinstance(row, dict):
        fields = row
    elif hasattr(row, "asDict"):  # a pyspark Row
        fields = row.asDict()
    elif lenient:
        return None, row
    else:
        raise ModelInputError(f"id_col={id_col!r}: row {index} of this partition is a "
                              f"{type(row).__name__}, not a Row or dict with that field")
    if id_col not in fields and not lenient:
        raise ModelInputError(f"id_col={id_col!r}: row {index} of this partition has no such "
                              f"field; it has {list(fields)}")
    rest = {k: v for k, v in fields.items() if k != id_col}
    if isinstance(row, dict):
        return fields.get(id_col), rest
    values = tuple(rest.values())
    return fields.get(id_col), values[0] if len(values) == 1 else values


def _score_rows(handle: ModelHandle, signature: Any, rows: list[Any], first_row: int,
                batch_size: int, on_invalid: str, budget: InvalidBudget,
                id_col: str | None = None, buckets: Buckets = None) -> Iterator[Any]:
    ids = None
    if id_col is not None:
        lenient = on_invalid == "null"
        split = [_without_id(row, id_col, first_row + i, lenient) for i, row in enumerate(rows)]
        ids, rows = (id_col, [s[0] for s in split]), [s[1] for s in split]
    columns = columns_of_rows(rows) if handle.preprocess is not None \
        else cols.from_rows(rows, signature, first_row)
    scored = score(handle, columns, batch_size=batch_size, on_invalid=on_invalid,
                   where="partition", first_row=first_row, reasons=budget.active, ids=ids,
                   buckets=buckets)
    budget.add(scored)
    yield from to_rows(scored)
