"""Shared fixtures. Tests use real Keras models, real Spark, real processes."""

from __future__ import annotations

import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Spark's Python workers must run this interpreter (the venv's), not the system one.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every JVM the tests start compiles with C1 alone (no C2): a test's JVM lives seconds to
# minutes, where C2's compilations cost more CPU than they give back. Measured here: a
# session's start, a model shipped and ten small transforms, 29-36 s of the driver JVM's
# CPU with tiered compilation, 17-19 s with C1 alone. Drivers (PySpark's gateway and
# spark-submit read SPARK_SUBMIT_OPTS) and executors (spark.executor.defaultJavaOptions,
# below). Benchmarks keep the JVM's defaults.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
os.environ.setdefault("SPARK_SUBMIT_OPTS", JVM_OPTIONS)
# Credentials for the S3-compatible test server (tests.s3_server); every Spark JVM and
# Python worker inherits them from here. No real AWS account is involved.
for _name, _value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                      "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
    os.environ.setdefault(_name, _value)


def _temporary_spark_home() -> None:
    """Point SPARK_HOME at a temporary folder of links to the installed PySpark's files,
    removed at exit. A local-cluster worker writes its executors' logs and files under
    ``$SPARK_HOME/work``, ignoring SPARK_WORKER_DIR (LocalSparkCluster gives its workers
    no work dir): without this every local-cluster test run would leave a folder in the
    venv's ``pyspark/work``. A SPARK_HOME already set is kept."""
    import atexit
    import importlib.util
    import shutil
    import tempfile

    spec = importlib.util.find_spec("pyspark") if "SPARK_HOME" not in os.environ else None
    if spec is None or not spec.origin:
        return
    installed = os.path.dirname(spec.origin)
    home = tempfile.mkdtemp(prefix="spark-keras-tests-spark-home-")
    for entry in os.listdir(installed):
        if entry != "work":
            os.symlink(os.path.join(installed, entry), os.path.join(home, entry))
    os.environ["SPARK_HOME"] = home
    atexit.register(shutil.rmtree, home, ignore_errors=True)


_temporary_spark_home()

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Python workers fork from the preloading daemon, as conf/spark-defaults.conf recommends;
# SPARK_KERAS_TEST_DAEMON=pyspark.daemon runs the suite on the stock one.
DAEMON = os.environ.get("SPARK_KERAS_TEST_DAEMON", "spark_keras.executor.daemon")


# The local[2] session the modules share (the ``spark`` fixture): starting one costs ~25 s
# here (the JVM, then each daemon's TensorFlow import), about 20 modules use it. A module
# that needs a session of its own (make_spark) stops it first; the next module that asks
# for ``spark`` starts it again. Every module's builds and daemon reports go to one folder
# (``build_log``): the tests read them by model key and worker pid.
_SHARED: dict[str, object] = {}


def _alive(session) -> bool:
    from pyspark import SparkContext

    sc = getattr(session, "_sc", None)
    return sc is not None and sc._jsc is not None and SparkContext._active_spark_context is sc


def _stop_shared() -> None:
    session = _SHARED.pop("session", None)
    if session is not None and _alive(session):
        session.stop()


def make_spark(master: str, build_log: str, **conf: str):
    """A real SparkSession whose Python workers run this interpreter and log builds (and
    whose worker daemons report themselves) in ``build_log``. The shared session is
    stopped first: ``getOrCreate`` would hand it back, whatever ``master`` and ``conf``."""
    _stop_shared()
    return _new_spark(master, build_log, **conf)


def _new_spark(master: str, build_log: str, **conf: str):
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # The JVM is started once per process, with the first session's settings as its
    # system properties, which every later SparkConf of the process loads: started by a
    # module's session of fake GPUs (a pytest worker's first module), every later local[2]
    # session asked each task for a GPU and hung. Started here with none.
    SparkContext._ensure_initialized()

    builder = (SparkSession.builder.master(master).appName("spark-keras-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.executorEnv.PYTHONPATH", REPO_ROOT)
               .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
               .config("spark.executorEnv.SPARK_KERAS_BUILD_LOG", build_log)
               .config("spark.python.daemon.module", DAEMON)
               .config("spark.executor.defaultJavaOptions", JVM_OPTIONS)
               .config("spark.executorEnv.SPARK_KERAS_DAEMON_REPORT", build_log))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def build_log(tmp_path_factory) -> str:
    """The folder of every session's build records and daemon reports (by key and pid)."""
    return str(tmp_path_factory.mktemp("build-log"))


@pytest.fixture(scope="module")
def spark(build_log):
    """The shared local[2] session (see ``_SHARED``), started if no module has it running."""
    session = _SHARED.get("session")
    if session is None or not _alive(session):
        session = _SHARED["session"] = _new_spark("local[2]", build_log)
    return session


def pytest_collection_modifyitems(session, config, items):
    """The modules that use the shared session first, then the others, each group the
    modules with most cases first (how pytest-xdist orders files by default): a module
    with a session of its own in between would stop the shared one, and the next would
    start it again (its context and its workers' TensorFlow imports, ~15-25 s each time).
    Under ``--dist loadfile`` xdist keeps this order only with ``--no-loadscope-reorder``
    (the Makefile's test targets pass it): otherwise it sorts the files by size alone."""
    def shared(item) -> bool:
        defs = getattr(item, "_fixtureinfo", None) and item._fixtureinfo.name2fixturedefs.get("spark")
        return bool(defs) and defs[-1].func.__module__ == __name__

    modules: dict = {}
    for item in items:
        modules.setdefault(item.module, []).append(item)
    uses = {m: any(shared(i) for i in group) for m, group in modules.items()}
    order = sorted(modules, key=lambda m: (not uses[m], -len(modules[m])))  # stable
    items[:] = [i for m in order for i in modules[m]]


