"""Models larger than the JVM heaps: payloads streamed to a file of the driver and from
there to each executor, never through a JVM heap nor whole in the driver's memory.

The driver's memory is counted by ``tracemalloc`` (numpy's and Python's allocations: a
copy of the weights in bytes or numpy arrays shows up whole, deterministically); the
heaps are real ones (a fresh driver JVM per run: ``bench.large_bench``)."""

from __future__ import annotations

import os
import tracemalloc

import keras
import numpy as np
import pytest

import spark_keras as sk
from bench import large_bench
from spark_keras.cache import read_build_log
from spark_keras.executor import driver_payload
from spark_keras.executor.transport.broadcast import BroadcastTransport
from spark_keras.executor.transport.served import ServedTransport

MB = 2**20


def wide_model(mib: int, seed: int = 0) -> keras.Model:
    """Dense(1024) layers of 4 MiB each, ``mib`` MiB of weights in all."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((1024,)),
                             *[keras.layers.Dense(1024, activation="tanh") for _ in range(mib // 4)],
                             keras.layers.Dense(3)])


def allocated_peak(call):
    """``call()``'s result and the peak of what it allocated (bytes; tracemalloc)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = call()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_save_streams_the_weights_into_the_file_without_a_copy(tmp_path):
    model = wide_model(96)
    path = str(tmp_path / "m.skp")
    _, peak = allocated_peak(lambda: sk.save(model, path))
    assert os.path.getsize(path) > 96 * MB
    assert peak < 8 * MB, f"save allocated {peak / MB:.0f} MB for a 96 MB model"
    x = np.random.default_rng(0).standard_normal((5, 1024)).astype("float32")
    loaded = sk.load(path, share_weights=True)
    np.testing.assert_array_equal(loaded(x), model(x))
    # a model whose weights are a mapped file: saved again, nothing copied, same weights
    again = str(tmp_path / "again.skp")
    _, peak = allocated_peak(lambda: sk.save(loaded, again))
    assert peak < 8 * MB, f"save of a mapped model allocated {peak / MB:.0f} MB"
    np.testing.assert_array_equal(sk.load(again)(x), model(x))
    # dumps still makes one copy, the bytes it returns (the measure sees copies)
    data, peak = allocated_peak(lambda: sk.dumps(model))
    assert peak >= len(data) > 96 * MB


def test_a_large_model_ships_from_the_driver_file_and_scores_exactly(spark, build_log):
    model = wide_model(80)  # over driver_payload.LARGE_PAYLOAD (64 MiB)
    assert driver_payload.weights_nbytes(model) > driver_payload.LARGE_PAYLOAD
    # the driver's server started first (its TLS key and imports are not the model's copies)
    warm = sk.BroadcastModel(spark, keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
                             ship="driver")
    bm, peak = allocated_peak(lambda: sk.BroadcastModel(spark, model))
    warm.destroy()
    try:
        # written on the executor from shares the executors read from the driver's channel
        assert isinstance(bm._transport, ServedTransport)
        assert bm.key and bm._nbytes > 80 * MB
        assert peak < 8 * MB, f"BroadcastModel allocated {peak / MB:.0f} MB on the driver"
        x = np.random.default_rng(1).standard_normal((64, 1024)).astype("float32")
        df = spark.createDataFrame([(i, x[i].tolist()) for i in range(64)],
                                   "id long, features array<float>").coalesce(1)
        got = bm.transform(df, "features").toPandas().sort_values("id")
        found = np.stack(got["prediction"].to_numpy()).astype("float32")
        np.testing.assert_allclose(found, np.asarray(model(x)), rtol=1e-5, atol=1e-6)
        # the worker's weights are views of the executor's file: no private copy
        records = [r for r in read_build_log(build_log) if r["key"] == bm.key]
        assert records and all(r["shared"] and r["private_bytes"] == 0 for r in records), records
        # a large new version is streamed to the driver's file too, and shipped the same way
        second = wide_model(80, seed=1)
        label, peak = allocated_peak(lambda: bm.update(second))
        assert label == "2" and peak < 8 * MB, f"update allocated {peak / MB:.0f} MB"
        got = bm.transform(df, "features", version_col="v").toPandas().sort_values("id")
        assert set(got["v"]) == {"2"}
        found = np.stack(got["prediction"].to_numpy()).astype("float32")
        np.testing.assert_allclose(found, np.asarray(second(x)), rtol=1e-5, atol=1e-6)
    finally:
        bm.destroy()
    # the same model as a broadcast: the payload whole in the driver's memory
    small = sk.BroadcastModel(spark, wide_model(8))
    try:
        assert isinstance(small._transport, BroadcastTransport)
    finally:
        small.destroy()
    forced, peak = allocated_peak(lambda: sk.BroadcastModel(spark, model, ship="broadcast"))
    try:
        assert isinstance(forced._transport, BroadcastTransport)
        assert peak > 80 * MB
    finally:
        forced.destroy()


