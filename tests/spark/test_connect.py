"""BroadcastModel on Spark Connect, against a real local Connect server
(``SparkSession.builder.remote("local[2]")``): no SparkContext, no broadcast, no RDDs."""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("zstandard")

import spark_keras as sk  # noqa: E402
from spark_keras.inference import predictor_for  # noqa: E402
from tests import models  # noqa: E402
from tests.conftest import run_script  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def worker_caches(connect, handle=None) -> dict[int, dict]:
    """``cache_info()`` of the live SQL workers, by pid (Connect takes no executorEnv,
    so no build log: ask the workers)."""
    import pyarrow as pa

    def report(batches):
        import spark_keras

        if handle is not None:
            handle.release_stale()  # a live handle carries the released keys
        for _ in batches:
            pass
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps(spark_keras.cache_info())])], names=["s"])

    infos = [json.loads(r.s) for r in connect.range(8, numPartitions=8).mapInArrow(report, "s string").collect()]
    return {i["pid"]: i for i in infos}


def _exact(model, inputs):
    """The model's own compiled outputs on the same batch (what a worker computes)."""
    return predictor_for(model)(inputs, 1024)


def test_connect_session_has_no_broadcast_and_we_do_not_need_one(connect):
    from spark_keras.executor.transport import is_connect

    assert is_connect(connect) and not hasattr(connect, "_sc")
    bm = sk.BroadcastModel(connect, models.mlp(4, 8, 1))
    assert type(bm._transport).__name__ == "ArtifactTransport"


def test_every_input_kind_matches_the_model_bit_for_bit(connect):
    from pyspark.ml.functions import array_to_vector

    rng = np.random.default_rng(5)
    x = rng.standard_normal((30, 6)).astype("float32")
    mlp = models.mlp(6, 16, 3)
    bm = sk.BroadcastModel(connect, mlp)
    rows = [(i, x[i].tolist(), *map(float, x[i])) for i in range(30)]
    df = connect.createDataFrame(rows, "id long, f array<float>, " + ", ".join(
        f"c{j} float" for j in range(6))).coalesce(1)
    want = _exact(mlp, [x])[0]
    scalars = [f"c{j}" for j in range(6)]
    outs = {
        "array transform": bm.transform(df, "f").orderBy("id").toPandas()["prediction"],
        "array udf": df.orderBy("id").select(bm.predict_udf()("f").alias("p")).toPandas()["p"],
        "scalars": bm.transform(df, scalars).orderBy("id").toPandas()["prediction"],
        "vector": bm.transform(df.withColumn("v", array_to_vector("f")), "v").orderBy("id")
                    .toPandas()["prediction"],
    }
    for kind, got in outs.items():
        np.testing.assert_array_equal(np.stack(got.to_numpy()), want, err_msg=kind)

    two = models.multi_io()
    inputs = models.random_like_inputs(two, 20, seed=2)
    frame = connect.createDataFrame(
        [(i, inputs["a"][i].tolist(), inputs["b"][i].reshape(-1).tolist()) for i in range(20)],
        "id long, a array<float>, b array<float>").coalesce(1)
    bm2 = sk.BroadcastModel(connect, two)
    got = bm2.transform(frame, ["a", "b"]).orderBy("id").toPandas()["prediction"]
    sig = predictor_for(two).signature
    expected = dict(zip(sig.output_names, _exact(two, [inputs[s.name] for s in sig.inputs])))
    np.testing.assert_array_equal(np.array([r["score"] for r in got]), expected["score"][:, 0])
    np.testing.assert_array_equal(np.stack([r["probs"] for r in got]), expected["probs"])

    infos = worker_caches(connect)
    for handle in (bm, bm2):  # each Python worker built each model once
        builds = [i["builds_by_key"][handle.key] for i in infos.values() if handle.key in i["builds_by_key"]]
        assert builds and set(builds) == {1} and len(builds) <= 2, infos


