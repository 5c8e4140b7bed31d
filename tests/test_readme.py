"""The README's Python blocks run as written. Each block is declared by an HTML comment on
the line before it: ``<!-- example: NAME -->`` starts a script (``, env K=V`` adds to its
environment), ``<!-- continues: NAME -->`` appends to one, ``<!-- not run: why -->``
leaves a block out (only the keras-hub preset download). Each script runs in a fresh Python
process, from an empty folder, on the embedded local Spark (or a local Connect server)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO_ROOT, local_connect_server

README = os.path.join(REPO_ROOT, "README.md")
_BLOCK = re.compile(r"^(?:<!-- (example|continues|not run): (.*?) -->\n)?```python\n(.*?)^```",
                    re.S | re.M)


def _examples() -> dict[str, tuple[dict[str, str], list[str]]]:
    """name -> (environment, blocks) in README order; a block without a declaration fails."""
    with open(README) as f:
        text = f.read()
    examples: dict[str, tuple[dict[str, str], list[str]]] = {}
    for kind, label, code in _BLOCK.findall(text):
        first = code.splitlines()[0]
        if not kind:
            raise AssertionError(f"README block {first!r} has no <!-- example/continues --> line")
        if kind == "not run":
            assert "from_preset" in code, f"only the preset download may be left out: {first!r}"
            continue
        name, *settings = [part.strip() for part in label.split(",")]
        if kind == "example":
            assert name not in examples, f"example {name!r} started twice"
            env = dict(s.removeprefix("env ").split("=", 1) for s in settings)
            examples[name] = (env, [code])
        else:
            assert name in examples, f"block {first!r} continues {name!r}, not started above it"
            examples[name][1].append(code)
    assert text.count("```python") == sum(len(b) for _, b in examples.values()) + 1
    return examples


def test_every_python_block_is_declared_and_only_the_download_is_left_out():
    examples = _examples()
    assert {"tour", "legacy", "connect"} <= set(examples)
    assert len(examples["tour"][1]) >= 10


@pytest.mark.slow  # a Spark (or Connect server) of its own per example: 2-4 minutes in all
@pytest.mark.parametrize("name", sorted(_examples()))
def test_a_readme_example_runs_as_written(name, tmp_path):
    env_extra, blocks = _examples()[name]
    script = tmp_path / f"readme_{name}.py"  # not dask.py: it would shadow dask
    script.write_text("\n".join(blocks))
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", **env_extra)
    for key in ("SPARK_REMOTE", "SPARK_KERAS_BUILD_LOG"):
        env.pop(key, None)
    connect = "remote(" in "".join(blocks)
    with local_connect_server() if connect else contextlib.nullcontext():
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-6000:]}"
    assert done.stdout.strip(), f"{name}: printed nothing"  # its frames and figures

