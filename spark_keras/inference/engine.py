"""The scoring engine every front-end uses: columns in (:mod:`.columns`), one read per
column (:mod:`.walk`), the ``on_invalid`` rule applied once, the compiled model call in
batches (:mod:`.predictor`), and the outputs with the mask of invalid rows
(:class:`Scored`, shaped by :mod:`.outputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spark_keras.errors import ModelCallError, ModelInputError
from spark_keras.inference.column_read import ColumnRead, kind, leaf_kind
from spark_keras.inference.columns import Columns, assign, flat
from spark_keras.inference.isolation import RowFailure, columns_text, reason, reason_class, reason_text
from spark_keras.inference.options import Buckets, check_on_invalid
from spark_keras.inference.rows import RowNames
from spark_keras.inference.specs import Signature, TensorSpec, empty_outputs
from spark_keras.inference.walk import read_column


@dataclass(frozen=True)
class Scored:
    """A batch's predictions: ``outputs`` (flat, signature order) for the valid rows only;
    ``invalid`` marks the rows left out (None: every row was scored); ``reasons``, when
    asked for, says why, and ``classes`` the class of each reason (``"input: NaN"``,
    ``"model: InvalidArgumentError"``: what is wrong, without where, to count by)."""

    signature: Signature
    outputs: list[np.ndarray]
    invalid: np.ndarray | None
    # when asked for: why each row of ``invalid`` was left out (an object array of
    # texts, None for scored rows); None when every row was scored
    reasons: np.ndarray | None = None
    classes: np.ndarray | None = None  # made with ``reasons``, alike

    @property
    def rows(self) -> int:
        return len(self.invalid) if self.invalid is not None else len(self.outputs[0])


def model_inputs(columns: Columns, signature: Signature, on_invalid: str = "error", *,
                 where: str = "batch", first_row: int = 0, resize: str | None = None
                 ) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The model's inputs from ``columns``, and the mask of invalid rows.

    With ``on_invalid="error"`` an invalid row raises :class:`ModelInputError` naming the
    column, the row (numbered from ``first_row`` within ``where``) and what is wrong; with
    ``"null"`` invalid rows are left out of the inputs and marked in the mask. ``resize``:
    how images of another size than an input's are resized (:mod:`.images`).
    """
    inputs, invalid, _ = _model_inputs(columns, signature, on_invalid,
                                       RowNames.of(where, first_row), False, resize)
    return [np.asarray(x) for x in inputs], invalid  # (image rows are made when sliced)


def check_inputs(columns: Columns, signature: Signature, resize: str | None = None) -> None:
    """Refuse, with the :class:`ModelInputError` a batch would raise, columns the model
    cannot take whatever their rows hold: a count of columns its inputs cannot take, a
    kind of value (string, number, image, vector) its input dtypes cannot, a width the
    types fix. ``columns`` are empty arrays of the columns' types (a DataFrame's schema
    seen on the driver): the very checks each batch makes, on no rows."""
    _model_inputs(columns, signature, "error", RowNames(), False, resize)


def _model_inputs(columns: Columns, signature: Signature, on_invalid: str, names: RowNames,
                  reasons: bool, resize: str | None = None
                  ) -> tuple[list[np.ndarray], np.ndarray | None,
                             tuple[np.ndarray, np.ndarray] | None]:
    """:func:`model_inputs`, and with ``reasons`` why each invalid row is and the class
    of that reason (see :func:`invalid_reasons`)."""
    check_on_invalid(on_invalid)
    reads = [_read(spec, cols, resize) for spec, cols in assign(columns, signature)]
    invalid = None
    for group in reads:
        for r in group:
            bad = r.invalid
            if bad is None:
                continue
            if on_invalid == "error":
                raise r.error(names)
            invalid = bad if invalid is None else invalid | bad
    keep = None if invalid is None else ~invalid
    inputs = [_values(group, spec, keep) for group, spec in zip(reads, signature.inputs)]
    why = invalid_reasons(reads, invalid, names) if reasons else None
    return inputs, invalid, why


