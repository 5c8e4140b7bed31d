"""spark_keras.dask on a real LocalCluster: two worker processes, one thread each."""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

import spark_keras as sk  # noqa: E402
from spark_keras.cache import read_build_log  # noqa: E402
from spark_keras.dask import PAYLOAD_FOLDER, PRELOAD_ENV, predict_dask, ship  # noqa: E402
from tests import models  # noqa: E402
from tests.conftest import REPO_ROOT, builds_by_worker, run_script  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@keras.saving.register_keras_serializable(package="sk_dask_tests")
class Scaler(keras.Model):
    """The Dask story's subclassed model (with get_config)."""

    def __init__(self, units: int = 3, scale: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.scale = units, scale
        self.dense = keras.layers.Dense(units)

    def call(self, x):
        return self.scale * self.dense(x)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "scale": self.scale}


@pytest.fixture(scope="module")
def client(build_log, tmp_path_factory):
    # Workers preload spark_keras.dask, which imports this module (it registers Scaler).
    # Their scratch space is this module's own (not the machine's shared one).
    env = {"SPARK_KERAS_BUILD_LOG": build_log, PRELOAD_ENV: __name__, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      preload=["spark_keras.dask"], env=env,
                      local_directory=str(tmp_path_factory.mktemp("dask-local"))) as cluster, \
            Client(cluster) as c:
        yield c


def _predict(model, x):
    return np.asarray(model(x)), type(model).__name__


def _predict_shipped(handle, x):
    return _predict(handle.value, x)


def _train(model, x, y):
    model.fit(x, y, epochs=3, batch_size=16, verbose=0)
    return model.get_weights()


def _scaler(rng, **kwargs) -> Scaler:
    model = Scaler(**kwargs)
    model(rng.standard_normal((2, 5)).astype("float32"))
    return model


def test_subclassed_model_in_20_tasks(client, build_log, rng):
    model = _scaler(rng, units=3, scale=1.5)
    xs = [rng.standard_normal((4, 5)).astype("float32") for _ in range(20)]
    expected = [np.asarray(model(x)) for x in xs]

    handle = ship(client, model)
    assert len(pickle.dumps(handle)) < 200  # tasks carry a key, not the weights
    shipped = client.gather(client.map(_predict_shipped, [handle] * 20, xs))
    sk.make_picklable(model)
    copied = client.gather(client.map(_predict, [model] * 20, xs, pure=False))

    for results in (shipped, copied):
        for (got, cls), want in zip(results, expected):
            assert cls == "Scaler"
            np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    builds = builds_by_worker(build_log, handle.key)
    assert builds and len(builds) <= 2 and set(builds.values()) == {1}, builds
    records = [r for r in read_build_log(build_log) if r["key"] == handle.key]
    assert all(r["shared"] and r["private_bytes"] == 0 for r in records), records

    seen = client.run(_host_files, handle.key)  # both workers of this host see one file
    assert len({str(found) for found in seen.values()}) == 1, seen
    (found,) = list(seen.values())[0].values()
    assert f"{handle.key}.skp" in found and not any(".tmp-" in name for name in found), seen
    handle.release()
    for found in client.run(_host_files, handle.key).values():  # no payload left, at most a lock
        assert all(set(names) <= {f"{handle.key}.skp.lock"} for names in found.values()), found


def _host_files(key: str, dask_worker=None) -> dict[str, list[str]]:
    """The files naming ``key`` in the folders beside this worker's scratch folder (where
    the host's payload files go), by folder name."""
    scratch = os.path.dirname(dask_worker.local_directory)
    found = {}
    for folder in sorted(os.listdir(scratch)):
        try:
            names = sorted(n for n in os.listdir(os.path.join(scratch, folder)) if key in n)
        except (NotADirectoryError, FileNotFoundError):  # a file, or a worker's folder going
            continue
        if names:
            found[folder] = names
    return found


