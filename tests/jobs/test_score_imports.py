"""The score job and the user's own layers (issue 55, items 1 and 2): ``--import MODULE``
(a module name, a ``.py`` file or a package folder, shipped to the executors), the short
line for a class no module registers, ``--unsafe-deserialization`` for ``Lambda`` layers,
and the installed ``spark-keras score`` scoring such a model from another working folder
with relative paths on ``--remote local[2]`` (classic ``local[2]``: test_score_job)."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
import textwrap
import zipfile

import keras
import numpy as np
import pandas as pd
import pytest

from spark_keras.errors import PayloadError
from spark_keras.jobs.score import imports
from spark_keras.jobs.score.errors import USAGE, JobError, outcome
from spark_keras.jobs.score.imports import explain_load_failure, import_modules, registered_objects
from spark_keras.payload.stored import load_keras
from tests.conftest import local_connect_server
from tests.jobs.scored_line import assert_built_once_per_worker, summary

LAYERS = textwrap.dedent('''
    import keras


    @keras.saving.register_keras_serializable(package="{package}")
    class GatedResidual(keras.layers.Layer):
        """x + sigmoid(gate(x)) * dense(x)."""

        def __init__(self, units=4, **kwargs):
            super().__init__(**kwargs)
            self.units = units

        def build(self, input_shape):
            self.dense = keras.layers.Dense(self.units)
            self.gate = keras.layers.Dense(self.units)
            self.dense.build(input_shape)
            self.gate.build(input_shape)

        def call(self, x):
            return x + keras.ops.sigmoid(self.gate(x)) * self.dense(x)

        def get_config(self):
            return {{**super().get_config(), "units": self.units}}
''')


def _module(folder, name: str, package: bool = False):
    """A module ``name`` defining and registering ``GatedResidual`` in ``folder``: a
    ``.py`` file, or a package folder; imported here."""
    if package:
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(f"from {name}.layers import GatedResidual\n")
        (folder / name / "layers.py").write_text(LAYERS.format(package=name))
    else:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.py").write_text(LAYERS.format(package=name))
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def test_import_takes_a_file_a_package_folder_or_a_name_and_finds_their_layers(tmp_path):
    """A ``.py`` file and a package folder are imported from their folders, their
    registered classes found by registered name; the folder is zipped as ``name/...``;
    a missing module or file stops the job naming it."""
    _module(tmp_path / "src", "sk55_file_layers")
    _module(tmp_path / "src", "sk55_pkg_layers", package=True)
    found = import_modules([str(tmp_path / "src" / "sk55_file_layers.py"),
                            str(tmp_path / "src" / "sk55_pkg_layers"), "json"])
    assert [item.name for item in found] == ["sk55_file_layers", "sk55_pkg_layers", "json"]
    objects = registered_objects(found)
    assert sorted(objects) == ["sk55_file_layers>GatedResidual", "sk55_pkg_layers>GatedResidual"]
    with zipfile.ZipFile(imports._zipped(found[1])) as archive:
        assert sorted(archive.namelist()) == ["sk55_pkg_layers/__init__.py",
                                              "sk55_pkg_layers/layers.py"]
    with pytest.raises(JobError, match=r"--import 'sk55_nowhere': cannot import 'sk55_nowhere': "
                                       r"ModuleNotFoundError"):
        import_modules(["sk55_nowhere"])
    with pytest.raises(JobError, match="no such .py file or package folder"):
        import_modules([str(tmp_path / "gone.py")])



def test_an_imported_files_folder_is_not_put_on_sys_path(tmp_path):
    """A ``.py`` file is imported from its path alone: its folder (here one anyone may
    write, as /tmp) is not put first on the driver's ``sys.path``, where a module planted
    beside the file ran, as the job's user, as soon as anything imported that name."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    (shared / "sk55_beside.py").write_text(LAYERS.format(package="sk55_beside"))
    (shared / "sk55_planted.py").write_text("raise SystemExit('planted code ran')\n")
    before = list(sys.path)
    found = import_modules([str(shared / "sk55_beside.py")])
    assert sys.path == before
    assert list(registered_objects(found)) == ["sk55_beside>GatedResidual"]
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("sk55_planted")


