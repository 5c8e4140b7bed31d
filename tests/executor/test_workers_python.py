"""What a newcomer meets first: the executors' Python (PYSPARK_PYTHON unset, a python3 on
PATH without spark_keras), checked on the driver before any task runs."""

from __future__ import annotations

import os
import sys
import venv

import pytest

import spark_keras as sk
from spark_keras.executor import environment


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python without spark_keras (nor numpy): a venv without packages."""
    folder = tmp_path_factory.mktemp("bare")
    venv.EnvBuilder(with_pip=False).create(folder)
    return str(folder / "bin" / "python")


@pytest.fixture
def workers_python(spark, monkeypatch):
    """Set the workers' Python of the shared session for one test; restored after."""
    sc = spark.sparkContext
    before = sc.pythonExec
    monkeypatch.setattr(environment, "_checked", set())

    def use(exec_: str, chosen: bool) -> None:
        sc.pythonExec = exec_
        if chosen:
            monkeypatch.setenv("PYSPARK_PYTHON", exec_)
        else:
            monkeypatch.delenv("PYSPARK_PYTHON", raising=False)

    yield sc, use
    sc.pythonExec = before


def test_a_chosen_python_without_the_package_is_refused_naming_the_setting(
        workers_python, bare_python, spark):
    sc, use = workers_python
    use(bare_python, chosen=True)
    jobs = len(sc.statusTracker().getJobIdsForGroup(None))
    with pytest.raises(sk.SparkKerasError) as raised:
        sk.BroadcastModel(spark, sk.loads(_tiny()))
    message = str(raised.value)
    assert bare_python in message and "PYSPARK_PYTHON" in message, message
    assert "No module named" in message and "\n" not in message, message
    assert sc.pythonExec == bare_python  # a chosen Python is never replaced
    assert len(sc.statusTracker().getJobIdsForGroup(None)) == jobs  # found with no task run


def test_the_default_python3_without_the_package_is_refused_saying_the_line_to_add(
        workers_python, bare_python, spark):
    sc, use = workers_python
    use(bare_python, chosen=False)  # what PATH's python3 would be
    with pytest.raises(sk.SparkKerasError) as raised:
        sk.BroadcastModel(spark, sk.loads(_tiny()))
    message = str(raised.value)
    assert "PYSPARK_PYTHON is unset" in message, message
    assert "os.environ['PYSPARK_PYTHON'] = sys.executable" in message, message


def test_a_python_that_does_not_exist_is_refused_naming_it(workers_python, spark, tmp_path):
    """Not a probe task's Py4J line ('An error occurred while calling ...'): the path, and
    the setting, before any task."""
    sc, use = workers_python
    missing = str(tmp_path / "nowhere" / "bin" / "python3")
    use(missing, chosen=True)
    jobs = len(sc.statusTracker().getJobIdsForGroup(None))
    with pytest.raises(sk.WorkersPythonError, match="is not an executable file") as raised:
        sk.BroadcastModel(spark, sk.loads(_tiny()))
    assert missing in str(raised.value) and "PYSPARK_PYTHON" in str(raised.value)
    assert len(sc.statusTracker().getJobIdsForGroup(None)) == jobs


def test_the_package_on_the_executors_pythonpath_and_the_jvms_is_found(
        workers_python, bare_python, spark, monkeypatch, tmp_path):
    """The worker's PYTHONPATH as Spark's worker factory makes it: the executors' setting
    and the PYTHONPATH the JVM inherited are both on it (the check used the first alone
    and refused a Python that imports the package)."""
    import numpy
    import pyarrow

    sc, use = workers_python
    use(sys.executable, chosen=True)
    site = os.path.dirname(os.path.dirname(numpy.__file__))  # numpy, pyarrow, keras...
    assert os.path.dirname(os.path.dirname(pyarrow.__file__)) == site
    repo = os.path.dirname(os.path.dirname(os.path.abspath(sk.__file__)))
    env = {"PYTHONPATH": f"{tmp_path}"}  # the executors' setting: somewhere else
    monkeypatch.setenv("PYTHONPATH", repo)  # the driver's, which a local JVM inherits
    path, worker_env = environment._local_python(_FakeConf(sc, env), sys.executable)
    parts = worker_env["PYTHONPATH"].split(os.pathsep)
    assert str(tmp_path) in parts and repo in parts, parts
    assert parts.index(str(tmp_path)) < parts.index(repo)


@pytest.mark.parametrize("daemon, refused", [("spark_keras.spark.daemon", True),
                                              ("spark_keras.executor.nodaemon", True),
                                              ("spark_keras.executor.daemon", False),
                                              ("spark_keras_udfs.daemon", False)])
def test_a_daemon_setting_naming_no_spark_keras_module_is_refused_on_the_driver(
        spark, daemon, refused):
    """A ``spark.python.daemon.module`` of the layout before the components' folders
    (``spark_keras.spark.daemon``) failed at the first task, a Java trace per executor
    saying "No module named"; it is one error on the driver naming the setting and the
    daemon. A user's own ``spark_keras_udfs`` module is not judged by this Python."""
    conf = spark.sparkContext.getConf().set(environment.DAEMON_CONF, daemon)
    session = type("Context", (), {"getConf": lambda self: conf})()
    if not refused:
        environment.check_daemon(session)
        return
    with pytest.raises(sk.WorkersPythonError, match=(
            rf"spark.python.daemon.module={daemon}: spark_keras has no such module .* "
            rf"The preloading daemon is spark_keras.executor.daemon")):
        environment.check_daemon(session)


class _FakeConf:
    """``sc`` with ``spark.executorEnv.*`` added to its settings (a real SparkConf)."""

    def __init__(self, sc, executor_env: dict) -> None:
        self._conf = sc.getConf()
        for key, value in executor_env.items():
            self._conf.set(f"spark.executorEnv.{key}", value)

    def getConf(self):  # noqa: N802  (SparkContext's name)
        return self._conf


def _tiny() -> bytes:
    import keras

    return sk.dumps(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))


# The README tour's first example, run by .venv/bin/python with nothing activated (PATH's
# python3 without the package, PYSPARK_PYTHON unset): tests/test_readme.py runs the tour so.


def test_on_a_cluster_the_probe_task_fails_as_one_line_naming_the_setting(
        workers_python, bare_python):
    """What a non-local master gets: one probe task, its failure one SparkKerasError
    (here run on the shared local session, whose workers are given the bare Python)."""
    sc, use = workers_python
    use(bare_python, chosen=True)
    with pytest.raises(sk.SparkKerasError) as raised:
        environment._check_remote(sc, bare_python)
    message = str(raised.value)
    assert "cannot import spark_keras" in message and "PYSPARK_PYTHON" in message, message
    assert "\n" not in message and len(message) < 600, message
    use(sys.executable, chosen=True)
    environment._check_remote(sc, sys.executable)  # a Python that has it passes
