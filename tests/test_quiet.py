"""Quiet by default: spark_keras's own code paths add no noise to the output.

* Custom classes defined in the driver's ``__main__`` travel by value (cloudpickle), so no
  source file backs them in workers; tf-keras's AutoGraph must not warn "Unable to
  locate the source code" / "could not get source code" for them (the tf-keras case runs
  in the tf-keras leg of ``make test-compat``).
* TensorFlow's native start-up lines (absl's "All log messages before
  absl::InitializeLog() ..." notice, oneDNN's notice), printed before TensorFlow reads
  ``TF_CPP_MIN_LOG_LEVEL``, are dropped where spark_keras imports TensorFlow (the worker
  daemon's and Dask's preload, the jobs), and nothing else is.

Every case runs real processes (scripts run as ``__main__``, spawned children, Spark) and
reads what they print.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from spark_keras import flavour
from spark_keras.quiet import ABSL_BANNER
from tests.conftest import REPO_ROOT

AUTOGRAPH_NOISE = ("Unable to locate the source code", "could not get source code",
                   "AutoGraph could not transform")
STARTUP_NOISE = (ABSL_BANNER, "oneDNN custom operations are on", "cpu_feature_guard.cc")


def noise(text: str, patterns=AUTOGRAPH_NOISE + STARTUP_NOISE) -> list[str]:
    return [line for line in text.splitlines() if any(p in line for p in patterns)]


def run(folder, source: str, timeout: int = 280, **env: str) -> subprocess.CompletedProcess:
    """``source`` run as a fresh ``__main__`` script; TF_CPP_MIN_LOG_LEVEL=2 unless given."""
    script = folder / "script.py"
    script.write_text(textwrap.dedent(source))
    full_env = dict(os.environ, PYTHONPATH=REPO_ROOT, PYSPARK_PYTHON=sys.executable,
                    PYSPARK_DRIVER_PYTHON=sys.executable)
    full_env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    full_env.update(env)
    return subprocess.run([sys.executable, str(script)], cwd=folder, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# --- AutoGraph and classes shipped by value ----------------------------------------------

MAIN_CLASSES = """
import multiprocessing as mp
import sys

import cloudpickle
import numpy as np
import {keras} as keras
import spark_keras as sk
from spark_keras.multiprocessing import pool_predict


class Gate(keras.layers.Layer):                  # custom layers living in __main__
    def build(self, shape):
        self.w = self.add_weight(name="w", shape=(shape[-1],), initializer="random_normal")

    def call(self, x):
        return x * keras.activations.sigmoid(self.w)


class Sharpen(Gate):                             # ... inheriting one from __main__
    def call(self, x):
        return super().call(x) * 2.0


def predict_in_child(blob, x, results):
    model = cloudpickle.loads(blob)              # the classes by value, as Dask ships them
    results.put(model.predict(x, verbose=0))     # a tf.function, AutoGraph on


if __name__ == "__main__":
    model = keras.Sequential([keras.Input((8,)), Gate(), Sharpen(), keras.layers.Dense(3)])
    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    expected = model.predict(x, verbose=0)

    got = pool_predict(model, x, processes=1, batch_size=16)   # a spawned pool
    np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=1e-6)

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=predict_in_child,
                        args=(cloudpickle.dumps(sk.make_picklable(model)), x, results))
    child.start()
    got = results.get(timeout=200)
    child.join(60)
    assert child.exitcode == 0, child.exitcode
    assert np.array_equal(got, expected)         # the very same computation as here

    if {spark}:
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.pyspark.python", sys.executable)
                 .config("spark.python.daemon.module", "spark_keras.executor.daemon")
                 .config("spark.executorEnv.PYTHONPATH", {root!r})
                 .config("spark.executorEnv.TF_USE_LEGACY_KERAS", "1")
                 .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
                 .config("spark.executorEnv.OMP_NUM_THREADS", "1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        df = spark.createDataFrame([(i, x[i].tolist()) for i in range(len(x))],
                                   "id long, f array<float>").repartition(4)
        out = sk.BroadcastModel(spark, model).transform(df, "f").toPandas().sort_values("id")
        np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), expected,
                                   rtol=0, atol=1e-6)
        spark.stop()
    print("SHIPPED-OK")