def test_workers_share_the_artifact_and_destroy_drops_the_model(connect):
    import pyarrow as pa

    model = models.mlp(4, 8, 2)
    bm = sk.BroadcastModel(connect, model)
    df = connect.range(8, numPartitions=4).selectExpr("id", "array(1.0f, 2.0f, 3.0f, 4.0f) as f")

    def report(batches):
        from pyspark import SparkFiles

        import spark_keras

        bm.predictor  # noqa: B018  (builds the model in this worker)
        path = SparkFiles.get(bm._transport.name)
        for _ in batches:
            pass
        info = spark_keras.cache_info()["memory_by_key"].get(bm.key, {})
        yield pa.RecordBatch.from_arrays(
            [pa.array([json.dumps([os.stat(path).st_ino, info])])], names=["s"])

    seen = [json.loads(r.s) for r in df.mapInArrow(report, "s string").collect()]
    assert len({ino for ino, _ in seen}) == 1  # one file for the (local) executor
    assert all(info.get("shared") and info["private_bytes"] == 0 for _, info in seen), seen

    key = bm.key
    bm.destroy()
    with pytest.raises(sk.SparkKerasError, match="destroyed"):
        bm.transform(df, "f").collect()
    other = sk.BroadcastModel(connect, models.mlp(4, 8, 1))
    cached = worker_caches(connect, other)
    assert not any(key in i["keys"] for i in cached.values()), cached


def test_errors_on_connect_are_clear(connect):
    bm = sk.BroadcastModel(connect, models.mlp(3, 8, 1))
    bad = connect.createDataFrame([(1, "x")], "id long, f string")
    with pytest.raises(Exception, match="column 'f' has type string"):
        bm.transform(bad, "f").collect()
    with pytest.raises(sk.SparkKerasError, match="Spark Connect has no RDDs.*transform"):
        list(bm.predict_partition(iter([[1.0, 2.0, 3.0]])))

    from spark_keras.executor.transport.artifact import ArtifactTransport

    lost = sk.BroadcastModel(connect, models.mlp(3, 8, 1))
    lost.signature  # noqa: B018  (read on the driver while it has the model)
    lost._transport, lost._model = ArtifactTransport("never-uploaded.skp"), None
    df = connect.createDataFrame([(1, [1.0, 2.0, 3.0])], "id long, f array<float>")
    with pytest.raises(Exception, match="artifact 'never-uploaded.skp' is not on this executor"):
        lost.transform(df, "f").collect()

    damaged = sk.BroadcastModel(connect, models.mlp(3, 8, 1))
    damaged.signature  # noqa: B018
    damaged._model = None
    import pyarrow as pa

    def flip(batches):  # damage the executor's copy from inside a task
        from pyspark import SparkFiles

        path = SparkFiles.get(damaged._transport.name)
        with open(path, "r+b") as f:
            f.seek(-8, os.SEEK_END)
            last = f.read(1)
            f.seek(-8, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))
        for b in batches:
            yield pa.RecordBatch.from_arrays([pa.array([0] * b.num_rows)], names=["x"])

    connect.range(1, numPartitions=1).mapInArrow(flip, "x long").collect()
    with pytest.raises(Exception, match="artifact .* cannot be loaded.*checksum"):
        damaged.transform(df, "f").collect()


def test_models_stored_anywhere_on_connect(connect, s3, tmp_path):
    """A URI is read by the executor from storage: no artifact, no SparkContext."""
    model = models.mlp(5, 8, 2)
    x = np.random.default_rng(9).standard_normal((24, 5)).astype("float32")
    df = connect.createDataFrame([(i, x[i].tolist()) for i in range(24)],
                                 "id long, f array<float>").repartition(4)
    sk.save(model, tmp_path / "m.skp")
    model.save(tmp_path / "m.keras")
    s3.put("connect.keras", (tmp_path / "m.keras").read_bytes())
    want = _exact(model, [x])[0]
    for where in (f"file://{tmp_path}/m.skp", s3.uri("connect.keras")):
        bm = sk.BroadcastModel(connect, where)
        assert type(bm._transport).__name__ == "StorageTransport"
        got = bm.transform(df, "f").orderBy("id").toPandas()["prediction"]
        np.testing.assert_array_equal(np.stack(got.to_numpy()), want, err_msg=where)
        with pytest.raises(sk.SparkKerasError, match="Spark Connect has no RDDs"):
            list(bm.predict_partition(iter([x[0]])))
        builds = [i["builds_by_key"][bm.key] for i in worker_caches(connect).values()
                  if bm.key in i["builds_by_key"]]
        assert builds and set(builds) == {1}, builds
    assert s3.gets("connect.keras") == 2  # the driver once, the (one) executor once


