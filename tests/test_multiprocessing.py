"""spark_keras.multiprocessing: spawned Process and Pool workers receive the payload."""

from __future__ import annotations

import os
import textwrap
from collections import Counter

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.cache import read_build_log
from spark_keras.multiprocessing import pool_predict
from tests import models
from tests.conftest import run_script

pytestmark = pytest.mark.timeout(300)

SEED_EXAMPLE = textwrap.dedent('''
    import multiprocessing as mp
    import numpy as np
    import spark_keras as sk
    from tests.models import actor_cnn

    def act(model, frames, results):
        results.put(np.asarray(model(frames)))

    if __name__ == "__main__":
        mp.set_start_method("spawn")
        model = sk.make_picklable(actor_cnn())    # the one line the example needs
        frames = np.random.default_rng(0).standard_normal((2, 120, 160, 2)).astype("float32")
        results = mp.Queue()
        process = mp.Process(target=act, args=(model, frames, results))
        process.start()
        got = results.get(timeout=240)
        process.join(60)
        assert process.exitcode == 0, process.exitcode
        np.testing.assert_array_equal(got, np.asarray(model(frames)))
        print("SPAWN-OK")
''')


@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_seed_example_passes_the_model_to_a_spawned_process(tmp_path):
    run_script(tmp_path, SEED_EXAMPLE, "SPAWN-OK")


@pytest.mark.slow  # 12 s of make test's 15 min
def test_pool_predict_equals_the_model_and_builds_once_per_process(tmp_path, monkeypatch, rng):
    monkeypatch.setenv("SPARK_KERAS_BUILD_LOG", str(tmp_path))  # spawned workers inherit it
    model = models.actor_cnn()
    x = rng.standard_normal((40, 120, 160, 2)).astype("float32")

    got = pool_predict(model, x, processes=2, batch_size=8)  # 5 tasks, 2 processes

    assert isinstance(got, np.ndarray) and got.shape == (40, 5)
    np.testing.assert_allclose(got, np.asarray(model(x)), atol=1e-6, rtol=0)
    records = read_build_log(str(tmp_path))
    builds = Counter((r["pid"], r["key"]) for r in records)
    assert 1 <= len(builds) <= 2 and set(builds.values()) == {1}, builds
    assert os.getpid() not in {pid for pid, _ in builds}
    # every process built on the parent's one file: no weight byte private to a process
    assert all(r["shared"] and r["private_bytes"] == 0 for r in records), records

    copies = tmp_path / "copies"
    monkeypatch.setenv("SPARK_KERAS_BUILD_LOG", str(copies))
    again = pool_predict(model, x[:8], processes=1, batch_size=8, share_weights=False)
    np.testing.assert_array_equal(again, got[:8])
    assert [r["shared"] for r in read_build_log(str(copies))] == [False]


@pytest.mark.slow  # 13 s of make test's 15 min
def test_pool_predict_multi_output_and_worker_errors(rng):
    two = models.multi_io()
    inputs = models.random_like_inputs(two, 30, seed=5)
    got = pool_predict(two, inputs, processes=1, batch_size=8)
    expected = two(inputs)
    assert set(got) == {"score", "probs"}
    for name in got:
        np.testing.assert_allclose(got[name], np.asarray(expected[name]), atol=1e-6, rtol=0)

    unsafe = keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t * 2.0)])
    with pytest.raises(sk.PayloadError, match="safe_mode"):  # raised here, no respawn loop
        pool_predict(unsafe, np.zeros((4, 3), "float32"), processes=1)


def test_pool_predict_checks_inputs_before_starting_a_pool():
    model = models.mlp(8, 16, 1)
    with pytest.raises(sk.ModelInputError, match="shape"):
        pool_predict(model, np.zeros((5, 7), "float32"))
    with pytest.raises(sk.ModelInputError, match="inputs"):
        pool_predict(models.multi_io(), {"a": np.zeros((5, 4), "float32")})
    assert pool_predict(model, np.zeros((0, 8), "float32")).shape == (0, 1)