"""


@pytest.mark.skipif(not flavour.legacy_requested(),
                    reason="tf-keras leg: run with TF_USE_LEGACY_KERAS=1")
def test_tf_keras_main_classes_reach_workers_without_autograph_warnings(tmp_path):
    # a spawned pool, a spawned child calling predict, Spark executors: every one rebuilds
    # the model with Gate and Sharpen unpickled by value (no source file behind them)
    proc = run(tmp_path, MAIN_CLASSES.format(keras="tf_keras", spark=True, root=REPO_ROOT),
               timeout=400)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SHIPPED-OK" in proc.stdout, output[-4000:]
    assert noise(output, AUTOGRAPH_NOISE) == [], output[-4000:]


@pytest.mark.slow  # a whole process or session of its own: make test-slow
@pytest.mark.skipif(flavour.legacy_requested(), reason="Keras 3 process only")
def test_keras3_main_classes_reach_workers_without_autograph_warnings(tmp_path):
    proc = run(tmp_path, MAIN_CLASSES.format(keras="keras", spark=False, root=REPO_ROOT))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "SHIPPED-OK" in proc.stdout, output[-4000:]
    assert noise(output, AUTOGRAPH_NOISE) == [], output[-4000:]


# --- TensorFlow's start-up lines -----------------------------------------------------------

PRELOAD = """
import sys
from spark_keras.preload import preload

print("before the import", file=sys.stderr, flush=True)
preload()                                        # what the worker daemon and Dask's hook run
import tensorflow as tf

print(float(tf.constant(1.0) + 1.0), "PRELOADED")
"""


@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_preload_drops_the_startup_lines_the_log_level_hides(tmp_path):
    loud = run(tmp_path, PRELOAD, TF_CPP_MIN_LOG_LEVEL="0")
    assert loud.returncode == 0 and "PRELOADED" in loud.stdout, loud.stderr[-4000:]
    if not noise(loud.stderr, STARTUP_NOISE):
        pytest.skip("this TensorFlow prints no native start-up lines")
    quiet = run(tmp_path, PRELOAD)  # TF_CPP_MIN_LOG_LEVEL=2
    assert quiet.returncode == 0 and "PRELOADED" in quiet.stdout, quiet.stderr[-4000:]
    assert "before the import" in quiet.stderr
    assert noise(quiet.stderr, STARTUP_NOISE) == [], quiet.stderr[-4000:]


FILTERED = """
import os, sys
from spark_keras.quiet import ABSL_BANNER, quiet_tensorflow_startup

with quiet_tensorflow_startup():
    print("a Python line", file=sys.stderr, flush=True)
    os.write(2, ABSL_BANNER.encode() + b"\\n")
    os.write(2, b"I0000 00:00:1796090096.918610    1928 port.cc:153] an INFO line\\n"
                b"W1201 01:55:33.123456    1928 some_file.cc:12] a WARNING line\\n"
                b"E0000 00:00:1796090096.918610    1928 some_file.cc:13] an ERROR line\\n")
    if os.environ.get("ABORT"):
        os.write(2, b"F0000 00:00:1796090096.918610    1928 some_file.cc:14] a FATAL line\\n")
        os.abort()
    os.write(2, b"a last line without newline")
print(", then after", file=sys.stderr)
"""


@pytest.mark.parametrize("level, kept", [
    ("0", [ABSL_BANNER, "an INFO line", "a WARNING line", "an ERROR line"]),
    ("1", ["a WARNING line", "an ERROR line"]),
    ("2", ["an ERROR line"]),
])
def test_startup_filter_drops_only_absl_lines_below_the_level(tmp_path, level, kept):
    proc = run(tmp_path, FILTERED, timeout=60, TF_CPP_MIN_LOG_LEVEL=level)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "a Python line" and lines[-1] == "a last line without newline, then after"
    assert [line.split("] ")[-1] for line in lines[1:-1]] == kept, proc.stderr


def test_startup_filter_passes_on_a_fatal_line_when_the_process_aborts(tmp_path):
    proc = run(tmp_path, FILTERED, timeout=60, ABORT="1")
    assert proc.returncode != 0
    assert "a Python line" in proc.stderr and "a FATAL line" in proc.stderr, proc.stderr
    assert "an ERROR line" in proc.stderr and "an INFO line" not in proc.stderr


# The score job through spark-submit with conf/spark-defaults.conf (the `make demo` path):
# no TensorFlow start-up lines from its driver or its executors' preloading daemons, no
# stock daemon, no py4j lines; asserted on the installed job's run in tests/test_packaging.py
# (test_installed_job_scores_through_spark_submit), one spark-submit for both.


def test_a_worker_building_many_models_is_not_warned_of_retracing(caplog):
    """Stream updates and KeyedModels build model after model in one worker: each traces
    its compiled call once (its signature is fixed), which TensorFlow, counting traces by
    the code traced, would report as "N out of the last M calls ... triggered
    tf.function retracing" from the sixth model on."""
    import logging

    import keras
    import numpy as np

    from spark_keras.inference.predictor import Predictor

    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for units in range(1, 9):
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
            predictor = Predictor(model)
            out = predictor([np.ones((4, 3), "float32")])
            assert np.asarray(out[0]).shape == (4, units)
            assert predictor.traces in (None, 1)  # once per model: nothing hidden
    assert not [r for r in caplog.records if "retracing" in r.getMessage()], caplog.text