MAIN_DRIVER = textwrap.dedent('''
    import numpy as np, keras
    from pyspark.sql import SparkSession
    import spark_keras as sk

    class Doubler(keras.layers.Layer):      # defined only in this script's __main__
        def call(self, x):
            return 2.0 * x

    if __name__ == "__main__":
        spark = SparkSession.builder.remote("local[2]").getOrCreate()
        model = keras.Sequential([keras.Input((3,)), Doubler(), keras.layers.Dense(1)])
        bm = sk.BroadcastModel(spark, model)
        df = spark.createDataFrame([(i, [float(i), 1.0, 2.0]) for i in range(6)], "id long, f array<float>")
        got = bm.transform(df, "f").orderBy("id").toPandas()["prediction"].to_numpy()
        want = np.asarray(model(np.array([[i, 1, 2] for i in range(6)], "float32")))[:, 0]
        np.testing.assert_allclose(got, want, atol=1e-6)
        spark.stop()
        print("CONNECT-MAIN-OK")
''')


def test_string_columns_and_string_outputs_on_connect(connect):
    import tensorflow as tf

    model = models.text_labeller()
    words = ["cat", None, "fox", "zebra"]
    want = model(tf.constant([[w] for w in words if w is not None]), training=False)
    labels = [x.decode() for x in want["label"].numpy()]
    bm = sk.BroadcastModel(connect, model)
    try:
        df = connect.createDataFrame([(i, w) for i, w in enumerate(words)], "id long, word string")
        rows = [r.prediction for r in bm.transform(df, "word", on_invalid="null").orderBy("id").collect()]
        assert rows[1] is None and [r.label for r in rows if r is not None] == labels
        np.testing.assert_allclose([r.logits for r in rows if r is not None], want["logits"].numpy(), atol=1e-5)
        udf = [r.p for r in df.orderBy("id").select(bm.predict_udf(on_invalid="null")("word").alias("p")).collect()]
        assert [r.label if r else None for r in udf] == [labels[0], None, *labels[1:]]
        with pytest.raises(Exception, match=r"column 'word': null value\(s\), first at row 1"):
            bm.transform(df.coalesce(1), "word").collect()
    finally:
        bm.destroy()


def _executor_files(connect, handle=None) -> dict[str, list[str]]:
    """The payload folder's files of each executor the tasks ran on, after ``handle``
    (if any) released the stale models in each task's worker."""
    import pyarrow as pa

    def report(batches):
        from spark_keras.executor.transport.executor_file import executor_folder

        if handle is not None:
            handle.release_stale()  # a live handle carries the released keys
        for _ in batches:
            pass
        folder = executor_folder()
        names = sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps([folder, names])])], names=["s"])

    rows = connect.range(4, numPartitions=4).mapInArrow(report, "s string").collect()
    return dict(json.loads(r.s) for r in rows)


def test_an_artifact_handle_removes_a_released_uri_models_files(connect, tmp_path):
    model = models.mlp(4, 8, 2)
    sk.save(model, tmp_path / "m.skp")
    stored = sk.BroadcastModel(connect, f"file://{tmp_path}/m.skp")
    assert type(stored._transport).__name__ == "StorageTransport"
    df = connect.createDataFrame([(i, [float(i)] * 4) for i in range(8)], "id long, f array<float>")
    assert len(stored.transform(df, "f").collect()) == 8  # count() alone would not score
    key = stored.key
    before = _executor_files(connect)
    assert any(f"{key}.skp" in names for names in before.values()), before  # landed there

    stored.destroy()
    other = sk.BroadcastModel(connect, models.mlp(4, 8, 1))
    assert type(other._transport).__name__ == "ArtifactTransport"
    after = _executor_files(connect, other)
    assert set(after) == set(before)
    assert not any(n.startswith(key) for names in after.values() for n in names), after


