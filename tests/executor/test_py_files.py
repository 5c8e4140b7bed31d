"""``--py-files`` beside the preloading daemon: refused only when an entry holds the
spark_keras package (the daemon starts before a task puts the entry on ``sys.path``),
decided by what the entry holds, not by its name."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.executor.environment import _holds_package
from tests import models
from tests.conftest import REPO_ROOT, make_spark

USER_MODULE = "def double(x):\n    return 2 * x\n"


def test_an_entry_holds_the_package_by_its_content_not_its_name(tmp_path):
    own = tmp_path / "spark_keras_udfs.py"
    own.write_text(USER_MODULE)
    own_zip = tmp_path / "spark_keras_helpers.zip"
    with zipfile.ZipFile(own_zip, "w") as z:
        z.writestr("spark_keras_udfs.py", USER_MODULE)
    package_zip = tmp_path / "deps.zip"
    with zipfile.ZipFile(package_zip, "w") as z:
        z.write(os.path.join(REPO_ROOT, "spark_keras", "__init__.py"), "spark_keras/__init__.py")
    nested_zip = tmp_path / "nested.zip"  # not importable from the zip's root
    with zipfile.ZipFile(nested_zip, "w") as z:
        z.writestr("vendor/spark_keras/__init__.py", "")
    assert not _holds_package(str(own)) and not _holds_package(f"file://{own}")
    assert not _holds_package(str(own_zip)) and not _holds_package(str(nested_zip))
    assert _holds_package(str(package_zip)) and _holds_package(f"file://{package_zip}")
    assert _holds_package(f" local:{package_zip}")
    assert _holds_package(REPO_ROOT)  # a folder holding spark_keras/
    assert _holds_package(os.path.join(REPO_ROOT, "spark_keras"))  # the package's own folder
    assert not _holds_package(str(tmp_path))
    assert not _holds_package("hdfs://namenode/apps/spark_keras.zip")  # not readable here
    assert not _holds_package(str(tmp_path / "spark_keras_missing.py"))


def test_a_handle_can_be_destroyed_after_its_session_stopped(build_log):
    """A fixture or ``finally`` that releases a handle after ``spark.stop()`` (the
    broadcast went with the SparkContext) must not fail with Spark's NullPointerException."""
    session = make_spark("local[1]", build_log)
    bm = sk.BroadcastModel(session, models.mlp(3, 4, 2))
    session.stop()
    bm.destroy()
    with pytest.raises(sk.SparkKerasError, match="was destroyed"):
        bm.check_usable()


@pytest.fixture(scope="module")
def spark_with_own_module(build_log, tmp_path_factory):
    folder = tmp_path_factory.mktemp("py-files")
    (folder / "spark_keras_udfs.py").write_text(USER_MODULE)
    session = make_spark("local[1]", build_log, **{
        "spark.submit.pyFiles": str(folder / "spark_keras_udfs.py"),
        "spark.python.daemon.module": "spark_keras.executor.daemon"})
    yield session
    session.stop()


@pytest.mark.slow  # a Spark session of its own
def test_a_users_module_named_spark_keras_something_beside_the_preloading_daemon(
        spark_with_own_module):
    spark = spark_with_own_module
    model = models.mlp(3, 4, 2)
    x = np.arange(6, dtype="float32").reshape(2, 3)
    bm = sk.BroadcastModel(spark, model)  # refused before: the file's name starts spark_keras
    try:
        df = spark.createDataFrame([(i, r) for i, r in enumerate(x.tolist())], "id long, f array<float>")
        got = [r.prediction for r in bm.transform(df, "f").orderBy("id").collect()]
        np.testing.assert_allclose(np.array(got), model(x, training=False).numpy(), atol=1e-5)

        def doubled(rows):
            import spark_keras_udfs  # the user's module, shipped with --py-files

            return [spark_keras_udfs.double(r) for r in rows]

        assert spark.sparkContext.parallelize([1, 2], 1).mapPartitions(doubled).collect() == [2, 4]
    finally:
        bm.destroy()
