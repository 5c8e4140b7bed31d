"""Every row invalid (issue 55 item 5): almost never what a user wants (a model of 10
features given arrays of 32 values under ``--on-invalid null`` "scores" every row to null).
Without ``--max-invalid`` the job stops (exit 2) before it publishes anything (a plain run)
or before ``_SUCCESS`` (``--resume``), naming the rows' reasons; a ``--max-invalid`` that
lets them pass lets them, with a warning."""

from __future__ import annotations

import logging
from typing import Mapping

from spark_keras.errors import InvalidRowsError

__all__ = ["check_not_all_invalid"]

logger = logging.getLogger("spark_keras.jobs.score")


def _reasons(by_reason: Mapping[str, int]) -> str:
    """The classes of reason, the most rows first."""
    ranked = sorted(by_reason.items(), key=lambda item: (-int(item[1]), item[0]))
    return ", ".join(f"{reason!r} ({int(rows):,} row{'s' if int(rows) != 1 else ''})"
                     for reason, rows in ranked) \
        or "no reason recorded"


def check_not_all_invalid(rows: int, invalid: int, by_reason: Mapping[str, int],
                          max_invalid: float | None, what: str) -> None:
    """Raise :class:`InvalidRowsError` (exit 2) if every one of ``rows`` (> 0) was invalid
    and no ``max_invalid`` was given (``what``: what happens to the output then); warn if
    one let them pass."""
    if not rows or invalid < rows:
        return
    said = f"every row was invalid ({invalid:,} of {rows:,}): {_reasons(by_reason)}"
    if max_invalid is None:
        raise InvalidRowsError(f"{said}; {what}. Check --features against the model's inputs, "
                               f"or pass --max-invalid {rows} to write them anyway")
    logger.warning("%s (--max-invalid %g let them pass)", said, max_invalid)