@pytest.mark.slow  # 11 s of make test's 15 min
def test_a_running_stream_on_connect_takes_updates_without_a_restart(connect, tmp_path):
    """As on classic Spark (tests/spark/test_versions.py): the workers ask this client
    process which version each micro-batch scores with, and read new versions from it."""
    from tests.spark.test_streaming import Source
    from tests.spark.test_versions import _assert_scored_by, _sink, _stream

    versions = [models.mlp(n_features=8, hidden=16, name=f"c{i}") for i in range(3)]
    source = Source(tmp_path / "in")
    bm = sk.BroadcastModel(connect, versions[0])
    labels = ["1"]
    query = _stream(connect, bm, source, str(tmp_path))
    try:
        for i, model in enumerate(versions):
            if i:
                labels.append(bm.update(model))
            source.add(1)
            query.processAllAvailable()
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    _assert_scored_by(_sink(connect, str(tmp_path)), source,
                      {(label, model): [i] for i, (label, model) in enumerate(zip(labels, versions))})
    caches = worker_caches(connect)
    assert not any(bm.key in c["keys"] for c in caches.values() if f"{bm.key}.v3" in c["keys"]), caches
    bm.destroy()


def test_keyed_models_on_connect(connect):
    from tests.spark.test_keyed import _assert_exact, _frame, _rows

    by_key = {k: models.mlp(n_features=4, hidden=8, name=f"model_{k}") for k in ("a", "b", "c")}
    km = sk.KeyedModels(connect, by_key)
    try:
        rows = _rows(["a", "b", "c"]) + [(9_999, "zz", [0.0] * 4)]
        out = km.transform(_frame(connect, rows), "features", key="key", on_invalid="null",
                           error_col="error").toPandas()
        assert len(out) == len(rows)
        _assert_exact(out[out.key != "zz"], by_key)
        assert out[out.key == "zz"].error.tolist() == ["key: no model for key 'zz'"]
    finally:
        km.destroy()


@pytest.mark.slow  # a whole job or driver of its own, or a cluster: 40-50 s
def test_custom_layer_from_main_on_connect(connect, tmp_path):
    connect.stop()  # the script starts its own local server, on the same port
    run_script(tmp_path, MAIN_DRIVER, "CONNECT-MAIN-OK", timeout=400)


def test_an_update_with_new_custom_objects_on_connect(connect):
    """update() to a model whose class the workers cannot import (defined here: pickled by
    value) ships its custom objects as a file artifact of the session, which workers read
    checked by the digest in the driver's answer (never a pickle over the driver's
    channel): the action scores every row with the new version, exactly."""
    import keras

    class Triple(keras.layers.Layer):  # not importable in a worker
        def call(self, t):
            return t * 3.0

    v1 = models.mlp(n_features=8, hidden=16, name="cobj1")
    v2 = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(1), Triple()])
    x = np.random.default_rng(5).standard_normal((12, 8), dtype=np.float32)
    df = connect.createDataFrame([(i, x[i].tolist()) for i in range(len(x))],
                                 "id long, features array<float>").repartition(2)
    bm = sk.BroadcastModel(connect, v1)
    try:
        assert bm.update(v2) == "2"
        assert isinstance(bm._schedule.versions[2].source["objects"], str)  # shipped, by digest
        got = bm.transform(df, "features", version_col="v").orderBy("id").toPandas()
        assert set(got.v) == {"2"}
        np.testing.assert_allclose(got.prediction.to_numpy(np.float32),
                                   _exact(v2, [x])[0].reshape(-1), rtol=1e-5, atol=1e-6)
    finally:
        bm.destroy()
