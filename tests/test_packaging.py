"""What ``pip install spark-keras`` gives: dependencies declared as a library declares them
(no PySpark and no TensorFlow distribution in the base install, an extra for each), one
clear error naming the extra when a part's dependency is missing, and the installed
``score`` job (``spark-keras`` console script, ``python -m spark_keras``, the job file for
spark-submit) run from a real wheel installed outside the checkout."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from email.parser import Parser

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO_ROOT

PYTHON = sys.executable
BIN = os.path.dirname(PYTHON)


def run_python(code: str, *, cwd=None, timeout: int = 120, **env: str):
    """``python -c code`` in this environment plus ``env``, without SPARK_REMOTE."""
    base = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    return subprocess.run([PYTHON, "-c", code], cwd=cwd, env=dict(base, **env),
                          capture_output=True, text=True, timeout=timeout)


# --- one clear error per missing optional dependency ---------------------------------------

# ``sys.modules[name] = None`` makes ``import name`` raise ModuleNotFoundError, as if the
# package were not installed.
BLOCK = "import sys\nfor _name in {names!r}:\n    sys.modules[_name] = None\n"

CHECK = """
import spark_keras as sk
from spark_keras.errors import MissingDependencyError
try:
{action}
except MissingDependencyError as exc:
    assert isinstance(exc, ImportError) and isinstance(exc, sk.SparkKerasError)
    print("MISSING", exc.name, "|", exc)
else:
    print("NO ERROR")
"""

MISSING = {  # case: (modules blocked, what the user does, the module named, the extra)
    "BroadcastModel without pyspark": (["pyspark"], "sk.BroadcastModel", "pyspark", "spark"),
    "KerasTransformer without pyspark": (["pyspark"], "from spark_keras.ml import KerasTransformer",
                                         "pyspark", "spark"),
    "a model without tensorflow": (["tensorflow"], "sk.load(MODEL)", "tensorflow", "tensorflow"),
    "tf-keras without tf_keras": (["tf_keras"], "sk.load(MODEL)", "tf_keras", "legacy"),
    "Dask without distributed": (["distributed"], "import spark_keras.dask", "distributed", "dask"),
}


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> str:
    import spark_keras as sk
    from tests import models

    path = str(tmp_path_factory.mktemp("packaging") / "mlp.skp")
    sk.save(models.mlp(n_features=4, hidden=4), path)
    return path


@pytest.mark.parametrize("case", sorted(MISSING))
def test_a_missing_dependency_raises_one_error_naming_its_extra(case, payload):
    blocked, action, module, extra = MISSING[case]
    code = (BLOCK.format(names=blocked) + f"MODEL = {payload!r}\n"
            + CHECK.format(action="    " + action))
    env = {"TF_USE_LEGACY_KERAS": "1"} if module == "tf_keras" else {}
    proc = run_python(code, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith(f"MISSING {module} |"), line
    assert f"pip install 'spark-keras[{extra}]'" in line and repr(module) in line, line


def test_the_base_install_imports_without_spark_tensorflow_or_dask():
    """``import spark_keras`` and the job's ``--help`` need none of the optional parts;
    running the job without PySpark stops with the one-line error naming the extra."""
    code = BLOCK.format(names=["pyspark", "tensorflow", "keras", "tf_keras", "distributed",
                               "dask"]) + """
import spark_keras, spark_keras.cli, spark_keras.jobs.score
assert not {"pyspark", "tensorflow", "keras"} & {m for m, v in sys.modules.items() if v}
try:
    spark_keras.cli.main(["score", "--help"])
except SystemExit as exc:
    assert exc.code == 0
status = spark_keras.cli.main(["score", "--model", "m.keras", "--input", "in.parquet",
                               "--output", "out", "--features", "f", "--master", "local[1]"])
print("STATUS", status)
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--model MODEL" in proc.stdout and proc.stdout.strip().endswith("STATUS 2"), proc.stdout
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == ["spark-keras score: error: the score job needs the Python package "
                      "'pyspark', which is not installed: pip install 'spark-keras[spark]'"], \
        proc.stderr[-3000:]


