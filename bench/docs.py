"""docs/benchmarks.md (benchmarks-tf-keras.md under tf-keras): one block per section,
its heading, the line naming the run that produced it, what it measures, its tables and
targets. A run rewrites only the sections it measured and keeps the others."""

from __future__ import annotations

import os

from bench import transfer_bench
from bench.doc_bodies import (
    _coldstart,
    _dask,
    _frontends,
    _inputs,
    _isolation,
    _keyed,
    _memory,
    _operations,
    _payload,
    _scoring,
    _threads,
)
from bench.doc_bodies_jobs import _commits, _images, _large
from bench.plots import render
from bench.report import plot

TITLES = {  # section -> its heading in the docs (the order of the docs)
    "payload": "## Model rebuild: Keras pickle vs spark_keras payload",
    "scoring": "## Scoring throughput on local[2]",
    "memory": "## Memory: N Python workers holding one model",
    "dask": "## Dask: sending a model to a task",
    "coldstart": "## Cold start: a fresh Python worker, stock daemon vs preloading daemon",
    "frontends": "## Front-ends: predict_partition, pool_predict, predict_dask",
    "inputs": "## Text, image bytes and variable-length sequences on local[2]",
    "threads": "## TensorFlow thread pools per Python worker: the task's CPUs vs all cores",
    "operations": "## Operating a scoring job: transform with error_col and observe vs without",
    "isolation": "## Rows that make the model raise: transform with row isolation vs without",
    "keyed": "## Many models in one job: KeyedModels vs one BroadcastModel per key",
    "large": "## A model larger than the JVM heaps, on local-cluster[2,1,1024]",
    "transfer": transfer_bench.TITLE,
    "commits": "## The score job's commits (--resume) and progress (--progress) vs the plain job",
    "images": "## A heavy CNN on images: MobileNetV2 on Spark image rows and PNG bytes vs the model alone",
}
RUN_PREFIX = "_Measured by "


def run_line(command: str, date: str, machine: str, seconds: str) -> str:
    """The line under each section's heading: the command that produced its numbers."""
    return f"{RUN_PREFIX}`{command}` on {date} ({seconds}); machine: {machine}._"


BODIES = {"payload": _payload, "scoring": _scoring, "memory": _memory, "dask": _dask, "coldstart": _coldstart,
          "frontends": _frontends, "inputs": _inputs, "threads": _threads, "operations": _operations,
          "isolation": _isolation, "keyed": _keyed, "large": _large, "transfer": transfer_bench.body,
          "commits": _commits,
          "images": _images}


def _sections(results: dict, docs: str) -> dict[str, list[str]]:
    """The blocks of the sections in ``results``, each starting with its heading and the
    line naming the run; docs/benchmarks.png drawn anew when the scoring section ran."""
    seconds = results.get("section_seconds", {})

    def start(name: str) -> list[str]:
        took = f"{seconds[name]:.0f} s for this section" if name in seconds \
            else f"{results['seconds']:.0f} s for the whole run"
        return [TITLES[name], "", run_line(results["command"], results["date"], results["machine"], took), ""]

    if "scoring" in results:
        plot(results["scoring"], os.path.join(docs, "benchmarks.png"))
    return {name: start(name) + body(results) for name, body in BODIES.items() if name in results}


def _read_blocks(path: str) -> tuple[dict[str, str], dict[str, list[str]], list[list[str]]]:
    """An existing docs file: the header's ``- name: value`` fields, the blocks of the
    known sections, and any other ``## `` blocks (kept as they are, after the known ones)."""
    fields: dict[str, str] = {}
    known: dict[str, list[str]] = {}
    other: list[list[str]] = []
    if not os.path.exists(path):
        return fields, known, other
    with open(path) as f:
        lines = f.read().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    for line in lines[:heads[0] if heads else len(lines)]:
        if line.startswith("- ") and ": " in line:
            name, _, value = line[2:].partition(": ")
            fields[name] = value
    by_title = {title: name for name, title in TITLES.items()}
    for i, j in zip(heads, [*heads[1:], len(lines)]):
        block = lines[i:j]
        name = by_title.get(block[0])
        if name is None:
            other.append(block)
        else:
            known[name] = block
    return fields, known, other


def _with_run_line(block: list[str], fields: dict[str, str]) -> list[str]:
    """A kept block, with the line naming its run; written before runs were recorded per
    section, it takes the run from the old header's command, date, machine and wall time."""
    if any(line.startswith(RUN_PREFIX) for line in block[:4]) or "command" not in fields:
        return block
    took = f"{fields['wall time']} for the whole run" if "wall time" in fields else "whole run"
    line = run_line(fields["command"].strip("`"), fields.get("date", "?"), fields.get("machine", "?"), took)
    return [block[0], "", line, *block[1:]]


def write_docs(results: dict, docs: str | None = None) -> None:
    """Rewrite the sections in ``results`` in docs/benchmarks.md (benchmarks-tf-keras.md
    under tf-keras); the sections this run did not measure are kept as they were, each
    with the line naming the run that produced it."""
    docs = docs or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")
    legacy = results.get("flavour") == "tf_keras"
    path = os.path.join(docs, "benchmarks-tf-keras.md" if legacy else "benchmarks.md")
    fields, kept, other = _read_blocks(path)
    fresh = _sections(results, docs)
    make = ("`make bench-tf-keras` runs `TF_USE_LEGACY_KERAS=1 python -m bench --only payload --write`"
            if legacy else "`make bench` runs `python -m bench --write`, every section")
    lines = ["# Benchmarks under legacy tf-keras 2.x" if legacy else "# Benchmarks", "",
             f"Generated by the benchmark itself ({make}; `python -m bench --only <sections> "
             "--write` rewrites those sections and keeps the others). Each section names the "
             "command, date and machine of the run that produced it; the numbers of a section "
             "come from that one run, all its ratios measured side by side in it.", ""]
    blocks = [fresh[name] if name in fresh else _with_run_line(kept[name], fields)
              for name in TITLES if name in fresh or name in kept]
    for block in [*blocks, *other]:
        while block and not block[-1].strip():
            block = block[:-1]
        lines += [*block, ""]
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    if not legacy:
        render(path)  # the site's plots, from the figures just written
