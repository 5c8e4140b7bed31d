"""One pass over one Arrow input column: which rows are invalid and, for the others, the
values of one model input, without per-row Python objects (a :class:`.ColumnRead`).

A row is invalid when it is null, holds a null at any nesting level, has the wrong number
of values at some level, or holds NaN/infinity. Column-level problems (a string column, a
scalar column for a vector input) are not row problems: they raise at once.

Accepted columns: numbers; (nested) lists or fixed-size lists of numbers, of the input's
shape or flattened at the innermost level; ``pyspark.ml.linalg`` Vectors in their Arrow
form (struct of type/size/indices/values), dense or sparse; images of Spark's image data
source, read by :mod:`.images`; image files' bytes (a binary column for an image input),
decoded by :mod:`.image_files` (:func:`read_column` takes every kind).
"""

from __future__ import annotations

import math
from typing import Callable, cast

import numpy as np
import pyarrow as pa

from spark_keras.errors import ModelInputError
from spark_keras.inference.column_read import (
    NAN,
    NULL,
    SHAPE,
    ColumnRead,
    Problem,
    any_in,
    describe_nonfinite,
    kind,
    leaf_kind,
    nonfinite_mask,
    null_rows,
    nulls,
)
from spark_keras.inference.image_files import is_image_files, read_image_files
from spark_keras.inference.images import read_images
from spark_keras.inference.specs import TensorSpec


def _level_widths(depth: int, shape: tuple[int, ...]) -> list[int]:
    """Expected list length at each nesting level: the input's dimensions, the innermost
    level holding all remaining ones (a flat array for an image input is fine)."""
    widths = []
    for level in range(depth):
        if level == depth - 1:
            widths.append(int(np.prod(shape[level:], dtype=np.int64)))
        else:
            widths.append(shape[level] if level < len(shape) else 1)
    return widths


def _depth(t: pa.DataType) -> int:
    depth = 0
    while kind(t) == "list":
        t, depth = t.value_type, depth + 1
    return depth


def not_numbers(name: str, t: pa.DataType, spec: TensorSpec) -> ModelInputError:
    """The error for a column whose values are not of the kind the input takes (text
    for a numeric input, numbers for a string input...)."""
    leaf, what = t, "has type"
    while kind(leaf) == "list":
        leaf, what = leaf.value_type, "holds arrays of"
    wanted = "strings or bytes" if leaf_kind(spec) == "string" else "numbers"
    return ModelInputError(
        f"column {name!r} {what} {leaf if what != 'has type' else t}; the model input "
        f"{spec.name!r} expects {wanted} ({spec.describe()} per row)")


def read_column(name: str, arr: pa.Array, spec: TensorSpec,
                parts: tuple[str, ...] = (), resize: str | None = None) -> ColumnRead:
    """Read ``arr`` (any accepted kind) as rows of the model input ``spec``; ``parts``:
    the scalar columns ``arr`` stands for, if it is a block of them; ``resize``: how
    images of another size are resized (:mod:`.images`)."""
    read = _read_column(name, arr, spec, resize)
    read.parts = parts
    return read


