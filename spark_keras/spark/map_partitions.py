"""The ``mapPartitions`` front-end (``rdd.mapPartitions(bm.predict_partition)``): a
partition's Python rows scored in batches, one prediction per row, in order."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from spark_keras.errors import ModelInputError
from spark_keras.handle import ModelHandle
from spark_keras.inference import buckets as bucketing
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import score
from spark_keras.inference.limits import InvalidBudget
from spark_keras.inference.options import Buckets, check_batch_size, check_max_invalid, check_on_invalid
from spark_keras.inference.outputs import to_rows
from spark_keras.inference.preprocess import columns_of_rows
from spark_keras.spark import job_budget


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
