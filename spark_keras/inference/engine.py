"""The scoring engine every front-end uses: columns in (:mod:`.columns`), one read per
column (:mod:`.walk`), the ``on_invalid`` rule applied once, the compiled model call in
batches (:mod:`.predictor`), and the outputs with the mask of invalid rows
(:class:`Scored`, shaped by :mod:`.outputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError, ModelInputError
from .column_read import ColumnRead, kind, leaf_kind
from .columns import Columns, assign
from .specs import Signature, TensorSpec, empty_outputs
from .walk import read_column

ON_INVALID = ("error", "null")


def check_on_invalid(on_invalid: str) -> None:
    """Refuse an unknown bad-row policy up front (on the driver, not in a task)."""
    if on_invalid not in ON_INVALID:
        raise ArgumentError(f"on_invalid must be one of {ON_INVALID}, not {on_invalid!r}")


def check_batch_size(batch_size: Any) -> int:
    """``batch_size`` as a positive int, or an :class:`ArgumentError`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ArgumentError(f"batch_size must be a positive integer, not {batch_size!r}")
    return int(batch_size)


@dataclass(frozen=True)
class Scored:
    """A batch's predictions: ``outputs`` (flat, signature order) for the valid rows only;
    ``invalid`` marks the rows left out (None: every row was scored); ``reasons``, when
    asked for, says why."""

    signature: Signature
    outputs: list[np.ndarray]
    invalid: np.ndarray | None
    # when asked for: why each row of ``invalid`` was left out (an object array of
    # texts, None for scored rows); None when every row was scored
    reasons: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.invalid) if self.invalid is not None else len(self.outputs[0])


def model_inputs(columns: Columns, signature: Signature, on_invalid: str = "error", *,
                 where: str = "batch", first_row: int = 0
                 ) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The model's inputs from ``columns``, and the mask of invalid rows.

    With ``on_invalid="error"`` an invalid row raises :class:`ModelInputError` naming the
    column, the row (numbered from ``first_row`` within ``where``) and what is wrong; with
    ``"null"`` invalid rows are left out of the inputs and marked in the mask.
    """
    inputs, invalid, _ = _model_inputs(columns, signature, on_invalid, where, first_row, False)
    return inputs, invalid


def _model_inputs(columns: Columns, signature: Signature, on_invalid: str, where: str,
                  first_row: int, reasons: bool
                  ) -> tuple[list[np.ndarray], np.ndarray | None, np.ndarray | None]:
    """:func:`model_inputs`, and with ``reasons`` why each invalid row is (see
    :func:`invalid_reasons`)."""
    check_on_invalid(on_invalid)
    reads = [_read(spec, cols) for spec, cols in assign(columns, signature)]
    invalid = None
    for group in reads:
        for r in group:
            bad = r.invalid
            if bad is None:
                continue
            if on_invalid == "error":
                raise r.error(where, first_row)
            invalid = bad if invalid is None else invalid | bad
    keep = None if invalid is None else ~invalid
    inputs = [_values(group, spec, keep) for group, spec in zip(reads, signature.inputs)]
    why = invalid_reasons(reads, invalid, where, first_row) if reasons else None
    return inputs, invalid, why


def invalid_reasons(reads: list[list[ColumnRead]], invalid: np.ndarray | None,
                    where: str = "batch", first_row: int = 0) -> np.ndarray | None:
    """Per row, why it is invalid: the error ``on_invalid="error"`` would raise for it
    (its first column at fault, in input order, and that column's first problem with
    it), without the count and the hint; None for valid rows. Texts are made for the
    invalid rows only; None when there are none."""
    if invalid is None:
        return None
    out = np.full(len(invalid), None, dtype=object)
    todo = invalid.copy()
    for group in reads:
        for r in group:
            bad = r.invalid
            if bad is None:
                continue
            for row in np.flatnonzero(bad & todo):
                out[row] = r.reason(int(row), where, first_row)
            todo &= ~bad
    return out


def _read(spec: TensorSpec, cols: list) -> list[ColumnRead]:
    if len(cols) == 1:
        return [read_column(cols[0].name, cols[0].array, spec, cols[0].parts)]
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
    return stacked.reshape((rows, *spec.shape))


def score(handle: Any, columns: Columns, *, batch_size: int, on_invalid: str = "error",
          where: str = "batch", first_row: int = 0, reasons: bool = False) -> Scored:
    """Predictions of ``handle``'s model (a :class:`~spark_keras.handle.ModelHandle`, or
    anything with ``predictor`` and ``signature``) for ``columns``, made into the model's
    inputs by the handle's ``preprocess`` function first if it has one. An empty batch, or
    one where every row is invalid, gives empty outputs of the output specs' dtypes.
    ``reasons``: also say why each invalid row is (``Scored.reasons``)."""
    predictor = handle.predictor
    signature = predictor.signature
    preprocess = getattr(handle, "preprocess", None)
    if preprocess is not None:
        columns = preprocess.apply(columns, signature, where=where, first_row=first_row)
    inputs, invalid, why = _model_inputs(columns, signature, on_invalid, where, first_row,
                                         reasons)
    outputs = predictor(inputs, batch_size) if len(inputs[0]) else empty_outputs(signature)
    return Scored(signature, outputs, invalid, why)