def _read_column(name: str, arr: pa.Array, spec: TensorSpec,
                 resize: str | None = None) -> ColumnRead:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = _typed(arr, spec)
    k = kind(arr.type)
    if k == "image":
        return read_images(name, arr, spec, resize)
    if is_image_files(arr, spec):
        return read_image_files(name, arr, spec, resize)
    if k == "vector":
        if leaf_kind(spec) != "number":
            raise not_numbers(name, arr.type.field("values").type, spec)
        return _read_vectors(name, arr, spec)
    depth = _depth(arr.type)
    leaf_type = arr.type
    for _ in range(depth):
        leaf_type = leaf_type.value_type
    if kind(leaf_type) != leaf_kind(spec):
        raise not_numbers(name, arr.type, spec)
    if spec.variable:
        return _read_ragged(name, arr, spec, depth)
    if depth == 0 and spec.size != 1:
        raise ModelInputError(
            f"column {name!r}: each row holds 1 value (a {arr.type} column); the model input "
            f"{spec.name!r} expects {spec.describe()} ({spec.size} values) per row: pass an "
            f"array column, or {spec.size} scalar columns")
    n = len(arr)
    problems = null_rows(arr)
    if depth == 0:
        return _read_numbers(name, arr, spec, problems)
    lo = np.arange(n, dtype=np.int64)
    hi = lo + 1
    widths = _level_widths(depth, spec.known_shape)
    contiguous = True
    for level, width in enumerate(widths):
        offsets = _offsets(arr)
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
            lengths = None if size == width else np.full(len(arr), size)
        else:
            lengths = np.diff(offsets)
            lengths = lengths if (lengths != width).any() else None
        if lengths is not None:
            problems.append(_width_problem(lengths != width, lengths, lo, hi, level, depth,
                                           width, n))
            contiguous = False
        arr, lo, hi = _step_down(arr, offsets, lo, hi, problems)
    leaf, first = _read_leaf(arr, lo, hi, problems)
    starts = None if contiguous else lo - first
    return ColumnRead(name, spec, n, leaf, starts, [p for p in problems if p.rows.any()])


def _typed(arr: pa.Array, spec: TensorSpec) -> pa.Array:
    """``arr``, or if its values are of Arrow's null type (none to tell a type by: a
    pandas column of None, of empty arrays or of no row) as values of the input's kind
    (text or numbers), nested as deep as the input or the column: rows of no value."""
    depth, leaf = 0, arr.type
    while kind(leaf) == "list":
        leaf, depth = leaf.value_type, depth + 1
    if not pa.types.is_null(leaf):
        return arr
    typed: pa.DataType = pa.string() if leaf_kind(spec) == "string" else pa.float32()
    for _ in range(max(depth, len(spec.shape))):
        typed = pa.list_(typed)
    return arr.cast(typed)


def _not_rectangular(level: int) -> Callable[[int, str], str]:
    return lambda r, at: (f"ragged arrays: {at} is not rectangular (arrays of different "
                          f"lengths at nesting level {level})")


def _wrong_length(level: int, row_len: np.ndarray, takes: str) -> Callable[[int, str], str]:
    return lambda r, at: (f"{at} has {int(row_len[r])} values at nesting level {level} where "
                          f"the model input takes {takes}")


def _read_ragged(name: str, arr: pa.Array, spec: TensorSpec, depth: int) -> ColumnRead:
    """A list column for an input with unknown dimensions (``None`` in ``spec.shape``):
    each row's own shape, read level by level. A row must be rectangular (the arrays of
    one nesting level all of one length), have the known dimensions and no empty one;
    its innermost level may hold the remaining dimensions flattened when at most one of
    them is unknown."""
    shape = spec.shape
    if depth == 0 or depth > len(shape) or sum(d is None for d in shape[depth - 1:]) > 1:
        raise ModelInputError(
            f"column {name!r} ({arr.type}) cannot give rows of the model input {spec.name!r}, "
            f"{spec.describe()}: give each unknown dimension its own level of nested arrays")
    n = len(arr)
    problems = null_rows(arr)
    dims = np.zeros((n, len(shape)), dtype=np.int64)
    lo = np.arange(n, dtype=np.int64)
    hi = lo + 1
    for level in range(depth):
        dims_here = shape[level:] if level == depth - 1 else shape[level:level + 1]
        row_len, uneven = _row_lengths(arr, lo, hi)
        if level:
            problems.append(Problem(uneven, _not_rectangular(level), SHAPE))
        known = math.prod(d for d in dims_here if d is not None)
        takes = str(known) if None not in dims_here else \
            "a non-empty array" if known == 1 else f"a non-empty multiple of {known}"
        if None in dims_here:
            wrong = (row_len == 0) | (row_len % known != 0)
            free = row_len // known
            for j, d in enumerate(dims_here):
                dims[:, level + j] = free if d is None else d
        else:
            wrong = row_len != known
            dims[:, level:level + len(dims_here)] = cast("tuple[int, ...]", dims_here)  # no None
        problems.append(Problem(wrong & ~uneven, _wrong_length(level, row_len, takes), SHAPE))
        arr, lo, hi = _step_down(arr, _offsets(arr), lo, hi, problems)
    leaf, first = _read_leaf(arr, lo, hi, problems)
    return ColumnRead(name, spec, n, leaf, lo - first, [p for p in problems if p.rows.any()],
                      shapes=dims)