@pytest.fixture(scope="session", autouse=True)
def _stop_the_shared_session():
    yield
    _stop_shared()


def daemon_reports(folder: str) -> dict[int, dict]:
    """The reports of the preloading daemons that wrote to ``folder``, by pid."""
    import glob
    import json

    found = [json.load(open(p)) for p in glob.glob(os.path.join(folder, "daemon-*.json"))]
    return {r["pid"]: r for r in found}


def preloaded_daemons(spark, folder: str, partitions: int = 8) -> list[dict]:
    """The reports of the daemons that forked this session's RDD workers; fails unless
    every worker forked from a daemon that preloaded safely."""
    def parent(_):
        yield os.getppid()

    parents = set(spark.sparkContext.parallelize(range(partitions), partitions)
                  .mapPartitions(parent).collect())
    reports = daemon_reports(folder)
    assert parents and parents <= set(reports), (parents, reports)
    chosen = [reports[pid] for pid in sorted(parents)]
    assert all(r["refused"] is None for r in chosen), chosen
    return chosen


def builds_by_worker(build_log: str, key: str) -> dict[tuple[str, int], int]:
    """How many times each Python worker process built the model ``key``."""
    from collections import Counter

    from spark_keras.cache import read_build_log

    return dict(Counter((r["host"], r["pid"]) for r in read_build_log(build_log) if r["key"] == key))


def text_frame(spark, texts):
    """A DataFrame ``id long, text string`` with one row per text (None: a null)."""
    return spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "id long, text string")


def build_records(build_log: str, key: str) -> list[dict]:
    """Every build of the model ``key`` logged by the Python workers (with its weight
    memory: ``shared``, ``private_bytes``...); unlike :func:`worker_cache_infos`, it does
    not depend on the workers still being alive."""
    from spark_keras.cache import read_build_log

    return [r for r in read_build_log(build_log) if r["key"] == key]


def worker_cache_infos(spark, handle=None, sql: bool = True) -> dict[int, dict]:
    """``cache_info()`` from live Python workers, by pid. Spark keeps separate worker
    pools for SQL (Arrow) and RDD tasks: ask the pool the scoring used. Passing a handle
    ships it (and the keys of released handles) to every task."""
    import json

    import spark_keras as sk

    if not sql:
        def info(_):
            if handle is not None:
                handle.release_stale()  # workers drop released models
            return sk.cache_info()

        found = spark.sparkContext.parallelize(range(16), 16).map(info).collect()
        return {i["pid"]: i for i in found}

    import pyarrow as pa

    def report(batches):
        if handle is not None:
            handle.release_stale()  # workers drop released models
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(sk.cache_info())])], names=["info"])

    rows = spark.range(16, numPartitions=16).mapInArrow(report, "info string").collect()
    found = [json.loads(r.info) for r in rows]
    return {i["pid"]: i for i in found}


def submit_score_job(*args: str, timeout: int = 300, **env: str):
    """``spark-submit jobs/score.py ARGS`` on local[2] with conf/spark-defaults.conf, in
    this process's environment plus ``env``."""
    import subprocess

    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               **env)
    cmd = [spark_submit, "--master", "local[2]", "--properties-file",
           os.path.join(REPO_ROOT, "conf", "spark-defaults.conf"),
           os.path.join(REPO_ROOT, "jobs", "score.py"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def run_script(folder, source: str, marker: str, timeout: int = 280) -> None:
    """Run ``source`` as a fresh ``__main__`` script (the user-story shape) and check it
    printed ``marker``; the repository is importable, nothing else is shared."""
    import subprocess

    script = folder / "script.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(script)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and marker in proc.stdout, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def s3():
    """A real S3-compatible server (moto), started and stopped around the module."""
    pytest.importorskip("moto.server")
    from tests.s3_server import S3Server

    with S3Server() as server:
        yield server


@contextlib.contextmanager
def local_connect_server():
    """Held while a local Spark Connect server of this test run lives. Local servers all
    listen on port 15002, so pytest runs side by side (.ci/run runs ``make test`` beside
    ``make test-slow``) take turns: a client must never reach another run's server."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "spark-keras-tests-connect.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_score_job(*args: str, cwd=None, timeout: int = 300, server: bool = True, **env: str):
    """``python jobs/score.py ARGS`` (no spark-submit: how a Spark Connect client runs it)
    in this process's environment, less any SPARK_REMOTE / SPARK_KERAS_BUILD_LOG, plus
    ``env``; with a local Connect server (``--remote local...`` or ``SPARK_REMOTE``) while
    no other test run has one. ``server=False``: a run that fails before any server
    starts, which need not wait for another run's server to go."""
    import subprocess

    inherited = {k: v for k, v in os.environ.items()
                 if k not in ("SPARK_REMOTE", "SPARK_KERAS_BUILD_LOG")}
    env = dict(inherited, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", **env)
    cmd = [sys.executable, os.path.join(REPO_ROOT, "jobs", "score.py"), *args]
    remote = env.get("SPARK_REMOTE", "")
    if "--remote" in args:
        remote = args[args.index("--remote") + 1]
    turn = local_connect_server() if server and remote.startswith("local") \
        else contextlib.nullcontext()
    with turn:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def connect():
    """A Spark Connect session on a real local server (``remote("local[2]")``: port 15002,
    one at a time); a classic session of an earlier module is stopped first."""
    pytest.importorskip("grpc")
    pytest.importorskip("zstandard")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    with local_connect_server():
        session = SparkSession.builder.remote("local[2]").getOrCreate()
        yield session
        session.stop()