DAMAGED_JPEGS = """
import io
import sys

import keras
import numpy as np
import pandas as pd
import tensorflow as tf
from PIL import Image

from spark_keras.multiprocessing import pool_predict


@keras.saving.register_keras_serializable("test_quiet")
class DecodeJpeg(keras.layers.Layer):
    def call(self, x):
        return tf.map_fn(lambda b: tf.cast(tf.image.resize(tf.io.decode_jpeg(b, channels=3),
                                                           (8, 8)), "float32"),
                         tf.reshape(x, (-1,)), fn_output_signature=tf.float32)


def jpeg(i):
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (30 * i, 9, 9)).save(out, "JPEG")
    return out.getvalue()


if __name__ == "__main__":
    inp = keras.Input((), dtype="string")
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(DecodeJpeg()(inp))))
    rows = [jpeg(i) for i in range(6)]
    rows[2] = rows[2][:40]  # cut short: libjpeg prints "Improper call to JPEG library"
    rows[4] = b"\\xff\\xd8 not a jpeg" * 4
    out = pool_predict(model, pd.DataFrame({"image": rows}), processes=1, on_invalid="null",
                       custom_objects={"DecodeJpeg": DecodeJpeg})
    print("NULL ROWS", np.flatnonzero(np.isnan(out[:, 0])).tolist())
    print("a line of the driver's own", file=sys.stderr)
"""


@pytest.mark.slow  # a spawned pool worker importing TensorFlow: 40-50 s
def test_damaged_jpegs_leave_no_native_lines_in_a_workers_stderr(tmp_path):
    """A model decoding JPEGs in its graph, two damaged rows isolated in a real spawned
    worker: at TF_CPP_MIN_LOG_LEVEL=2 none of libjpeg's lines (printed straight to stderr,
    once per failing call of the search), and the driver's own stderr untouched (issue 45,
    item 7)."""
    proc = run(tmp_path, DAMAGED_JPEGS, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NULL ROWS [2, 4]" in proc.stdout, proc.stdout
    assert "JPEG" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == "a line of the driver's own", proc.stderr


def _read_for(fd: int, seconds: float) -> bytes:
    import select
    import time

    got, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        if select.select([fd], [], [], 0.1)[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            got += chunk
    return got


def test_the_worker_filter_passes_unfinished_lines_on_and_drops_libjpeg_lines():
    """A progress bar's step (ended by a carriage return) and a prompt (no end yet) pass
    through within a moment, not at the next newline or the worker's exit; libjpeg's line
    is dropped at level 2; the bytes that pass are the bytes written, in order."""
    from spark_keras import quiet

    read_fd, write_fd = os.pipe()
    out_r, out_w = os.pipe()
    proc = quiet._start_filter(2, read_fd, out_w)
    os.close(read_fd)
    os.close(out_w)
    try:
        os.write(write_fd, b"progress  10%\r")
        assert _read_for(out_r, 1.5) == b"progress  10%\r"
        os.write(write_fd, b"Improper call to JPEG library in state 201\nprogress  50%")
        assert _read_for(out_r, 1.5) == b"progress  50%"
        os.write(write_fd, b"\r\na Traceback line\n")
        assert _read_for(out_r, 1.5) == b"\r\na Traceback line\n"
    finally:
        os.close(write_fd)
        proc.wait(timeout=10)
        os.close(out_r)
