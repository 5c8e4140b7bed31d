"""The scoring options every front-end takes, each rule in one place: the batch size,
the bad-row policy (``on_invalid``), the reason column (``error_col``), the limit of
invalid rows (``max_invalid``) and the padding of variable-length rows (``buckets``).
``BroadcastModel``, ``KerasTransformer``, the score job, Dask and ``pool_predict`` check
them here, each with its own spelling of the names
(:class:`Spelling`), on the driver before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_keras.errors import ArgumentError

DEFAULT_BATCH_SIZE = 1024
ON_INVALID = ("error", "null")
# how images of another size than the model's input are resized: keras.utils.load_img's
# interpolation names (PIL's resampling filters)
RESIZE = ("nearest", "bilinear", "bicubic", "hamming", "box", "lanczos")


@dataclass(frozen=True)
class Spelling:
    """How a front-end names the options in its errors (Python keywords, ML Params or
    command-line flags)."""

    batch_size: str = "batch_size"
    on_invalid: str = "on_invalid"
    error_col: str = "error_col"
    max_invalid: str = "max_invalid"
    buckets: str = "buckets"
    flags: bool = False  # ``--on-invalid null`` rather than ``on_invalid='null'``

    def setting(self, name: str, value: Any) -> str:
        if not self.flags:
            return f"{name}={value!r}"
        return f"{name} {','.join(map(str, value)) if isinstance(value, tuple) else value}"


PYTHON = Spelling()
ML_PARAMS = Spelling("batchSize", "onInvalid", "errorCol", "maxInvalid", "buckets")
FLAGS = Spelling("--batch-size", "--on-invalid", "--error-col", "--max-invalid", "--buckets",
                 flags=True)

# what ``buckets`` may be: None, a count of lengths, or the lengths themselves
Buckets = int | tuple[int, ...] | None


def check_on_invalid(on_invalid: Any, spelling: Spelling = PYTHON) -> str:
    """Refuse an unknown bad-row policy up front (on the driver, not in a task)."""
    if on_invalid not in ON_INVALID:
        raise ArgumentError(f"{spelling.on_invalid} must be one of "
                            f"{', '.join(map(repr, ON_INVALID))}, not {on_invalid!r}")
    return on_invalid


def check_resize(resize: Any, spelling: str = "resize") -> str | None:
    """``resize``: None (images of another size are invalid rows) or one of :data:`RESIZE`."""
    if resize is not None and resize not in RESIZE:
        raise ArgumentError(f"{spelling} must be None or one of {', '.join(map(repr, RESIZE))}, "
                            f"not {resize!r}")
    return resize


def check_batch_size(batch_size: Any, spelling: Spelling = PYTHON) -> int:
    """``batch_size`` as a positive int, or an :class:`ArgumentError`."""
    import numpy as np

    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
            or batch_size < 1:
        raise ArgumentError(f"{spelling.batch_size} must be a positive integer, "
                            f"not {batch_size!r}")
    return int(batch_size)


def check_error_col(error_col: Any, on_invalid: str, spelling: Spelling = PYTHON) -> str | None:
    """``error_col`` (None, or a column name) given ``on_invalid``: a reason column needs
    ``on_invalid="null"`` (under ``"error"`` an invalid row fails the task instead)."""
    if error_col is None:
        return None
    if not isinstance(error_col, str) or not error_col:
        raise ArgumentError(f"{spelling.error_col} must be a non-empty column name, "
                            f"not {error_col!r}")
    _needs_null(spelling.setting(spelling.error_col, error_col), on_invalid, spelling,
                "an invalid row fails the task instead of getting a reason")
    return error_col


def check_max_invalid(max_invalid: Any, on_invalid: str,
                      spelling: Spelling = PYTHON) -> float | int | None:
    """``max_invalid`` as None, a count (an int >= 1) or a fraction (0 <= f < 1); it
    needs ``on_invalid="null"`` (under ``"error"`` the first invalid row fails the task)."""
    if max_invalid is None:
        return None
    import numpy as np

    numeric = isinstance(max_invalid, (int, float, np.integer, np.floating)) \
        and not isinstance(max_invalid, bool)
    value = float(max_invalid) if numeric else float("nan")
    if not value >= 0 or (value >= 1 and value != int(value)):
        raise ArgumentError(f"{spelling.max_invalid} must be a whole count (>= 1) or a "
                            f"fraction in [0, 1), not {max_invalid!r}")
    _needs_null(spelling.setting(spelling.max_invalid, max_invalid), on_invalid, spelling,
                "the first invalid row fails the task")
    return int(value) if value >= 1 else value


def check_buckets(buckets: Any, spelling: Spelling = PYTHON) -> Buckets:
    """``buckets``: None (rows of variable-length inputs grouped by exact shape), a count
    N >= 1 (each batch's rows padded into at most N lengths) or explicit bucket lengths (a
    strictly increasing sequence of positive ints), as an int or a tuple; see
    :mod:`.buckets`. Whether the model can take padded rows is :func:`.buckets.checked`'s."""
    import numpy as np

    def whole(value: Any) -> bool:
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)

    if buckets is None:
        return None
    if whole(buckets) and buckets >= 1:
        return int(buckets)
    if isinstance(buckets, (list, tuple, np.ndarray)) and len(buckets) \
            and all(whole(b) for b in buckets):
        lengths = tuple(int(b) for b in buckets)
        if lengths[0] >= 1 and all(a < b for a, b in zip(lengths, lengths[1:])):
            return lengths
    raise ArgumentError(f"{spelling.buckets} must be None, a count of lengths (an int >= 1) "
                        f"or bucket lengths (strictly increasing positive ints), not {buckets!r}")


def _needs_null(given: str, on_invalid: str, spelling: Spelling, otherwise: str) -> None:
    if on_invalid != "null":
        raise ArgumentError(f"{given} needs {spelling.setting(spelling.on_invalid, 'null')}: "
                            f"with {spelling.setting(spelling.on_invalid, on_invalid)} {otherwise}")
