"""``make test-compat``: the compatibility legs, each in its own virtualenv, as a matrix.

Legs (see docs/guide/deploying.md, "Support matrix"):

* ``spark35-keras3``: PySpark 3.5.x with Keras 3, running the Spark test suite;
* ``spark43-tfkeras``: PySpark 4.3 with legacy tf-keras 2.x (``TF_USE_LEGACY_KERAS=1``),
  running the tf-keras tests (payload, pickling, broadcast and inference helpers,
  the seed 001 story on local-cluster, spawn). Its versions are the main venv's, which
  ``make venv`` builds with tf-keras installed: the leg runs there (no second venv).

Every other leg installs the package in its own venv with the pins of
``constraints.txt``, except the pins the leg replaces; an overlay leg (``spark35-keras3``)
installs only its pins (and what they require that the main venv lacks) in a venv that
sees the main venv's packages after its own: seconds, not a second TensorFlow. Venvs are
reused while ``setup.cfg``/``constraints.txt`` are unchanged.
Usage: ``python compat/matrix.py [--setup-only] [leg ...] [pytest options]`` (a later
``-m`` replaces the default ``-m "not slow"``); exits
non-zero if any leg fails (a leg whose tests were all skipped, or that ran no test,
counts as failed). ``--setup-only`` just creates the legs' venvs.
Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_VENV = os.environ.get("MAIN_VENV", ".venv")  # built by `make venv` (its VENV), not here


@dataclass
class Leg:
    name: str
    venv: str
    pins: dict[str, str]  # package -> version, replacing constraints.txt's pin
    extras: str
    tests: list[str]
    env: dict[str, str] = field(default_factory=dict)
    no_deps: list[str] = field(default_factory=list)  # installed without dependencies
    # over the main venv: a venv of the pins alone (and the exact versions they require),
    # the main venv's packages after them on sys.path (no second TensorFlow to install)
    overlay: bool = False


# The legs run the fast cases of the modules where the PySpark or Keras version changes
# what happens (the UDF and Arrow paths and their types, the daemon, ML persistence,
# cloudpickle by value); the minutes-long end-to-end cases (@pytest.mark.slow),
# local-cluster, reliability and shared-file cases run on the main leg only.
LEGS = [
    Leg("spark35-keras3", ".venv-spark35", {"pyspark": "3.5.9"}, "test", overlay=True, tests=
        # what PySpark 3.5 does its own way: the pandas-UDF fallback and Vectors
        # (test_spark_inputs), mapInArrow for every transform, the daemon's hooks into
        # pyspark.daemon, ML params and persistence. The engine's readers (text, images,
        # sequences, structs: test_spark_real_inputs, test_spark_struct_inputs) read Arrow
        # arrays of the same kinds on both, and run in the main suite only (CI time)
        ["tests/spark/test_broadcast.py", "tests/spark/test_inputs.py",
         "tests/executor/test_daemon.py", "tests/ml/test_pipelines.py",
         # error_col / observe through mapInArrow, the only path there (PySpark 4 takes it
         # for profile= alone)
         "tests/spark/test_operations.py"]),
    # the main venv (PySpark 4.3): `make venv` installs tf-keras there, without
    # dependencies (it depends on `tensorflow`; this project pins the identical CPU build)
    Leg("spark43-tfkeras", MAIN_VENV, {}, "test",
        ["tests/test_tf_keras.py", "tests/test_quiet.py"], env={"TF_USE_LEGACY_KERAS": "1"}),
]


def _run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, **kwargs)


def _constraints(leg: Leg) -> str:
    lines = _read(os.path.join(ROOT, "constraints.txt")).splitlines()
    out = []
    for line in lines:
        name = re.split(r"[=<>!~ ;\[]", line.strip(), maxsplit=1)[0].lower().replace("_", "-")
        if name not in leg.pins:
            out.append(line)
    out += [f"{name}=={version}" for name, version in leg.pins.items()]
    return "\n".join(out) + "\n"


def ensure_venv(leg: Leg) -> str:
    venv = os.path.join(ROOT, leg.venv)
    python = os.path.join(venv, "bin", "python")
    if leg.venv == MAIN_VENV:
        if not os.path.exists(python):
            raise SystemExit(f"leg {leg.name} runs in {venv}: build it first (make venv)")
        return python
    stamp = os.path.join(venv, ".installed")
    constraints_text = _constraints(leg)
    setup_cfg = _read(os.path.join(ROOT, "setup.cfg"))
    wanted = constraints_text + repr((leg.extras, leg.no_deps)) + setup_cfg
    if os.path.exists(stamp) and _read(stamp) == wanted:
        return python
    if not os.path.exists(python):  # an overlay on the main venv's Python (its minor version)
        base = os.path.join(ROOT, MAIN_VENV, "bin", "python") if leg.overlay else sys.executable
        _run([base, "-m", "venv", venv])
    if leg.overlay:
        _overlay(leg, python)
        with open(stamp, "w") as f:
            f.write(wanted)
        return python
    constraints = os.path.join(venv, "constraints.txt")
    with open(constraints, "w") as f:
        f.write(constraints_text)
    _run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    _run([python, "-m", "pip", "install", "--quiet", "-c", constraints, "-e", f".[{leg.extras}]"])
    if leg.no_deps:
        _run([python, "-m", "pip", "install", "--quiet", "--no-deps", *leg.no_deps])
    with open(stamp, "w") as f:
        f.write(wanted)
    return python


# The main venv's site-packages, added after the overlay's own (its .pth files processed:
# the editable install of this package among them)
_SITE = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
# the requirements of a distribution that the packages found do not meet (markers
# evaluated without extras), as ``name<specifier>`` for pip
_UNMET = ("import importlib.metadata as m, sys\n"
          "from packaging.requirements import Requirement\n"
          "for line in m.requires(sys.argv[1]) or []:\n"
          "    r = Requirement(line)\n"
          "    if r.marker is not None and not r.marker.evaluate({'extra': ''}): continue\n"
          "    try: found = m.version(r.name)\n"
          "    except m.PackageNotFoundError: found = None\n"
          "    if found is None or not r.specifier.contains(found, prereleases=True):\n"
          "        print(f'{r.name}{r.specifier}')\n")


def _overlay(leg: Leg, python: str) -> None:
    """The leg's pins installed without dependencies in its venv, then what they require
    that the main venv's packages (after them on sys.path) do not meet."""
    main_python = os.path.join(ROOT, MAIN_VENV, "bin", "python")
    if not os.path.exists(main_python):
        raise SystemExit(f"leg {leg.name} lays over {MAIN_VENV}: build it first (make venv)")
    main_site = subprocess.run([main_python, "-c", _SITE], capture_output=True, text=True,
                               check=True).stdout.strip()
    own_site = subprocess.run([python, "-c", _SITE], capture_output=True, text=True,
                              check=True).stdout.strip()
    with open(os.path.join(own_site, "_main_venv.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({main_site!r})\n")
    pins = [f"{name}=={version}" for name, version in leg.pins.items()]
    _run([python, "-m", "pip", "install", "--quiet", "--no-deps", *pins])
    unmet = [line for name in leg.pins for line in subprocess.run(
        [python, "-c", _UNMET, name], capture_output=True, text=True, check=True).stdout.split()]
    if unmet:
        _run([python, "-m", "pip", "install", "--quiet", "--no-deps", *unmet])


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def versions(python: str, env: dict[str, str]) -> dict[str, str]:
    probe = ("import platform, pyspark, spark_keras.flavour as f; c = f.current(); "
             "print(platform.python_version(), pyspark.__version__, c.name, c.version)")
    out = subprocess.run([python, "-c", probe], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return {"python": out[0], "pyspark": out[1], "keras": f"{out[2]} {out[3]}"}


def run_pytest(python: str, args: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    """``python -m pytest -q ARGS`` from the repository root, its output streamed (so CI
    logs show progress) and returned as lines, with the exit status."""
    lines: list[str] = []
    with subprocess.Popen([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          env=env, cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    return proc.returncode, lines


_OUTCOMES = {"passed": "passed", "failed": "failed", "error": "error", "errors": "error",
             "skipped": "skipped", "xfailed": "xfailed", "xpassed": "xpassed",
             "deselected": "deselected", "warning": "warnings", "warnings": "warnings"}
_COUNT = re.compile(r"(\d+) (" + "|".join(_OUTCOMES) + r")\b")
_SUMMARY = re.compile(r"^=*\s*(no tests ran|\d+ (" + "|".join(_OUTCOMES) + r")\b.*) in [\d.]+s")


def leg_result(returncode: int, lines: list[str]) -> tuple[bool, str]:
    """``(ok, "PASS|FAIL|SKIPPED|NO TESTS <pytest summary>")`` for one leg.

    A leg passes only if pytest exited 0 *and* at least one test passed: a leg whose
    tests were all skipped (a missing dependency, say) or that collected nothing proved
    nothing, and counts as a failure.
    """
    summary_line = next((line for line in reversed(lines) if _SUMMARY.match(line.strip())), None)
    if summary_line is None:
        return False, f"FAIL (exit status {returncode}, no pytest summary)"
    summary = summary_line.strip().strip("= ")
    counts: dict[str, int] = {}
    for number, outcome in _COUNT.findall(summary):
        key = _OUTCOMES[outcome]
        counts[key] = counts.get(key, 0) + int(number)
    if returncode not in (0, 5) or counts.get("failed") or counts.get("error"):
        return False, f"FAIL {summary}"
    if not counts.get("passed"):
        return False, ("SKIPPED " if counts.get("skipped") else "NO TESTS ") + summary
    return True, f"PASS {summary}"


def run_leg(leg: Leg, pytest_args: list[str]) -> dict[str, str]:
    python = ensure_venv(leg)
    env = dict(os.environ, **leg.env, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python,
               TF_CPP_MIN_LOG_LEVEL="2")
    info = versions(python, env)
    started = time.monotonic()
    print(f"\n=== {leg.name}: {' '.join(leg.tests)}", flush=True)
    returncode, lines = run_pytest(python, [*leg.tests, "-m", "not slow", *pytest_args], env)
    ok, result = leg_result(returncode, lines)
    info.update(leg=leg.name, result=result, seconds=f"{time.monotonic() - started:.0f}",
                ok=str(ok))
    return info


def main(argv: list[str]) -> int:
    setup_only = "--setup-only" in argv
    names = [a for a in argv if not a.startswith("-")]
    pytest_args = [a for a in argv if a.startswith("-") and a != "--setup-only"]
    unknown = set(names) - {leg.name for leg in LEGS}
    if unknown:
        print(f"unknown leg(s) {sorted(unknown)}; legs: {[leg.name for leg in LEGS]}")
        return 2
    legs = [leg for leg in LEGS if not names or leg.name in names]
    if setup_only:
        for leg in legs:
            print(f"{leg.name}: {ensure_venv(leg)}")
        return 0
    rows = [run_leg(leg, pytest_args) for leg in legs]
    cols = ["leg", "python", "pyspark", "keras", "result", "seconds"]
    print("\nCompatibility matrix")
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for row in rows:
        print(" | ".join(row[c] for c in cols))
    return 0 if all(row["ok"] == "True" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
