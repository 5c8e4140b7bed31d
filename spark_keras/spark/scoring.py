"""One task's batches of Arrow columns through the scoring engine
(:mod:`spark_keras.inference.engine`) into the result columns the Spark front-ends return
(:mod:`.udf`, :mod:`.transform`, :mod:`.keyed`): the prediction, the reasons, the version's
label and the hidden figures columns, the task's invalid rows held against its budget."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa

from spark_keras.handle import ModelHandle
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import Scored, score
from spark_keras.inference.limits import InvalidBudget
from spark_keras.inference.options import Buckets
from spark_keras.inference.outputs import to_arrow
from spark_keras.spark import figures as build_figures
from spark_keras.spark import job_budget
from spark_keras.spark.job_budget import MaxInvalid


def scored_columns(handle: ModelHandle, names: list[str],
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


def _reasons(scored: Scored) -> pa.Array:
    """Why each row was not scored (null for scored rows), as an Arrow string column."""
    if scored.reasons is None:
        return pa.nulls(scored.rows, pa.string())
    return pa.array(scored.reasons, type=pa.string())
