"""The Python blocks of the README and of the documentation site (docs/, in mkdocs.yml's nav
order: one document, whose examples may continue from page to page) run as written. Each
block is declared by an HTML comment on the line before it: ``<!-- example: NAME -->``
starts a script (``, env K=V`` adds to its environment), ``<!-- continues: NAME -->``
appends to one, ``<!-- not run: why -->`` leaves a block out (only the keras-hub preset
download). Each script runs in a fresh Python process, from an empty folder, on the
embedded local Spark (or a local Connect server), and prints what the pages say its blocks
print: ``PRINTS`` holds, per block that prints, a line of it and the check of its output
(tables of ``show()``, printed lines); a block not there must print nothing."""

from __future__ import annotations

import ast
import contextlib
import glob
import os
import re
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from typing import Callable

import pytest
import yaml

from tests.conftest import REPO_ROOT, local_connect_server

MKDOCS = os.path.join(REPO_ROOT, "mkdocs.yml")
_BLOCK = re.compile(r"^(?:<!-- (example|continues|not run): (.*?) -->\n)?```python\n(.*?)^```",
                    re.S | re.M)


def _nav_pages(item: object) -> list[str]:
    """The pages of an mkdocs.yml ``nav`` entry, in order."""
    if isinstance(item, str):
        return [item] if item.endswith(".md") else []
    if isinstance(item, dict):
        return [p for value in item.values() for p in _nav_pages(value)]
    if isinstance(item, list):
        return [p for value in item for p in _nav_pages(value)]
    return []


def documents() -> list[str]:
    """README.md, then the site's pages in its nav order (paths from the repository's root);
    every page of docs/ is in the nav."""
    with open(MKDOCS, encoding="utf-8") as f:
        config = yaml.safe_load(f)
    pages = [os.path.join("docs", page) for page in _nav_pages(config["nav"])]
    found = sorted(os.path.relpath(p, REPO_ROOT)
                   for p in glob.glob(os.path.join(REPO_ROOT, "docs", "**", "*.md"), recursive=True))
    assert sorted(pages) == found, f"pages not in mkdocs.yml's nav: {sorted(set(found) - set(pages))}"
    return ["README.md", *pages]


def _examples() -> dict[str, tuple[dict[str, str], list[str]]]:
    """name -> (environment, blocks) in the documents' order; a block without a declaration
    fails."""
    examples: dict[str, tuple[dict[str, str], list[str]]] = {}
    for document in documents():
        with open(os.path.join(REPO_ROOT, document), encoding="utf-8") as f:
            text = f.read()
        for kind, label, code in _BLOCK.findall(text):
            first = f"{document}: {code.splitlines()[0]!r}"
            if not kind:
                raise AssertionError(f"block {first} has no <!-- example/continues --> line")
            if kind == "not run":
                assert "from_preset" in code, f"only the preset download may be left out: {first}"
                continue
            name, *settings = [part.strip() for part in label.split(",")]
            if kind == "example":
                assert name not in examples, f"example {name!r} started twice ({first})"
                env = dict(s.removeprefix("env ").split("=", 1) for s in settings)
                examples[name] = (env, [code])
            else:
                assert name in examples, f"block {first} continues {name!r}, not started above it"
                examples[name][1].append(code)
        assert text.count("```python") == len(_BLOCK.findall(text)), f"{document}: a block not read"
    return examples


def test_every_python_block_is_declared_and_only_the_download_is_left_out():
    examples = _examples()
    assert {"readme", "tour", "legacy", "connect", "dask"} <= set(examples)
    assert len(examples["tour"][1]) >= 10
    assert sum(len(blocks) for _, blocks in examples.values()) >= 16  # the 15 the README had, its tour


@dataclass
class Shown:
    """A table ``DataFrame.show()`` printed: header, rows of cells (as printed, values
    over 20 characters cut to 17 and "..."), and N of "only showing top N rows"."""

    columns: list[str]
    rows: list[list[str]]
    top: int | None = None

    def column(self, name: str) -> list[str]:
        return [row[self.columns.index(name)] for row in self.rows]

    def by(self, *names: str) -> dict[tuple[str, ...], str]:
        """``{(the row's cells of names but the last): its cell of the last}``."""
        *keys, value = names
        at = [self.columns.index(k) for k in keys]
        return {tuple(_null(row[j]) for j in at): row[self.columns.index(value)]
                for row in self.rows}