def test_ship_is_checked():
    with pytest.raises(sk.errors.ArgumentTypeError, match="ship must be one of"):
        driver_payload.check_ship("torrent", connect=False)
    with pytest.raises(sk.errors.ArgumentTypeError, match="Spark Connect has no broadcast"):
        driver_payload.check_ship("broadcast", connect=True)


@pytest.mark.slow  # a fresh driver JVM and a 0.6 GiB model: about 70 s
def test_a_payload_larger_than_the_driver_heap_ships_and_scores_exactly():
    """0.6 GiB of weights, a 512 MiB driver heap (local mode: the executor's too; about
    Spark's least, 1.5 x its 300 MiB reserve). One partition: one worker builds the 0.6 GiB
    model from the executor's file and scores (a second did the same)."""
    result = large_bench.launch(0.6, "auto", master="local[2]", driver_memory="512m", partitions=1)
    assert "error" not in result, result["error"]
    assert result["driver_heap_mib"] <= 512 < result["weights_gib"] * 1024
    assert result["transport"] == "ServedTransport" and result["chunks"] > 64
    assert result["rows"] == 32 and result["exact"], result
    # the driver's private memory while it shipped: no copy of the weights
    grew = result["driver_python_ship_peak_mib"] - result["driver_python_before_mib"]
    assert grew < 0.25 * result["weights_gib"] * 1024, result


@pytest.mark.slow  # two executors, 1.2 GiB of weights, 512 MiB heaps: about 2 minutes
@pytest.mark.heavy  # minutes under CI's load: make test-heavy
def test_a_payload_larger_than_every_heap_crosses_executors():
    result = large_bench.launch(1.2, "auto", master="local-cluster[2,1,1024]",
                                driver_memory="512m", executor_memory="512m")
    assert "error" not in result, result["error"]
    assert result["transport"] == "ServedTransport" and result["chunks"] > 64
    assert result["rows"] == 32 and result["exact"], result
    jvms = [p for p in result["processes"] if p["role"] == "executor JVM"]
    # (not a JVM's child sampled between its fork and its exec: a Python daemon starting)
    executors = [p for p in jvms if p["ppid"] not in {q["pid"] for q in jvms}]
    assert len(executors) == 2
    assert all(p["rss"] < 1.2 * 2**20 for p in executors), executors  # KiB: under the model
    grew = result["driver_python_ship_peak_mib"] - result["driver_python_before_mib"]
    assert grew < 0.25 * result["weights_gib"] * 1024, result


def test_a_payload_that_cannot_load_leaves_no_file_on_the_driver(spark, tmp_path):
    from spark_keras.channel import version_server

    path = str(tmp_path / "damaged.skp")
    sk.save(wide_model(8), path)
    with open(path, "r+b") as f:  # one byte of the body flipped: the digest refuses it
        f.seek(-1000, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1000, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(sk.errors.PayloadError):
        sk.BroadcastModel(spark, path, ship="driver")  # copied to the driver's folder first
    folder = version_server._server._folder  # made for the copy
    assert folder and os.path.isdir(folder)
    assert not [n for n in os.listdir(folder) if n.endswith(".part")]


def test_a_refused_update_leaves_no_file_on_the_driver(spark, tmp_path):
    """A large model that does not fit the handle's inputs: refused before its payload
    is written (a model), or once read (a file), leaving nothing in the driver's folder."""
    from spark_keras.channel import version_server

    small = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    bm = sk.BroadcastModel(spark, small, ship="driver")  # the driver's folder exists
    try:
        folder = version_server._server._folder
        before = set(os.listdir(folder))
        other = wide_model(68)  # over LARGE_PAYLOAD: written to a file of the driver
        assert driver_payload.weights_nbytes(other) > driver_payload.LARGE_PAYLOAD
        with pytest.raises(sk.ArgumentError, match="does not fit"):
            bm.update(other)
        assert set(os.listdir(folder)) == before
        path = str(tmp_path / "other.skp")
        sk.save(other, path)
        with pytest.raises(sk.ArgumentError, match="does not fit"):
            bm.update(path)  # copied to the driver's folder, loaded, refused
        assert set(os.listdir(folder)) == before
        assert bm.version == "1"
    finally:
        bm.destroy()
