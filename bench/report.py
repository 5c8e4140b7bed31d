"""Plain-text tables for benchmark rows."""

from __future__ import annotations


def table(rows: list[dict], floatfmt: str = "{:,.3f}") -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    cells = [[_fmt(r.get(c), floatfmt) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cols), sep, *(line(r) for r in cells)])


def _fmt(value, floatfmt: str) -> str:
    if isinstance(value, float):
        return floatfmt.format(value)
    return "" if value is None else str(value)