@pytest.mark.parametrize("name", ["json", "keras", "spark_keras"])
def test_an_import_named_like_another_module_is_refused(tmp_path, name):
    """A file named like a module found here (Python's json, an installed package): it was
    not imported at all (the other module was, silently, and the model then said its
    class was not registered), and shipped it would hide that module on the executors."""
    (tmp_path / f"{name}.py").write_text(LAYERS.format(package=f"sk55_{name}"))
    with pytest.raises(JobError, match=rf"--import '.*{name}.py': a module '{name}' is already "
                                       rf"found here \(/.*\), .*; give your module another name"):
        import_modules([str(tmp_path / f"{name}.py")])
    assert not any(key.startswith(f"sk55_{name}>") for key in keras.saving.get_custom_objects())


@pytest.mark.parametrize("how", ["another user's file", "a file others may write",
                                 "a package with another user's module"])
def test_an_import_another_user_may_have_written_is_refused(tmp_path, how):
    """The job runs the module as its own user (on the driver and the executors): a .py
    file or package of another user's, or one every user may write, is refused before it
    runs, naming the file; nothing of it is imported."""
    from tests.other_user import give_to_other_user

    name = f"sk55_foreign_{how.split()[1].replace(chr(39), '')}_{len(how)}"
    if how.startswith("a package"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"from {name}.layers import GatedResidual\n")
        (tmp_path / name / "layers.py").write_text(LAYERS.format(package=name))
        give_to_other_user(tmp_path / name / "layers.py")
        given, bad = tmp_path / name, tmp_path / name / "layers.py"
    else:
        given = bad = tmp_path / f"{name}.py"
        bad.write_text(LAYERS.format(package=name))
        if how == "another user's file":
            give_to_other_user(bad)
        else:
            bad.chmod(0o666)
    said = "is owned by user .spark-keras-other." if "user's" in how else \
        r"is writable by others \(mode 0666\)"
    with pytest.raises(JobError, match=rf"--import '{given}': '{bad}' {said}: the job would run "
                                       rf"code another user may have written"):
        import_modules([str(given)])
    assert name not in sys.modules

def test_a_class_no_module_registers_and_a_lambda_are_one_short_line(tmp_path):
    """What the job says when Keras cannot rebuild the model here: the class it cannot
    locate and --import, in one short line (Keras's own text is ~1,500 characters); a
    Lambda layer: --unsafe-deserialization, not safe_mode=False, which the job has not."""
    layers = _module(tmp_path / "src", "sk55_unregistered")
    model = keras.Sequential([keras.Input((4,)), layers.GatedResidual(4), keras.layers.Dense(1)])
    model.save(tmp_path / "custom.keras")
    registry = keras.saving.get_custom_objects()
    kept = registry.pop("sk55_unregistered>GatedResidual")  # as in a fresh process
    try:
        with pytest.raises(PayloadError) as caught:
            load_keras(str(tmp_path / "custom.keras"), None, True)
    finally:
        registry["sk55_unregistered>GatedResidual"] = kept
    assert len(str(caught.value)) > 1000
    said = explain_load_failure(str(caught.value))
    assert said is not None and "'GatedResidual'" in said and "--import MODULE" in said
    assert len(said) < 250, said

    keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t * 2.0)]).save(
        tmp_path / "lambda.keras")
    with pytest.raises(PayloadError) as caught:
        load_keras(str(tmp_path / "lambda.keras"), None, True)
    said = explain_load_failure(str(caught.value))
    assert said is not None and "--unsafe-deserialization" in said and "safe_mode" not in said


def test_a_module_the_executors_cannot_import_is_a_line_naming_import():
    """A worker's ``No module named 'mylayers'`` (a module imported on the driver only, by
    name): exit 2, saying how to ship it, not an internal failure."""
    with pytest.raises(ModuleNotFoundError) as caught:
        importlib.import_module("sk55_only_on_the_driver.layers")
    line, status = outcome(caught.value)
    assert status == USAGE, line
    assert line == ("the executors' Python cannot import 'sk55_only_on_the_driver': ship a local "
                    "module to them with --import PATH/TO/sk55_only_on_the_driver.py (or its "
                    "package folder), or install it there")