@dataclass
class Printed:
    """What one block printed: its tables, and its other non-empty lines."""

    tables: list[Shown] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


_MARK = "<<readme block {}>>"
_BORDER = re.compile(r"^\+(?:-+\+)+$")
_TOP = re.compile(r"^only showing top (\d+) rows?$")


def _script(blocks: list[str]) -> str:
    """The blocks as one script, each after a line printing its mark (in the main process
    only: Dask's and spawn's processes import the script)."""
    mark = 'if __name__ == "__main__":\n    print({!r}, flush=True)\n'
    return "\n".join(mark.format(_MARK.format(i)) + block for i, block in enumerate(blocks))


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip()[1:-1].split("|")]


def _printed(stdout: str, n_blocks: int) -> list[Printed]:
    """Per block, what it printed (the output between its mark and the next)."""
    parts = re.split(r"^<<readme block (\d+)>>$", stdout, flags=re.M)
    assert parts[0].strip() == "", f"printed before the first block: {parts[0][:500]!r}"
    marks = [int(m) for m in parts[1::2]]
    assert marks == list(range(n_blocks)), f"block marks {marks}: a block did not run to its end"
    return [_parsed(text.splitlines()) for text in parts[2::2]]


def _parsed(lines: list[str]) -> Printed:
    out = Printed()
    i = 0
    while i < len(lines):
        if _BORDER.match(lines[i]) and i + 2 < len(lines) and _BORDER.match(lines[i + 2]):
            table = Shown(_cells(lines[i + 1]), [])
            i += 3
            while i < len(lines) and not _BORDER.match(lines[i]):
                table.rows.append(_cells(lines[i]))
                i += 1
            top = _TOP.match(lines[i + 1]) if i + 1 < len(lines) else None
            if top:
                table.top = int(top.group(1))
                i += 1
            out.tables.append(table)
        elif lines[i].strip():
            out.lines.append(lines[i])
        i += 1
    return out


def _null(cell: str) -> str | None:
    return None if cell in ("NULL", "null") else cell  # Spark 4.x, 3.5


def _table(printed: Printed, i: int, columns: list[str] | int, rows: int,
           top: int | None = None) -> Shown:
    """Its ``i``-th table, which has these ``columns`` (or this many), ``rows`` rows and
    "only showing top ``top`` rows" (None: all of them)."""
    assert len(printed.tables) > i, f"table {i} not printed: {printed}"
    table = printed.tables[i]
    if isinstance(columns, int):
        assert len(table.columns) == columns, table.columns
    else:
        assert table.columns == columns, table.columns
    assert (len(table.rows), table.top) == (rows, top), table
    return table


def _arrays(cells: list[str]) -> None:
    """Each a shown array (a vector output): none null."""
    assert all(c.startswith("[") and (c.endswith("]") or c.endswith("...")) for c in cells), cells


def _probabilities(cells: list[str]) -> None:
    """Each a number in [0, 1] (a sigmoid unit: a scalar column)."""
    assert all(0.0 <= float(c) <= 1.0 for c in cells), cells


def _texts(cells: list[str], texts: list[str]) -> None:
    """The shown ``texts`` (cut as show() cuts them)."""
    assert [t if len(t) <= 20 else t[:17] + "..." for t in texts] == cells, cells


def _readme(printed: Printed, blocks: list[Printed]) -> None:
    # all columns + "prediction" (array<float>), the first 3 rows
    scored = _table(printed, 0, ["id", "features", "prediction"], 3, top=3)
    assert scored.column("id") == ["0", "1", "2"]
    _arrays(scored.column("prediction"))
    udf = _table(printed, 1, 1, 3, top=3)  # the UDF: the same predictions
    assert [row[0] for row in udf.rows] == scored.column("prediction")