def test_training_on_a_worker_returns_new_weights(client, rng):
    model = _scaler(rng, units=2)
    model.compile(optimizer="sgd", loss="mse")
    sk.make_picklable(model)
    before = [w.copy() for w in model.get_weights()]
    x = rng.standard_normal((64, 5)).astype("float32")
    y = rng.standard_normal((64, 2)).astype("float32")

    trained = client.submit(_train, model, x, y, pure=False).result(timeout=120)

    assert [w.shape for w in trained] == [w.shape for w in before]
    assert any(not np.array_equal(a, b) for a, b in zip(before, trained))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_predict_dask_array_and_dataframe(client, build_log, rng):
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    mlp = models.mlp(8, 16, 3)
    x = rng.standard_normal((100, 8)).astype("float32")
    with ship(client, mlp) as handle:
        scored = predict_dask(handle, da.from_array(x, chunks=(30, 4)))
        assert scored.shape == (100, 3)
        np.testing.assert_allclose(scored.compute(), np.asarray(mlp(x)), atol=1e-5, rtol=0)
        key = handle.key
    assert set(builds_by_worker(build_log, key).values()) == {1}

    two = models.multi_io()
    inputs = models.random_like_inputs(two, 50, seed=3)
    columns = {"a": [f"a{i}" for i in range(4)], "b": [f"b{i}" for i in range(6)]}
    frame = pd.DataFrame(np.concatenate([inputs["a"], inputs["b"].reshape(50, 6)], axis=1),
                         columns=columns["a"] + columns["b"], index=np.arange(100, 150))
    with ship(client, two) as handle:
        scored = predict_dask(handle, dd.from_pandas(frame, npartitions=3), columns=columns)
        assert list(scored.columns) == ["score", "probs_0", "probs_1", "probs_2"]
        out = scored.compute()
    expected = two(inputs)
    assert list(out.index) == list(frame.index)
    np.testing.assert_allclose(out["score"].to_numpy(), np.asarray(expected["score"])[:, 0],
                               atol=1e-5, rtol=0)
    np.testing.assert_allclose(out[["probs_0", "probs_1", "probs_2"]].to_numpy(),
                               np.asarray(expected["probs"]), atol=1e-5, rtol=0)


def test_workers_started_later_get_the_model_and_the_preload(client, build_log, rng):
    model = _scaler(rng, units=4)
    handle = ship(client, model)  # before the new worker exists
    old = set(client.scheduler_info()["workers"])
    client.cluster.scale(3)
    try:
        _wait_for_workers(client, 3)
        (new,) = set(client.scheduler_info()["workers"]) - old
        # Before any task ran there: the preload imported this module (registering Scaler)
        # and nothing else of the test suite.
        registered = client.run(keras.saving.get_registered_object, "sk_dask_tests>Scaler",
                                workers=[new])
        assert registered[new] is Scaler
        other = client.run(keras.saving.get_registered_object, "sk_pickle_tests>Doubler",
                           workers=[new])
        assert other[new] is None

        x = rng.standard_normal((3, 5)).astype("float32")
        got, _ = client.submit(_predict_shipped, handle, x, workers=[new],
                               allow_other_workers=False).result(timeout=120)
        np.testing.assert_allclose(got, np.asarray(model(x)), atol=1e-6, rtol=0)
        new_pid = client.run(os.getpid, workers=[new])[new]
        assert builds_by_worker(build_log, handle.key).get((socket.gethostname(), new_pid)) == 1
    finally:
        client.cluster.scale(2)
        _wait_for_workers(client, 2)


def _wait_for_workers(client, n: int, timeout: float = 180) -> None:
    """Wait until the scheduler has exactly ``n`` workers. (Not ``client.wait_for_workers``:
    it resets the LocalCluster's view of its workers, which then fails at close on a
    removal it already missed.)"""
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) != n:
        assert time.monotonic() < deadline, f"not {n} workers after {timeout} s"
        time.sleep(0.1)


def _on(client, worker: str, fn, *args):
    return client.submit(fn, *args, workers=[worker], allow_other_workers=False,
                         pure=False).result(timeout=120)


