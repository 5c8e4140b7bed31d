"""The UDF front-end (``bm.predict_udf()``): a callable giving a Column scored by an
iterator ``arrow_udf`` (PySpark >= 4.1) or, before, a pandas UDF; :func:`arrow_udf_of`
also serves :mod:`.transform` and :mod:`.keyed`."""

from __future__ import annotations

import functools
from typing import Any, Iterator, Tuple, Union

import pyarrow as pa

from spark_keras.errors import ModelInputError
from spark_keras.handle import ModelHandle
from spark_keras.inference import buckets as bucketing
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import score
from spark_keras.inference.options import check_batch_size, check_max_invalid, check_on_invalid
from spark_keras.inference.outputs import to_arrow
from spark_keras.spark import job_budget
from spark_keras.spark.job_budget import MaxInvalid
from spark_keras.spark.scoring import scored_columns
from spark_keras.spark.types import prediction_type, spark_type


def column_name(col: Any) -> str:
    """The name of a column given by name or as a ``Column`` (``Column<'features'>``)."""
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

        names = [column_name(c) for c in columns]
        # each column made is a budget of its own
        max_invalid = job_budget.limit_for(self.handle, self.max_invalid, self.max_invalid_scope)
        score_batches = functools.partial(scored_columns, self.handle, names,
                                          batch_size=self.batch_size, on_invalid=self.on_invalid,
                                          reasons=False, figures=False,
                                          max_invalid=max_invalid, buckets=self.buckets)
        udf = arrow_udf_of(score_batches, len(names), [StructField("prediction", self.returnType)])
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


def arrow_udf_of(score_batches: Any, n_inputs: int, fields: list) -> Any:
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