def _offsets(arr: pa.Array) -> np.ndarray:
    """Where each array of a (fixed-size) list column starts in its values, and the end."""
    if pa.types.is_fixed_size_list(arr.type):
        return (arr.offset + np.arange(len(arr) + 1, dtype=np.int64)) * arr.type.list_size
    return arr.offsets.to_numpy().astype(np.int64, copy=False)


def _step_down(arr: pa.Array, offsets: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               problems: list[Problem]) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """One nesting level down: the values of ``arr`` and each row's range in them; rows
    with a null among those values are added to ``problems``."""
    lo, hi = offsets[lo], offsets[hi]
    arr = arr.values
    if arr.null_count:
        problems.append(Problem(any_in(nulls(arr), lo, hi),
                                 lambda r, at: f"null array element(s), first at {at}", NULL))
    return arr, lo, hi


def _read_leaf(arr: pa.Array, lo: np.ndarray, hi: np.ndarray,
               problems: list[Problem]) -> tuple[np.ndarray, int]:
    """The innermost values under rows whose values are ``arr[lo:hi]`` (a view of the Arrow
    buffer where it allows), and the index in ``arr`` of the first; rows holding NaN or
    infinity are added to ``problems``."""
    first = int(lo[0]) if len(lo) else 0
    leaf_arr = arr.slice(first, (int(hi[-1]) if len(hi) else 0) - first)
    leaf = leaf_arr.to_numpy(zero_copy_only=False)
    nonfinite = nonfinite_mask(leaf, leaf_arr)
    if nonfinite is not None:
        problems.append(Problem(any_in(nonfinite, lo - first, hi - first), describe_nonfinite,
                                NAN))
    return leaf, first