@pytest.mark.slow  # 9 s of make test's 15 min
def test_a_worker_leaving_keeps_the_hosts_file_for_the_others(client, rng):
    # Each worker drops its copy of the payload once built on the host's file: when one
    # worker leaves, the others must still be able to rebuild (after an eviction, say).
    _wait_for_workers(client, 2)
    model = models.mlp(5, 4, 3)
    x = rng.standard_normal((4, 5)).astype("float32")
    expected = np.asarray(model(x))
    with ship(client, model) as handle:
        stay = sorted(client.scheduler_info()["workers"])
        with _extra_worker(client) as (leaving, process):  # a third worker on this host
            for worker in [*stay, leaving]:  # all three build, then forget the payload
                np.testing.assert_allclose(_on(client, worker, _predict_shipped, handle, x)[0],
                                           expected, atol=1e-6, rtol=0)
            client.retire_workers([leaving])  # its plugin's teardown runs as it closes
            process.wait(timeout=60)

        limit = sk.cache_info()["max_bytes"]
        client.run(sk.configure_cache, max_bytes=0, workers=stay)  # evict every model
        client.run(sk.configure_cache, max_bytes=limit, workers=stay)
        assert all(handle.key not in info["keys"]
                   for info in client.run(sk.cache_info, workers=stay).values())
        for worker in stay:
            got, _ = _on(client, worker, _predict_shipped, handle, x)
            np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
        assert all(info["builds_by_key"][handle.key] == 2
                   for info in client.run(sk.cache_info, workers=stay).values())
        for found in client.run(_host_files, handle.key, workers=stay).values():
            assert any(f"{handle.key}.skp" in names for names in found.values()), found