def invalid_reasons(reads: list[list[ColumnRead]], invalid: np.ndarray | None,
                    names: RowNames | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row, why it is invalid: the error ``on_invalid="error"`` would raise for it
    (its first column at fault, in input order, and that column's first problem with
    it), without the count and the hint; None for valid rows. And the class of each
    (``"input: NaN"``, :meth:`ColumnRead.reason_class`). Texts are made for the invalid
    rows only; None when there are none."""
    if invalid is None:
        return None
    names = names or RowNames()
    out = np.full(len(invalid), None, dtype=object)
    classes = np.full(len(invalid), None, dtype=object)
    todo = invalid.copy()
    for group in reads:
        for r in group:
            bad = r.invalid
            if bad is None:
                continue
            for row in np.flatnonzero(bad & todo):
                out[row] = r.reason(int(row), names)
                classes[row] = r.reason_class(int(row))
            todo &= ~bad
    return out, classes


def _read(spec: TensorSpec, cols: list, resize: str | None = None) -> list[ColumnRead]:
    if len(cols) == 1:
        return [read_column(cols[0].name, cols[0].array, spec, cols[0].parts, resize)]
    if len(cols) != spec.size:
        raise ModelInputError(
            f"{len(cols)} columns {[c.name for c in cols]} given for the model input "
            f"{spec.name!r}; it expects {spec.describe()}, i.e. {spec.size} scalar columns")
    scalar = TensorSpec(spec.name, (), spec.dtype)
    for c in cols:
        if kind(c.array.type) != leaf_kind(spec):
            what = "string" if leaf_kind(spec) == "string" else "number"
            raise ModelInputError(
                f"column {c.name!r} has type {c.array.type}; stacking {len(cols)} columns as the "
                f"features of input {spec.name!r} needs one {what} per column")
    return [read_column(c.name, c.array, scalar) for c in cols]


def _values(group: list[ColumnRead], spec: TensorSpec, keep: np.ndarray | None) -> np.ndarray:
    if len(group) == 1:
        return group[0].values(keep)
    rows = group[0].n if keep is None else int(keep.sum())
    stacked = np.empty((rows, len(group)), dtype=object if leaf_kind(spec) == "string" else spec.dtype)
    for j, r in enumerate(group):
        stacked[:, j] = r.values(keep)
    return stacked.reshape((rows, *spec.known_shape))


def score(handle: Any, columns: Columns, *, batch_size: int, on_invalid: str = "error",
          where: str = "batch", first_row: int = 0, reasons: bool = False,
          ids: tuple[str, Any] | None = None, buckets: Buckets = None,
          positions: np.ndarray | None = None) -> Scored:
    """Predictions of ``handle``'s model (a :class:`~spark_keras.handle.ModelHandle`, or
    anything with ``predictor`` and ``signature``) for ``columns``, made into the model's
    inputs by the handle's ``preprocess`` function first if it has one. An empty batch, or
    one where every row is invalid, gives empty outputs of the output specs' dtypes.
    ``reasons``: also say why each invalid row is (``Scored.reasons``). Errors and reasons
    name a row by ``ids`` (``(id column name, one value per row)``) if given, else by its
    number from ``first_row`` within ``where`` (``positions``: the rows' numbers in the
    batch they were taken from, when they are some of its rows). ``buckets`` (checked by
    :func:`.buckets.checked`): variable-length rows padded into buckets (:mod:`.buckets`).

    A model or preprocess call that raises is retried in parts to find the rows it raises
    on alone (:mod:`.isolation`; clean batches are never retried): under ``"null"`` those
    rows are invalid too (reason ``"model: <Error>: <message>"``), under ``"error"`` the
    first of them raises :class:`ModelCallError` (or :class:`PreprocessError`) naming it."""
    predictor = handle.predictor
    signature = predictor.signature
    names_of = RowNames.of(where, first_row, ids, positions)
    preprocess = getattr(handle, "preprocess", None)
    n, names = _rows_and_names(columns)
    failed: dict[int, tuple[str, str]] = {}  # batch row -> why a call raised on it, its class
    if preprocess is not None and not n:  # no rows to preprocess: none to score (a function
        return Scored(signature, empty_outputs(signature), None)  # may raise on 0, or make 0-wide)
    if preprocess is not None:
        found: dict[int, BaseException] | None = {} if on_invalid == "null" else None
        columns = preprocess.apply(columns, signature, names_of, failures=found)
        failed.update({row: (reason("preprocess", exc), reason_class("preprocess", exc))
                       for row, exc in (found or {}).items()})
        if n and len(failed) == n:  # nothing left to read
            return _with_failures(Scored(signature, empty_outputs(signature), None), failed,
                                  n, reasons)
    inputs, invalid, why = _model_inputs(columns, signature, on_invalid, names_of, reasons,
                                         getattr(handle, "resize", None))
    outputs = empty_outputs(signature)
    if len(inputs[0]):
        rows = np.arange(n) if invalid is None else np.flatnonzero(~invalid)  # of the inputs
        found = {} if on_invalid == "null" else None
        try:
            outputs = predictor(inputs, batch_size, found, buckets=buckets)
        except RowFailure as failure:
            raise ModelCallError(
                f"the model raised on {names_of.at(int(rows[failure.row]))} "
                f"({columns_text(names)}): {reason_text(failure.cause)}"
            ) from failure.cause
        if found:
            ok = np.ones(len(rows), dtype=bool)
            ok[list(found)] = False
            outputs = [o[ok] for o in outputs]
            failed.update({int(rows[k]): (reason("model", exc), reason_class("model", exc))
                           for k, exc in found.items()})
    scored = Scored(signature, outputs, invalid, *(why or (None, None)))
    return _with_failures(scored, failed, n, reasons) if failed else scored


def _with_failures(scored: Scored, failed: dict[int, tuple[str, str]], n: int,
                   reasons: bool) -> Scored:
    """``scored`` with the ``failed`` rows (batch row -> reason and its class) marked
    invalid too."""
    invalid = np.zeros(n, dtype=bool) if scored.invalid is None else scored.invalid.copy()
    invalid[list(failed)] = True
    if not reasons:
        return Scored(scored.signature, scored.outputs, invalid)
    why, classes = (np.full(n, None, dtype=object) if a is None else a.copy()
                    for a in (scored.reasons, scored.classes))
    for row, (text, of_class) in failed.items():
        why[row], classes[row] = text, of_class
    return Scored(scored.signature, scored.outputs, invalid, why, classes)


def _rows_and_names(columns: Columns) -> tuple[int, list[str]]:
    """How many rows ``columns`` have, and their names (for errors)."""
    every = flat(columns)
    return (len(every[0].array) if every else 0), [c.name for c in every]
