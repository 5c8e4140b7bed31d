"""The plots of docs/benchmarks.md, drawn from the figures recorded in it (its tables), into
docs/img/: scoring throughput against ``predict_batch_udf`` and the ceiling, and the
memory N Python workers of one executor add. `make bench` draws them after each run
(``bench.docs.write_docs``); ``python -m bench.plots`` draws them again from the file."""

from __future__ import annotations

import os
import sys

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
SCORING = "## Scoring throughput on local[2]"
MEMORY = "## Memory: N Python workers holding one model"
# the site's pictures: file name -> (section heading, alt text)
PLOTS = {
    "scoring-vs-ceiling.png": (SCORING, "transform and predict_udf against predict_batch_udf and the ceiling"),
    "memory-per-executor.png": (MEMORY, "memory of N workers: a copy per worker vs one shared file"),
}
# the bars of the scoring plot, in order: (method in the table, label, colour)
METHODS = [("predict_batch_udf", "predict_batch_udf", "#c44"),
           ("BroadcastModel.transform", "BroadcastModel.transform", "#36c"),
           ("BroadcastModel.predict_udf", "BroadcastModel.predict_udf", "#7ad")]


def section_table(text: str, heading: str) -> list[dict[str, str]]:
    """The first table under ``heading`` in a benchmarks file: a dict per row, by column."""
    start = text.find(heading + "\n")
    if start < 0:
        raise ValueError(f"no section {heading!r} in the benchmarks file")
    end = text.find("\n## ", start + len(heading))
    lines = [line for line in text[start:end if end > 0 else None].splitlines()
             if line.startswith("|")]
    if len(lines) < 3:
        raise ValueError(f"no table in the section {heading!r}")

    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip()[1:-1].split("|")]

    columns = cells(lines[0])
    return [dict(zip(columns, cells(line))) for line in lines[2:]]


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


def scoring_plot(rows: list[dict[str, str]], path: str) -> None:
    """Per workload and input, rows/s over the ceiling (the model alone and Spark's row
    transfer together): ``predict_batch_udf``, ``transform`` and ``predict_udf``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((r["workload"], r["input"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.75 * len(groups)))
    height = 0.8 / len(METHODS)
    top = 1.0
    for k, (method, label, colour) in enumerate(METHODS):
        values = []
        for workload, variant in groups:
            row = next((r for r in rows if (r["workload"], r["input"], r["method"])
                        == (workload, variant, method)), None)
            values.append(_number(row["x ceiling"]) if row else 0.0)
        top = max(top, *values)
        ys = [i + (k - 1) * height for i in range(len(groups))]
        bars = ax.barh(ys, values, height=height, color=colour, label=label)
        ax.bar_label(bars, labels=[f"{v:.2f}x" for v in values], fontsize=7, padding=2)
    ax.axvline(1.0, color="#333", linestyle="--", linewidth=1, label="the ceiling")
    ax.set_yticks(range(len(groups)), [f"{w.split(' (')[0]}, {v}" for w, v in groups], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("rows/s as a share of the ceiling (1/(1/raw model + 1/identity mapInArrow))")
    ax.set_xlim(0, top * 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Scoring on local[2]: spark_keras vs predict_batch_udf vs the ceiling", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def memory_plot(rows: list[dict[str, str]], path: str) -> None:
    """The memory N workers of one executor add holding one model (the sum of their PSS
    growths), a copy of the weights per worker against one shared file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for mode, colour, below in (("copy per worker", "#c44", False), ("shared file", "#36c", True)):
        points = [(int(r["workers"]), _number(r["sum PSS growth MB"])) for r in rows if r["mode"] == mode]
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, label=mode)
        for workers, mb in points:
            ax.annotate(f"{mb:,.0f}", (workers, mb), textcoords="offset points",
                        xytext=(4, -12 if below else 4), fontsize=7)
    weights = _number(rows[0]["weights MB"])
    ax.axhline(weights, color="#333", linestyle="--", linewidth=1, label=f"the weights ({weights:,.0f} MB)")
    ax.set_xticks(sorted({int(r["workers"]) for r in rows}))
    ax.set_xlabel("Python workers of the executor holding the model")
    ax.set_ylabel("memory added, MB (sum of PSS growths)")
    ax.set_ylim(0, None)
    ax.legend(fontsize=8)
    ax.set_title("Memory per executor: one model in N workers", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def render(benchmarks: str | None = None, out: str | None = None) -> list[str]:
    """Draw every plot from the figures of ``benchmarks`` (docs/benchmarks.md) into ``out``
    (docs/img); a section not in the file, or without its table, is skipped. The paths drawn."""
    benchmarks = benchmarks or os.path.join(DOCS, "benchmarks.md")
    out = out or os.path.join(os.path.dirname(benchmarks), "img")
    with open(benchmarks, encoding="utf-8") as f:
        text = f.read()
    os.makedirs(out, exist_ok=True)
    drawn = []
    for name, (heading, _) in PLOTS.items():
        if heading + "\n" not in text:
            continue
        try:
            rows = section_table(text, heading)
        except ValueError:  # the section holds no table (yet): nothing to draw
            continue
        path = os.path.join(out, name)
        draw = scoring_plot if heading == SCORING else memory_plot
        draw(rows, path)
        drawn.append(path)
    return drawn


def image_line(name: str) -> str:
    """The Markdown line showing a plot in docs/benchmarks.md."""
    return f"![{PLOTS[name][1]}](img/{name})"


if __name__ == "__main__":
    for drawn in render(*sys.argv[1:2]):
        print(drawn)