def _tour_scoring(printed: Printed, blocks: list[Printed]) -> None:
    _readme(printed, blocks)  # the transform and the UDF, as in the README's tour
    assert len(printed.lines) == 1, printed.lines  # builds, hits, evictions in this process
    info = ast.literal_eval(printed.lines[0])
    assert {"builds", "hits", "evictions"} <= set(info), info


def _tour_pipeline(printed: Printed, blocks: list[Printed]) -> None:
    shown = _table(printed, 0, ["tenure", "spend", "visits", "raw", "features", "score"], 3)
    assert shown.column("tenure") == ["12", "40", "3"]
    _probabilities(shown.column("score"))  # outputCol="score", a sigmoid unit


def _tour_uri(printed: Printed, blocks: list[Printed]) -> None:
    # the model saved and read back from its URI scores as the model itself did
    assert printed.tables == blocks[0].tables[:1], (printed.tables, blocks[0].tables[:1])


def _tour_versions(printed: Printed, blocks: list[Printed]) -> None:
    assert printed.lines == ["2026-12-02"]  # the label update returns
    # the first 1000 rows by the first version, the 1000 appended after update by the new
    counts = _table(printed, 0, ["model_version", "count"], 2).by("model_version", "count")
    assert counts == {("2026-12-01",): "1000", ("2026-12-02",): "1000"}, counts


def _tour_keyed(printed: Printed, blocks: list[Printed]) -> None:
    # ids 0..999: id % 3 == 0 "fr", 1 "de", 2 "it" (no model: null, with its reason)
    counts = _table(printed, 0, ["country", "error", "count"], 3).by("country", "error", "count")
    assert counts == {("fr", None): "334", ("de", None): "333",
                      ("it", "key: no model for key 'it'"): "333"}, counts


def _tour_text_images_sequences(printed: Printed, blocks: list[Printed]) -> None:
    sentences = _table(printed, 0, ["text", "prediction"], 2)
    _texts(sentences.column("text"), ["the cat sat on the mat", "a dog ran in the park"])
    files = _table(printed, 1, ["path", "modificationTime", "length", "content", "prediction"], 2)
    images = _table(printed, 2, ["image", "prediction"], 2)  # both sizes scored
    sequences = _table(printed, 3, ["id", "sequence", "prediction"], 3, top=3)
    for table in (sentences, files, images, sequences):
        _arrays(table.column("prediction"))


def _tour_keras_hub(printed: Printed, blocks: list[Printed]) -> None:
    reviews = _table(printed, 0, ["text", "prediction"], 2)
    _texts(reviews.column("text"), ["a fine film", "A dull plot"])
    _arrays(reviews.column("prediction"))


def _dask(printed: Printed, blocks: list[Printed]) -> None:
    # predict_dask(...).compute(): a pandas frame, a row per row of x, a column per output unit
    assert printed.lines[-1] == "[1000 rows x 2 columns]", printed.lines
    assert printed.lines[1].split()[0] == "0" and printed.lines[-2].split()[0] == "999"


def _legacy(printed: Printed, blocks: list[Printed]) -> None:
    _probabilities(_table(printed, 0, ["f", "prediction"], 4).column("prediction"))


def _connect(printed: Printed, blocks: list[Printed]) -> None:
    scored = _table(printed, 0, ["id", "features", "prediction"], 8)
    assert scored.column("id") == [str(i) for i in range(8)]
    _arrays(scored.column("prediction"))
    udf = _table(printed, 1, 1, 8)  # predict_udf: the same predictions
    assert [row[0] for row in udf.rows] == scored.column("prediction")