@contextlib.contextmanager
def _extra_worker(client):
    """A ``dask worker`` process (no nanny) joining ``client``'s cluster with the same
    scratch space: yields its address and process; stopped on exit if still running.
    (Not the cluster's own scale(): the LocalCluster's nanny may kill a closing worker.)"""
    scratch = os.path.dirname(next(iter(client.run(_local_directory).values())))
    name = f"extra-{os.getpid()}-{time.monotonic_ns()}"
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    process = subprocess.Popen(
        [dask, "worker", client.scheduler.address, "--name", name, "--nthreads", "1",
         "--no-nanny", "--local-directory", scratch, "--no-dashboard"],
        env=dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            found = [a for a, w in client.scheduler_info()["workers"].items() if w["name"] == name]
            if found:
                break
            assert process.poll() is None and time.monotonic() < deadline, "no extra worker"
            time.sleep(0.2)
        yield found[0], process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _local_directory(dask_worker=None) -> str:
    return dask_worker.local_directory


def _package_files(dask_worker=None) -> tuple[str, str, str]:
    """``spark_keras.__file__`` in this worker, and in a fresh interpreter that imports
    from the folder holding the workers' scratch folders (Dask puts it on the ``sys.path``
    of the workers it starts) with the installed package alone (no ``PYTHONPATH``), plus
    that interpreter's errors."""
    import spark_keras

    scratch = os.path.dirname(dask_worker.local_directory)
    code = (f"import sys; sys.path.insert(0, {scratch!r}); import spark_keras; "
            f"from spark_keras import __version__; print(spark_keras.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env,
                          capture_output=True, text=True, timeout=120)
    return spark_keras.__file__, proc.stdout.strip(), proc.stderr[-2000:]


def test_the_payload_folder_does_not_shadow_the_installed_package(client, rng):
    real = os.path.realpath(sk.__file__)
    x = rng.standard_normal((2, 3)).astype("float32")
    with ship(client, models.mlp(3, 4, 1)) as handle:
        client.submit(_predict_shipped, handle, x).result(timeout=120)  # lands the host's file
        assert any(client.run(_host_files, handle.key).values())
        for in_worker, fresh, errors in client.run(_package_files).values():
            assert os.path.realpath(in_worker) == real
            assert fresh and os.path.realpath(fresh) == real, errors


@contextlib.contextmanager
def _planted_payload_folder(client):
    """The workers' payload folder made beforehand by the second user, mode 0777 (what
    another user of a shared scratch space can do); ours, if earlier tests made it, set
    aside meanwhile. Yields its path."""
    from tests.other_user import give_to_other_user

    scratch = os.path.dirname(next(iter(client.run(_local_directory).values())))
    folder = os.path.join(scratch, PAYLOAD_FOLDER)
    aside = f"{folder}.aside-{os.getpid()}"
    had = os.path.isdir(folder)
    if had:
        os.rename(folder, aside)
    os.mkdir(folder)
    os.chmod(folder, 0o777)
    give_to_other_user(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if had:
            os.rename(aside, folder)


def test_a_payload_folder_planted_by_another_user_is_not_used(client, rng):
    """Another user made the payload folder (0777) and put another model's payload of the
    same size under the name the workers look for: they refuse the folder (each keeps
    its own copy of the weights) and score with the shipped model, never with the planted
    one; nothing of theirs is written into that folder."""
    from tests.channel.test_trust import _same_size_other_weights

    model = models.mlp(5, 4, 3)
    x = rng.standard_normal((4, 5)).astype("float32")
    expected = np.asarray(model(x))
    forged = _same_size_other_weights(model)
    workers = sorted(client.scheduler_info()["workers"])
    with _planted_payload_folder(client) as folder:
        with ship(client, model) as handle:
            planted = os.path.join(folder, f"{handle.key}.skp")
            with open(planted, "wb") as f:  # under the name the workers look for
                f.write(forged)
            os.chown(planted, os.stat(folder).st_uid, os.stat(folder).st_gid)  # the other user's
            for worker in workers:
                got, _ = _on(client, worker, _predict_shipped, handle, x)
                np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
            assert os.listdir(folder) == [f"{handle.key}.skp"], os.listdir(folder)
            assert os.stat(planted).st_uid == os.stat(folder).st_uid  # still the planted one


def test_a_scratch_folder_that_is_another_users_link_is_not_used(client, rng):
    """The audit's attack on a shared scratch space: the workers' scratch folder was a
    symbolic link of the other user's to a folder the workers may use (as ``/var/tmp``);
    the workers took it, judging the link's target, while its owner could re-point it
    between the digest check and the mapping (61 of 400 builds loaded its model). Now
    each worker refuses the link (keeping its own copy of the weights, warned), scores
    with the shipped model, and makes nothing behind the link."""
    from tests.other_user import other_user

    model = models.mlp(5, 4, 3)
    x = rng.standard_normal((4, 5)).astype("float32")
    expected = np.asarray(model(x))
    scratch = os.path.dirname(next(iter(client.run(_local_directory).values())))
    real, aside = f"{scratch}.real-{os.getpid()}", f"{PAYLOAD_FOLDER}.aside-{os.getpid()}"
    os.rename(scratch, real)
    had = os.path.isdir(os.path.join(real, PAYLOAD_FOLDER))
    if had:  # earlier tests' payload folder, ours: set aside meanwhile
        os.rename(os.path.join(real, PAYLOAD_FOLDER), os.path.join(real, aside))
    os.symlink(real, scratch)  # the workers' paths now go through the other user's link
    os.chown(scratch, other_user().pw_uid, other_user().pw_gid, follow_symlinks=False)
    try:
        with ship(client, model) as handle:
            for worker in sorted(client.scheduler_info()["workers"]):
                got, _ = _on(client, worker, _predict_shipped, handle, x)
                np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
            assert not os.path.exists(os.path.join(real, PAYLOAD_FOLDER))
    finally:
        os.remove(scratch)
        os.rename(real, scratch)
        if had:
            os.rename(os.path.join(scratch, aside), os.path.join(scratch, PAYLOAD_FOLDER))


def test_a_hosts_payload_file_swapped_after_it_was_written_is_refused(client, rng):
    """The host's payload file, written by the first worker, replaced by another model's
    payload of the same size: the second worker refuses it by its digest, naming the
    file, instead of scoring with those weights."""
    from tests.channel.test_trust import _same_size_other_weights

    model = models.mlp(5, 4, 3)
    x = rng.standard_normal((4, 5)).astype("float32")
    expected = np.asarray(model(x))
    forged = _same_size_other_weights(model)
    first, second = sorted(client.scheduler_info()["workers"])[:2]
    with ship(client, model) as handle:
        got, _ = _on(client, first, _predict_shipped, handle, x)  # writes the host's file
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
        scratch = os.path.dirname(next(iter(client.run(_local_directory).values())))
        path = os.path.join(scratch, PAYLOAD_FOLDER, f"{handle.key}.skp")
        assert os.path.getsize(path) == len(forged)
        with open(f"{path}.new", "wb") as f:
            f.write(forged)
        os.replace(f"{path}.new", path)
        with pytest.raises(sk.PayloadError, match=f"payload file {path} of model {handle.key} "
                                                  f"has sha256 .* replaced or altered on this host"):
            _on(client, second, _predict_shipped, handle, x)


def test_loading_failures_raise_in_the_task(client, rng):
    unsafe = keras.Sequential([keras.Input((3,)), keras.layers.Lambda(lambda t: t * 2.0)])
    x = rng.standard_normal((2, 3)).astype("float32")

    with ship(client, unsafe) as handle:  # safe_mode=True: workers refuse the Lambda
        with pytest.raises(sk.PayloadError, match="safe_mode"):
            client.submit(_predict_shipped, handle, x).result(timeout=120)

    with pytest.raises(Exception) as info:  # the scheduler rebuilds submitted models first
        client.submit(_predict, sk.make_picklable(unsafe), x, pure=False).result(timeout=120)
    assert not isinstance(info.value, TimeoutError)

    good = ship(client, models.mlp(3, 4, 1))
    client.submit(_predict_shipped, good, x).result(timeout=120)
    good.release()
    with pytest.raises(sk.SparkKerasError, match="released"):
        client.submit(_predict_shipped, good, x, pure=False).result(timeout=120)
    assert all(good.key not in stats["keys"] for stats in client.run(sk.cache_info).values())


MAIN_DRIVER = textwrap.dedent('''
    import dask, numpy as np, keras
    from distributed import Client, LocalCluster
    import spark_keras as sk
    from spark_keras.dask import ship

    def predict(model, x):
        return np.asarray(model(x))

    def predict_shipped(handle, x):
        return np.asarray(handle.value(x))

    if __name__ == "__main__":
        # Defined under the guard: spawned workers re-import this script as __mp_main__
        # without it, so the class exists only in the driver's __main__.
        class Squash(keras.layers.Layer):
            def __init__(self, power=2.0, **kwargs):
                super().__init__(**kwargs)
                self.power = power
            def build(self, shape):
                self.scale = self.add_weight(shape=(shape[-1],), initializer="random_normal")
            def call(self, x):
                return keras.ops.tanh(x * self.scale) ** self.power
            def get_config(self):
                return {**super().get_config(), "power": self.power}

        model = keras.Sequential([keras.Input((4,)), Squash(3.0), keras.layers.Dense(2)])
        sk.make_picklable(model)                  # no custom_objects anywhere
        x = np.random.default_rng(0).standard_normal((6, 4)).astype("float32")
        expected = np.asarray(model(x))
        dask.config.set({"distributed.scheduler.allowed-failures": 0})  # fail, don't retry
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            got = client.submit(predict, model, x, pure=False).result(timeout=150)
            np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
            got = client.submit(predict_shipped, ship(client, model), x).result(timeout=150)
            np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
        print("MAIN-OBJECTS-OK")
''')


@pytest.mark.slow  # 16 s of make test's 15 min
def test_custom_layer_from_main_reaches_workers(tmp_path):
    run_script(tmp_path, MAIN_DRIVER, "MAIN-OBJECTS-OK")