def _row_lengths(arr: pa.Array, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows whose arrays at this level are ``arr[lo:hi]``: the length of each row's
    first array (0 if it has none), and whether any of its others differs from it."""
    if pa.types.is_fixed_size_list(arr.type):
        lengths = np.full(len(arr), arr.type.list_size, dtype=np.int64)
    else:
        lengths = np.diff(arr.offsets.to_numpy().astype(np.int64, copy=False))
    counts = hi - lo
    n = len(lo)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    first = np.zeros(n, dtype=np.int64)
    has = counts > 0
    first[has] = lengths[lo[has]]
    start, end = int(lo[0]), int(hi[-1])
    differs = lengths[start:end] != np.repeat(first, counts)
    return first, any_in(differs, lo - start, hi - start)


def _read_numbers(name: str, arr: pa.Array, spec: TensorSpec,
                  problems: list[Problem]) -> ColumnRead:
    """A scalar column: one element per row, so row problems are element problems."""
    leaf = arr.to_numpy(zero_copy_only=False)
    nonfinite = nonfinite_mask(leaf, arr)
    if nonfinite is not None:
        problems.append(Problem(nonfinite, describe_nonfinite, NAN))
    return ColumnRead(name, spec, len(arr), leaf, None, [p for p in problems if p.rows.any()])


def _width_problem(wrong: np.ndarray, lengths: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                   level: int, depth: int, width: int, n: int) -> Problem:
    rows = any_in(wrong, lo, hi)
    uniform = rows.all() and depth == 1 and len(np.unique(lengths[lo])) == 1

    def describe(r: int, at: str) -> str:
        got = int(lengths[lo[r]:hi[r]][wrong[lo[r]:hi[r]]][0])
        if uniform:
            return f"each row holds {got} values"
        level_note = f" at nesting level {level}" if depth > 1 else ""
        return f"ragged arrays: {at} has {got} values{level_note} where {width} are expected"

    return Problem(rows, describe, SHAPE)


def _read_vectors(name: str, arr: pa.StructArray, spec: TensorSpec) -> ColumnRead:
    """ML Vectors (type 1 dense, type 0 sparse) as a dense matrix of ``spec.size`` features."""
    n, size = len(arr), spec.size
    fields = dict(zip((f.name for f in arr.type), arr.flatten()))  # offsets applied
    values = fields["values"]
    if kind(values.type) != "list" or kind(values.type.value_type) != "number":
        raise not_numbers(name, values.type, spec)
    problems = null_rows(arr)
    dense = fields["type"].fill_null(1).to_numpy(zero_copy_only=False) == 1
    if dense.all() and not arr.null_count:  # a list column in disguise: read it as one
        read = read_column(name, values, spec)
        if size is not None:
            read.column_note = f", i.e. {size} features"
        return read
    if size is None:
        raise ModelInputError(
            f"column {name!r}: ML Vectors, sparse or null ones among them, cannot give rows "
            f"of the model input {spec.name!r}, {spec.describe()} (unknown dimensions): pass "
            f"dense vectors or an array column")
    sizes = fields["size"].fill_null(size).to_numpy(zero_copy_only=False).astype(np.int64)
    v_off = values.offsets.to_numpy().astype(np.int64)
    lengths = np.diff(v_off)
    misshapen = np.where(dense, lengths, sizes) != size

    def describe_shape(r: int, at: str) -> str:
        what = f"has {int(lengths[r])} values" if dense[r] else f"has size {int(sizes[r])}"
        return f"the {'dense' if dense[r] else 'sparse'} vector at {at} {what}"

    problems.append(Problem(misshapen, describe_shape, SHAPE))
    rows = np.repeat(np.arange(n), lengths)
    position = np.arange(len(rows)) - np.repeat(v_off[:-1] - v_off[0], lengths)
    cols = position.copy()
    sparse_value = np.repeat(~dense, lengths)
    if sparse_value.any():
        indices = fields["indices"]
        i_off = indices.offsets.to_numpy().astype(np.int64)
        i_flat = indices.values.fill_null(-1).to_numpy(zero_copy_only=False)
        cols[sparse_value] = i_flat[(np.repeat(i_off[:-1], lengths) + position)[sparse_value]]
        outside = (cols < 0) | (cols >= size)
        problems.append(Problem(
            np.bincount(rows[outside], minlength=n).astype(bool),
            lambda r, at: f"the sparse vector at {at} has an index outside 0..{size - 1}",
            SHAPE))
    flat_values = values.values.slice(int(v_off[0]), int(v_off[-1] - v_off[0]))
    if flat_values.null_count:
        problems.append(Problem(np.bincount(rows[nulls(flat_values)], minlength=n).astype(bool),
                                 lambda r, at: f"null array element(s), first at {at}",
                                 NULL))
    got = flat_values.to_numpy(zero_copy_only=False)
    nonfinite = nonfinite_mask(got, flat_values)
    if nonfinite is not None:
        problems.append(Problem(np.bincount(rows[nonfinite], minlength=n).astype(bool),
                                 describe_nonfinite, NAN))
    problems = [p for p in problems if p.rows.any()]
    bad = np.zeros(n, dtype=bool)
    for p in problems:
        bad |= p.rows
    take = ~bad[rows]
    out = np.zeros((n, size), dtype=np.float64)
    out[rows[take], cols[take]] = got[take]
    return ColumnRead(name, spec, n, out.reshape(-1), None, problems,
                      column_note=f", i.e. {size} features")