def test_the_job_on_connect_without_grpc_names_the_connect_extra(tmp_path):
    """PySpark is there but not Spark Connect's gRPC client: the job stops with one line
    naming the ``connect`` extra (a script, as the console script runs: PySpark's own
    check exits quietly under ``python -c``)."""
    pd.DataFrame({"f": [1.0]}).to_parquet(tmp_path / "in.parquet", index=False)
    script = tmp_path / "job.py"
    script.write_text(BLOCK.format(names=["grpc"]) + """
from spark_keras.cli import main
print("STATUS", main(["score", "--remote", "sc://localhost:1", "--model", "m.keras",
                      "--input", "in.parquet", "--output", "out", "--features", "f"]))
""")
    base = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    proc = subprocess.run([PYTHON, str(script)], cwd=tmp_path, env=base, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("STATUS 2"), \
        (proc.stdout + proc.stderr)[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "spark-keras score: error: the score job on Spark Connect needs"), proc.stderr[-3000:]
    assert errors[0].endswith("pip install 'spark-keras[connect]'") and "grpc" in errors[0], errors


# --- a real wheel, installed outside the checkout -----------------------------------------

SOURCES = ["setup.cfg", "pyproject.toml", "README.md", "spark_keras"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The package's wheel built from a copy of the sources (the checkout is not touched)
    and installed with ``pip install --target`` into ``site``; ``cwd`` is a folder outside
    the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        path = os.path.join(REPO_ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    pip = [PYTHON, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(root / "dist"), str(src)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = list((root / "dist").glob("spark_keras-*.whl"))
    site = root / "site"
    done = subprocess.run([*pip, "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cwd = root / "elsewhere"
    cwd.mkdir()
    return {"wheel": str(wheel), "site": str(site), "cwd": cwd}


def wheel_metadata(wheel: str):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        [entry] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        return names, Parser().parsestr(z.read(meta).decode()), z.read(entry).decode()


def test_wheel_declares_no_framework_and_an_extra_for_each(installed):
    names, meta, entry_points = wheel_metadata(installed["wheel"])
    requires = meta.get_all("Requires-Dist")
    base = {r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip()
            for r in requires if "extra ==" not in r}
    assert base == {"keras", "numpy", "pandas", "pyarrow", "cloudpickle"}, base
    extras = set(meta.get_all("Provides-Extra"))
    assert {"spark", "connect", "tensorflow", "tensorflow-cpu", "dask", "legacy", "hub",
            "test"} <= extras, extras

    def extra(name: str) -> str:
        return "\n".join(r for r in requires if f'extra == "{name}"' in r)

    assert "pyspark" in extra("spark") and "pyspark" in extra("connect") and "grpcio" in extra("connect")
    assert "tensorflow-cpu" not in extra("tensorflow") and "tensorflow<" in extra("tensorflow")
    assert "tensorflow-cpu" in extra("tensorflow-cpu") and "tf-keras" in extra("legacy")
    for needed in ("pyspark", "tensorflow-cpu", "distributed", "grpcio", "pytest"):
        assert needed in extra("test"), needed  # `make test` gets everything from one extra
    assert "spark_keras/py.typed" in names
    assert "spark_keras/spark-defaults.conf" in names  # what `spark-keras conf` prints
    assert "spark-keras = spark_keras.cli:main" in entry_points


def test_wheel_python_keras_and_hub_requirements(installed):
    """The Python versions named agree with Requires-Python; the Keras floor is the first
    release the payload's state capture works with (3.14); ``hub`` gives keras-hub on
    Linux too, ``hub-deps`` its dependencies without it."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    _, meta, _ = wheel_metadata(installed["wheel"])
    python = SpecifierSet(meta["Requires-Python"])
    named = [c.rsplit(":: ", 1)[1] for c in meta.get_all("Classifier")
             if c.startswith("Programming Language :: Python :: 3.")]
    assert named and all(v in python for v in named), (python, named)
    lowest = min(v for v in (f"3.{m}" for m in range(20)) if v in python)
    assert lowest in named, (python, named)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    [keras] = [r for r in requires if r.name == "keras" and r.marker is None]
    assert "3.14" in keras.specifier and "3.13.9" not in keras.specifier, keras

    def extra(name: str, platform: str) -> set[str]:
        return {r.name for r in requires if r.marker is not None
                and r.marker.evaluate({"extra": name, "sys_platform": platform})}

    for platform in ("linux", "darwin", "win32"):
        assert "keras-hub" in extra("hub", platform), platform
        assert "keras-hub" not in extra("hub-deps", platform) and \
            {"sentencepiece", "tokenizers", "regex"} <= extra("hub-deps", platform), platform


def test_a_star_import_works_without_pyspark():
    """``from spark_keras import *`` without the spark extra gives everything but
    BroadcastModel and KeyedModels; with PySpark it gives them too; every error class the
    package raises is exported."""
    import spark_keras.errors

    show = ("_before = set(dir())\nfrom spark_keras import *\n"
            "print(sorted(n for n in set(dir()) - _before if not n.startswith('_')))\n")
    without = run_python(BLOCK.format(names=["pyspark"]) + show)
    assert without.returncode == 0, without.stderr[-3000:]
    names = set(eval(without.stdout.strip().splitlines()[-1]))
    assert set(spark_keras.errors.__all__) <= names, set(spark_keras.errors.__all__) - names
    assert not {"BroadcastModel", "KeyedModels"} & names and "dumps" in names, names
    with_spark = run_python(show)
    assert with_spark.returncode == 0, with_spark.stderr[-3000:]
    assert set(eval(with_spark.stdout.strip().splitlines()[-1])) == names | {"BroadcastModel", "KeyedModels"}


def installed_env(installed: dict, **env: str) -> dict:
    """This environment with only the installed copy importable (PYTHONPATH=site; the
    checkout's editable install comes after it on sys.path), no SPARK_REMOTE."""
    base = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYTHONPATH")}
    return dict(base, PYTHONPATH=installed["site"], PYSPARK_PYTHON=PYTHON,
                PYSPARK_DRIVER_PYTHON=PYTHON, TF_CPP_MIN_LOG_LEVEL="2", **env)


def test_installed_console_script_and_module(installed):
    site, cwd = installed["site"], installed["cwd"]
    env = installed_env(installed)
    script = os.path.join(site, "bin", "spark-keras")
    helped = subprocess.run([script, "score", "--help"], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr[-3000:]
    for option in ("--model", "--input", "--output", "--features", "--master", "--remote",
                   "--batch-size", "--on-invalid", "--overwrite", "--format"):
        assert option in helped.stdout, option
    where = subprocess.run([PYTHON, "-m", "spark_keras", "job-file", "score"], cwd=cwd,
                           env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-3000:]
    assert where.stdout.strip() == os.path.join(site, "spark_keras", "jobs", "score", "main.py")
    assert os.path.isfile(where.stdout.strip())
    conf = subprocess.run([script, "conf"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert conf.returncode == 0, conf.stderr[-3000:]
    with open(os.path.join(REPO_ROOT, "conf", "spark-defaults.conf"), encoding="utf-8") as f:
        assert conf.stdout == f.read()  # the installed copy is the repository's
    assert "spark.python.daemon.module" in conf.stdout


PROBE = '''"""Preloaded by the Spark workers' daemon: where its spark_keras comes from."""
import json, os, sys
with open(os.path.join(os.environ["PROBE_OUT"], f"worker-{os.getpid()}.json"), "w") as f:
    json.dump({"spark_keras": sys.modules["spark_keras"].__file__}, f)
'''


@pytest.mark.slow
def test_installed_job_scores_through_spark_submit(installed, payload):
    """spark-submit of the installed job's file with conf/spark-defaults.conf, as the
    docs' "Deploying" says: the driver and the Python workers import spark_keras from the
    installed copy, not the checkout. And quiet (the `make demo` path, whose jobs/score.py
    wraps this job): the driver imports TensorFlow, so does each executor's preloading
    worker daemon, and neither prints TensorFlow's start-up lines (tests/test_quiet.py)."""
    import spark_keras as sk
    from tests.test_quiet import noise

    site, cwd = installed["site"], installed["cwd"]
    x = np.random.default_rng(5).standard_normal((120, 4)).astype("float32")
    pd.DataFrame({"id": np.arange(120), "features": list(x)}).to_parquet(
        cwd / "in.parquet", index=False)
    probe_dir, probe_out = cwd / "probe", cwd / "probe-out"
    probe_dir.mkdir()
    probe_out.mkdir()
    (probe_dir / "where_probe.py").write_text(PROBE)
    job = subprocess.run([PYTHON, "-c", "import spark_keras.jobs as j; print(j.job_file('score'))"],
                         cwd=cwd, env=installed_env(installed), capture_output=True, text=True,
                         timeout=120).stdout.strip()
    assert job.startswith(site + os.sep), job
    workers_path = f"{site}{os.pathsep}{probe_dir}"
    cmd = [os.path.join(BIN, "spark-submit"), "--master", "local[2]",
           "--properties-file", os.path.join(REPO_ROOT, "conf", "spark-defaults.conf"),
           "--conf", "spark.ui.enabled=false",
           "--conf", f"spark.pyspark.python={PYTHON}",
           "--conf", f"spark.executorEnv.PYTHONPATH={workers_path}",
           "--conf", "spark.executorEnv.SPARK_KERAS_PRELOAD=where_probe",
           "--conf", f"spark.executorEnv.PROBE_OUT={probe_out}",
           job, "--model", payload, "--input", "in.parquet", "--output", "scored",
           "--features", "features", "--batch-size", "32"]
    proc = subprocess.run(cmd, cwd=cwd, env=installed_env(installed), capture_output=True,
                          text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert any(line.startswith("SCORED rows=120 ") for line in proc.stdout.splitlines()), output[-3000:]
    assert "using the stock PySpark daemon" not in output, output[-4000:]
    assert noise(output) == [], output[-4000:]
    assert "py4j" not in output  # the job logs spark_keras's INFO lines, not py4j's
    workers = [json.loads(p.read_text()) for p in probe_out.glob("worker-*.json")]
    assert workers, output[-3000:]
    assert all(w["spark_keras"].startswith(site + os.sep) for w in workers), workers
    scored = pd.read_parquet(cwd / "scored").sort_values("id")
    assert scored["id"].tolist() == list(range(120))
    model = sk.load(payload)
    np.testing.assert_allclose(scored["prediction"].to_numpy(), np.asarray(model(x))[:, 0],
                               atol=1e-5)  # one output unit: a scalar column


# --- shipped environments (docs/guide/deploying.md) -------------------------------------

ENV_SCRIPT = textwrap.dedent('''
    import json, os, sys, numpy as np, keras
    from pyspark.sql import SparkSession
    import spark_keras as sk

    confs = json.loads(sys.argv[1])
    builder = SparkSession.builder.master("local-cluster[1,1,1024]").config("spark.ui.enabled", "false")
    for key, value in confs.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def where(_):
        import spark_keras
        yield json.dumps([sys.prefix, spark_keras.__file__])

    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(where).collect()
    print("WORKERS", json.dumps([json.loads(s) for s in seen]))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.arange(12, dtype="float32").reshape(4, 3)
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(4)], "id long, f array<float>")
    out = sk.BroadcastModel(spark, model).transform(df, "f").orderBy("id").toPandas()
    np.testing.assert_allclose(np.stack(out["prediction"]), model(x).numpy(), atol=1e-5)
    print("ENV-OK")
    if len(sys.argv) > 2:  # then a second SparkContext in this driver, with these settings
        spark.stop()
        builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
        for key, value in json.loads(sys.argv[2]).items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        try:
            sk.BroadcastModel(spark, model)
        except sk.SparkKerasError as exc:
            print("REFUSED", exc)
''')


def _run_env_job(folder, confs: dict, then: dict | None = None) -> tuple[list, str]:
    """The job's workers (prefix, spark_keras's file) and its output; ``then``: the
    settings of a second SparkContext the driver starts after the first one stopped
    (its JVM kept: no second driver to start), which ships the model again."""
    script = folder / "job.py"
    script.write_text(ENV_SCRIPT)
    # a driver started by python (not spark-submit) takes the workers' Python from PYSPARK_PYTHON
    env = dict(os.environ, PYSPARK_PYTHON=confs["spark.pyspark.python"], PYSPARK_DRIVER_PYTHON=PYTHON,
               TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    args = [json.dumps(confs)] + ([json.dumps(then)] if then is not None else [])
    proc = subprocess.run([PYTHON, str(script), *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and "ENV-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("WORKERS "))
    return json.loads(line[len("WORKERS "):]), proc.stdout + proc.stderr[-3000:]


def _bare_venv(path) -> str:
    """A Python environment without spark_keras: executors whose image has TensorFlow and
    PySpark (this venv's site-packages, through PYTHONPATH) but not the package."""
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(path)],
                   check=True, timeout=120)
    return str(path)


def _deps_path() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


@pytest.mark.slow
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_a_packed_environment_shipped_with_spark_archives(installed, tmp_path):
    pytest.importorskip("venv_pack")
    env = _bare_venv(tmp_path / "env")
    site = subprocess.run([f"{env}/bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([PYTHON, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                    installed["wheel"]], check=True, timeout=300)
    archive = tmp_path / "env.tar.gz"
    subprocess.run([os.path.join(os.path.dirname(PYTHON), "venv-pack"), "-p", env, "-o", str(archive)],
                   check=True, timeout=300, capture_output=True)
    workers, _ = _run_env_job(tmp_path, {
        "spark.archives": f"{archive}#environment",
        "spark.pyspark.python": "./environment/bin/python",
        "spark.executorEnv.PYTHONPATH": _deps_path(),  # TensorFlow, PySpark: the executors' image
        "spark.python.daemon.module": "spark_keras.executor.daemon",  # importable: installed there
    })
    for prefix, module in workers:
        assert prefix.endswith("environment") and module.startswith(prefix), (prefix, module)


@pytest.mark.slow
def test_py_files_with_the_stock_daemon_and_a_clear_error_with_the_preloading_one(installed, tmp_path):
    zipped = shutil.make_archive(str(tmp_path / "spark_keras"), "zip", installed["site"], "spark_keras")
    env = _bare_venv(tmp_path / "bare")
    confs = {"spark.submit.pyFiles": zipped, "spark.pyspark.python": f"{env}/bin/python",
             "spark.executorEnv.PYTHONPATH": _deps_path()}
    # the same driver then starts a SparkContext with spark_keras's daemon beside the zip
    # (the workers' Python has the package: only the driver's check can refuse it)
    then = {"spark.submit.pyFiles": zipped, "spark.pyspark.python": PYTHON,
            "spark.python.daemon.module": "spark_keras.executor.daemon"}
    workers, output = _run_env_job(tmp_path, confs, then)
    assert all(prefix == env and "spark_keras.zip" in module for prefix, module in workers), workers
    assert "REFUSED spark.python.daemon.module=spark_keras.executor.daemon, but spark_keras reaches the " \
           "executors through --py-files" in output, output


# --- a real standalone cluster (docs/guide/deploying.md) -----------------------------------

def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _json(url: str, timeout: float = 2.0) -> dict:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A Spark standalone master and two workers (1 core, 1 GiB each), started with
    ``spark-class`` as the docs' "Deploying" says, stopped afterwards: the master's URL."""
    import time

    folder = tmp_path_factory.mktemp("standalone")
    port, ui = _free_port(), _free_port()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    spark_class = os.path.join(BIN, "spark-class")
    started = []

    def start(*args: str, log: str) -> None:
        with open(folder / log, "w") as out:
            started.append(subprocess.Popen([spark_class, *args], env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True))

    master = f"spark://127.0.0.1:{port}"
    try:
        start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
              str(port), "--webui-port", str(ui), log="master.log")
        for i in range(2):
            start("org.apache.spark.deploy.worker.Worker", master, "--cores", "1", "--memory",
                  "1g", "--webui-port", str(_free_port()), "--work-dir", str(folder / f"work-{i}"),
                  log=f"worker-{i}.log")
        deadline = time.monotonic() + 120
        while True:
            try:
                if len([w for w in _json(f"http://127.0.0.1:{ui}/json/")["workers"]
                        if w["state"] == "ALIVE"]) == 2:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (folder / "master.log").read_text()[-3000:]
            time.sleep(1)
        yield {"master": master, "ui": ui, "folder": folder}
    finally:
        for proc in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow  # a master, two workers and a job: about 90 s
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_installed_job_on_a_standalone_cluster(installed, payload, standalone):
    """spark-submit --master spark://... of the installed job, on two workers of a real
    standalone cluster; no spark.pyspark.python given: the executors run the job's own
    Python, which the job sets. Predictions equal the model's on the same batches."""
    import spark_keras as sk
    from spark_keras.inference import predictor_for

    site, cwd = installed["site"], installed["cwd"]
    x = np.random.default_rng(9).standard_normal((200, 4)).astype("float32")
    pd.DataFrame({"id": np.arange(200), "features": list(x)}).to_parquet(
        cwd / "cluster-in.parquet", index=False)
    job = os.path.join(site, "spark_keras", "jobs", "score", "main.py")
    env = installed_env(installed)
    env.pop("PYSPARK_PYTHON")  # the job's default: its own interpreter for the executors
    cmd = [os.path.join(BIN, "spark-submit"), "--master", standalone["master"],
           "--conf", f"spark.executorEnv.PYTHONPATH={site}", "--conf", "spark.executor.memory=512m",
           job, "--model", payload, "--input", str(cwd / "cluster-in.parquet"),
           "--output", str(cwd / "cluster-scored"), "--features", "features",
           "--batch-size", "32", "--metrics-json", str(cwd / "cluster-metrics.json")]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert any(line.startswith("SCORED rows=200 ") for line in proc.stdout.splitlines()), output
    apps = _json(f"http://127.0.0.1:{standalone['ui']}/json/")["completedapps"]
    assert [a["name"] for a in apps] == ["spark-keras-score"], apps  # it ran on this cluster
    scored = pd.read_parquet(cwd / "cluster-scored").sort_values("id")
    assert scored["id"].tolist() == list(range(200))
    model = sk.load(payload)
    # one parquet file, one partition: the workers' batches of 32 rows, bit for bit
    want = predictor_for(model)([x], 32)[0][:, 0]
    np.testing.assert_array_equal(scored["prediction"].to_numpy(), want)