@pytest.mark.parametrize("how", ["a file", "a name"])
def test_the_job_file_run_as_a_script_imports_the_users_module_not_its_own(tmp_path, how):
    """``python "$(spark-keras job-file score)"`` (what spark-submit runs): Python puts the
    file's folder, the job's own modules (session, run, errors...), first on sys.path. A
    user's ``--import session`` then got the job's ``session`` silently, and ``./session.py``
    was refused as named like it. The user's module is imported (it raises here, before
    any Spark starts, to say so)."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "session.py").write_text("raise RuntimeError('the user session module ran')\n")
    keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]).save(tmp_path / "m.keras")
    pd.DataFrame({"f": [[0.0, 1.0]]}).to_parquet(tmp_path / "in.parquet", index=False)
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYTHONPATH")}
    if how == "a name":
        env["PYTHONPATH"] = str(mods)
    from spark_keras.jobs import job_file

    spec = "session" if how == "a name" else str(mods / "session.py")
    proc = subprocess.run([sys.executable, job_file("score"), "--model", str(tmp_path / "m.keras"),
                           "--input", str(tmp_path / "in.parquet"), "--output",
                           str(tmp_path / "out"), "--features", "f", "--master", "local[1]",
                           "--import", spec], env=env, capture_output=True, text=True,
                          timeout=300)
    assert "the user session module ran" in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode != 0 and not (tmp_path / "out").exists()


@pytest.mark.slow  # a whole job on a Connect server of its own: 1-2 minutes here
@pytest.mark.parametrize("where", ["connect"])  # classic: test_score_job's null-policy job
def test_the_installed_command_scores_custom_and_lambda_layers_from_another_folder(
        tmp_path, where):
    """A model with a registered custom layer (its module in a folder of its own, not on
    any path) and a Lambda layer, scored by the installed ``spark-keras score`` run from
    another working folder with ``--import`` (a package folder; a .py file on classic:
    test_score_job) and ``--unsafe-deserialization``, every path relative to that folder
    (on ``--remote local[2]`` the server and the client must agree on what they mean),
    over an old output (``--overwrite``): the predictions are the model's, the SCORED
    figures say one build per worker (observed through the Connect server), and no build
    log or staging folder is left."""
    name = f"sk55_{where}_layers"
    layers = _module(tmp_path / "src", name, package=where == "connect")
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), layers.GatedResidual(4),
                              keras.layers.Lambda(lambda t: t * 2.0), keras.layers.Dense(2)])
    model.save(tmp_path / "model.keras")
    x = np.random.default_rng(5).standard_normal((64, 4)).astype("float32")
    pd.DataFrame({"id": np.arange(64), "features": list(x)}).to_parquet(tmp_path / "in.parquet",
                                                                       index=False)
    out = tmp_path / "out"
    out.mkdir()
    pd.DataFrame({"stale": [7, 8, 9]}).to_parquet(out / "part-old.parquet", index=False)
    module = tmp_path / "src" / (name if where == "connect" else f"{name}.py")
    elsewhere, job_tmp = tmp_path / "elsewhere", tmp_path / "job-tmp"  # the job's temporary folders
    elsewhere.mkdir()
    job_tmp.mkdir()
    before = set(os.listdir(tmp_path))
    command = os.path.join(os.path.dirname(sys.executable), "spark-keras")
    argv = [command, "score", "--model", "../model.keras", "--input", "../in.parquet",
            "--output", "../out", "--features", "features", "--batch-size", "16",
            "--overwrite", "--import", os.path.relpath(module, elsewhere),
            "--unsafe-deserialization",
            *(["--remote", "local[2]"] if where == "connect" else ["--master", "local[2]"])]
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "SPARK_KERAS_BUILD_LOG", "PYTHONPATH")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(job_tmp))
    with local_connect_server() if where == "connect" else contextlib.nullcontext():
        proc = subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--unsafe-deserialization: the model's Lambda layers run their Python code" in proc.stderr
    figures = summary(proc)
    assert figures["rows"] == 64 and figures["invalid_rows"] == 0
    assert_built_once_per_worker(figures)
    assert not list(job_tmp.glob("spark_keras_builds_*"))  # no build log folder
    assert set(os.listdir(tmp_path)) == before  # no staging folder left
    assert not (out / "part-old.parquet").exists()
    scored = pd.read_parquet(out).sort_values("id")  # only the new data
    assert list(scored.columns) == ["id", "features", "prediction"]
    assert scored["id"].tolist() == list(range(64))
    np.testing.assert_allclose(np.stack(scored["prediction"].to_numpy()),
                               model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)
