"""The package's layout holds (docs/architecture.md): components import one way, no
circle between modules, no module over 400 lines. Read from the source: nothing runs."""

from __future__ import annotations

import ast
import os

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = os.path.join(REPO_ROOT, "spark_keras")
MAX_LINES = 400

# a component may not import these (whether at the top of a module or inside a function)
FORBIDDEN = {
    "payload": ("pyspark", "spark_keras.spark", "spark_keras.executor", "spark_keras.channel",
                "spark_keras.ml", "spark_keras.jobs", "spark_keras.inference"),
    "inference": ("pyspark", "spark_keras.spark", "spark_keras.executor", "spark_keras.channel",
                  "spark_keras.ml", "spark_keras.jobs"),
    "channel": ("spark_keras.spark", "spark_keras.executor", "spark_keras.ml", "spark_keras.jobs"),
    "executor": ("spark_keras.spark", "spark_keras.ml", "spark_keras.jobs"),
    "spark": ("spark_keras.ml", "spark_keras.jobs"),
    "ml": ("spark_keras.jobs",),
}


def _modules() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, REPO_ROOT)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _imports(module: str, path: str, known: set[str]) -> set[str]:
    """The modules of the package (or others, by name) that ``module`` imports: by import
    statements, by ``importlib.import_module("name")`` and ``__import__("name")`` with a
    literal name, and a package's name (``from spark_keras import BroadcastModel``) by
    the module its ``__init__`` takes that name from (at its top or in ``__getattr__``)."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    names.add(f"{base}.{alias.name}")
                elif base in known and base != module:
                    names.update(_providers(base, alias.name))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "id", None) in ("__import__", "import_module")
                   or getattr(node.func, "attr", None) == "import_module")):
            names.add(node.args[0].value)
    return names


def _providers(package: str, name: str) -> set[str]:
    """The modules a package's ``__init__`` imports ``name`` from."""
    path = os.path.join(REPO_ROOT, *package.split("."), "__init__.py")
    found: set[str] = set()
    if not os.path.isfile(path):  # a module, not a package: its names are its own
        return found
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and any(
                alias.name == name for alias in node.names):
            found.add(node.module)
    return found


def test_components_import_one_way():
    modules = _modules()
    wrong = []
    for module, path in modules.items():
        component = module.split(".")[1] if module.count(".") >= 1 else None  # its __init__ too
        for name in _imports(module, path, set(modules)):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN.get(component, ())):
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_circle_between_modules():
    modules = _modules()
    graph = {m: {n for n in _imports(m, p, set(modules)) if n in modules and n != m
                 and not m.startswith(n + ".")}  # a module may import its own package
             for m, p in modules.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                pytest.fail("circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_module_over_400_lines():
    long = {m: n for m, p in _modules().items()
            if (n := sum(1 for _ in open(p, encoding="utf-8"))) > MAX_LINES}
    assert not long, long
