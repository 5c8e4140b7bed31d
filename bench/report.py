"""Benchmark rows shown: plain-text tables, the scoring plot, and one section run alone
(``python -m bench.<section>``)."""

from __future__ import annotations

from typing import Callable


def targets_block(lines: list[str]) -> list[str]:
    """A docs section's list of targets, each marked met or not."""
    return ["Targets:", "", *(f"- {line}" for line in lines)]


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


def pick(rows: list[dict], workload: str, variant: str, method: str) -> dict | None:
    """The first row of ``workload`` (a prefix of its label), input ``variant`` and ``method``."""
    return next((r for r in rows if r["workload"].startswith(workload) and r["input"] == variant
                 and r["method"] == method), None)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["workload"], r["input"]) for r in rows}, key=lambda g: (g[0], g[1]))
    methods = [m for m in dict.fromkeys(r["method"] for r in rows)]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 4.6), squeeze=False)
    for ax, (workload, variant) in zip(axes[0], groups):
        values = [(pick(rows, workload.split(" ")[0], variant, m) or {}).get("rows/s", 0) for m in methods]
        colors = ["#c44" if "predict_batch" in m or "closure" in m else
                  "#36c" if "BroadcastModel" in m else "#999" for m in methods]
        ax.barh(range(len(methods)), values, color=colors)
        ax.set_yticks(range(len(methods)), methods if ax is axes[0][0] else [""] * len(methods), fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_title(f"{workload}\ninput: {variant}", fontsize=9)
        ax.set_xlabel("rows/s (log)")
    fig.suptitle("Scoring on local[2]: blue spark_keras, red the usual ways, grey references", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section_main(prog: str, heading: str, run: Callable[[bool, int], list[dict]], floatfmt: str,
                 argv: list[str] | None = None) -> int:
    """``python -m bench.<section>``: one section alone, ``--quick`` and ``--repeats``
    passed to ``run(quick, repeats)``, its table printed under ``heading``."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"\n{heading}, local[2], {os.cpu_count()} cores\n")
    print(table(run(args.quick, args.repeats), floatfmt=floatfmt))
    return 0