# Per example, the blocks that print: a line of the block (as the pages have it) and what
# the pages say the block prints. Every other block prints nothing.
PRINTS: dict[str, list[tuple[str, Callable[[Printed, list[Printed]], None]]]] = {
    "readme": [('df.select(bm.predict_udf()("features")).show(3)', _readme)],
    "tour": [
        ("print(sk.cache_info())", _tour_scoring),
        ('PipelineModel.load("models/churn").transform(customers).show()', _tour_pipeline),
        ('sk.BroadcastModel(spark, uri).transform(df, "features").show(3)', _tour_uri),
        ('print(versioned.update(retrained, version="2026-12-02"))', _tour_versions),
        ('.groupBy("country", "error").count().show(truncate=False)', _tour_keyed),
        ('sk.BroadcastModel(spark, gru).transform(sequences, "sequence", buckets=8).show(3)',
         _tour_text_images_sequences),
        ('sk.BroadcastModel(spark, classifier).transform(reviews, "text").show()', _tour_keras_hub),
    ],
    "dask": [("print(predict_dask(handle, ddf, columns=features).compute())", _dask)],
    "legacy": [('"f").show()', _legacy)],
    "connect": [('df.select(bm.predict_udf()("features")).show()', _connect)],
}


def _checks(name: str, blocks: list[str]) -> dict[int, Callable[[Printed, list[Printed]], None]]:
    """Block index -> the check of what it prints; each line of PRINTS in one block."""
    checks = {}
    for line, check in PRINTS.get(name, []):
        found = [i for i, block in enumerate(blocks) if line in block]
        assert len(found) == 1, f"{name}: {line!r} is in blocks {found} (the pages changed?)"
        assert found[0] not in checks, f"{name}: two checks for block {found[0]}"
        checks[found[0]] = check
    return checks


def test_every_block_that_prints_has_its_output_checked():
    """A block that shows or prints is in PRINTS, and every line PRINTS names is in the
    pages (in one block of its example)."""
    for name, (_, blocks) in _examples().items():
        checks = _checks(name, blocks)
        for i, block in enumerate(blocks):
            code = "\n".join(line.split("#")[0] for line in block.splitlines())
            prints = re.search(r"\.show\(|\bprint\(", code)
            assert bool(prints) == (i in checks), f"{name} block {i}: prints, and is not in PRINTS" \
                if prints else f"{name} block {i}: in PRINTS, and prints nothing"


def test_the_output_parser_reads_shown_tables():
    text = "\n".join([_MARK.format(0), "+---+----+", "| id|   e|", "+---+----+", "|  1|NULL|",
                      "|  2| a b|", "+---+----+", "only showing top 2 rows", "2026-12-02", ""])
    (out,) = _printed(text, 1)
    assert out.tables == [Shown(["id", "e"], [["1", "NULL"], ["2", "a b"]], 2)]
    assert out.lines == ["2026-12-02"] and out.tables[0].by("id", "e") == {("1",): "NULL", ("2",): "a b"}
    with pytest.raises(AssertionError, match="a block did not run to its end"):
        _printed(text, 2)


@pytest.mark.slow  # a Spark (or Connect server) of its own per example: 2-4 minutes in all
@pytest.mark.parametrize("name", sorted(_examples()))
def test_a_readme_example_runs_as_written_and_prints_what_the_readme_says(name, tmp_path):
    env_extra, blocks = _examples()[name]
    checks = _checks(name, blocks)
    script = tmp_path / f"readme_{name}.py"  # not dask.py: it would shadow dask
    script.write_text(_script(blocks))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", **env_extra)
    for key in ("SPARK_REMOTE", "SPARK_KERAS_BUILD_LOG"):
        env.pop(key, None)
    if name == "tour":  # as a user runs it: .venv/bin/python, nothing activated, PATH's
        # python3 a Python without the package, PYSPARK_PYTHON unset (its first block sets it)
        bare = tmp_path / "bare"
        venv.EnvBuilder(with_pip=False).create(bare)
        for key in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV"):
            env.pop(key, None)
        env["PATH"] = os.pathsep.join([str(bare / "bin"), "/usr/bin", "/bin"])
    connect = "remote(" in "".join(blocks)
    with local_connect_server() if connect else contextlib.nullcontext():
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-6000:]}"
    printed = _printed(done.stdout, len(blocks))
    for i, out in enumerate(printed):
        if i in checks:
            checks[i](out, printed)
        else:
            assert out == Printed(), f"{name} block {i} printed {out}"
