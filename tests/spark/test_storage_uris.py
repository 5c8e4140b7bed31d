"""Models stored anywhere: BroadcastModel from a ``file://`` or ``s3://`` URI (a real
S3-compatible server, tests.s3_server). Executors read the file straight from storage,
once per executor, checked against the digest the driver read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import spark_keras as sk
from spark_keras import storage
from spark_keras.inference import predictor_for
from spark_keras.payload.stored import StoredModel, body_digest, open_model
from tests import models
from tests.conftest import builds_by_worker, worker_cache_infos


def _keras_bytes(model, tmp_path) -> bytes:
    path = tmp_path / "m.keras"
    model.save(path)
    return path.read_bytes()


def _settle() -> None:
    time.sleep(0.3)  # the server logs a request just after answering it


# --- the storage module on its own ------------------------------------------------------

def test_uris_are_told_from_paths():
    assert storage.is_uri("s3://b/k") and storage.is_uri("file:///tmp/m.skp")
    assert storage.is_uri("hdfs://nn:8020/m.keras")
    assert not storage.is_uri("/tmp/m.skp") and not storage.is_uri("m.keras")
    assert not storage.is_uri("C:\\models\\m.keras") and not storage.is_uri(None)


def test_open_model_reads_payloads_and_keras_files_from_paths_and_uris(tmp_path):
    model = models.mlp(4, 8, 2)
    sk.save(model, tmp_path / "m.skp")
    model.save(tmp_path / "m.keras")
    payload = (tmp_path / "m.skp").read_bytes()
    x = np.random.default_rng(0).standard_normal((5, 4)).astype("float32")

    for where in (str(tmp_path / "m.skp"), tmp_path / "m.keras"):
        loaded, data, stored = open_model(where)
        assert stored is None and sk.is_payload(data)
        np.testing.assert_array_equal(loaded(x), model(x))

    loaded, data, stored = open_model(f"file://{tmp_path}/m.skp")
    assert data == payload
    assert stored == StoredModel(f"file://{tmp_path}/m.skp", "payload", len(payload),
                                 body_digest(payload))
    loaded, data, stored = open_model(f"file://{tmp_path}/m.keras")
    assert stored.kind == "keras" and stored.nbytes == len(data)
    assert stored.digest == body_digest(data)
    np.testing.assert_array_equal(loaded(x), model(x))


def test_a_worker_writes_the_same_payload_and_refuses_a_changed_file(tmp_path):
    model = models.mlp(4, 8, 2)
    model.save(tmp_path / "m.keras")
    _, payload, stored = open_model(f"file://{tmp_path}/m.keras")
    with open(tmp_path / "out.skp", "w+b") as out:  # the .keras file converted again
        stored.write_payload(out)
    assert (tmp_path / "out.skp").read_bytes() == payload

    models.mlp(4, 8, 2).save(tmp_path / "m.keras")  # replaced by another model
    with open(tmp_path / "again.skp", "w+b") as out, \
            pytest.raises(sk.PayloadError, match="m.keras' converts to a different payload"):
        stored.write_payload(out)


def test_missing_and_foreign_files_are_named(tmp_path, s3):
    with pytest.raises(sk.StorageError, match=r"model file '.*nope.skp' does not exist"):
        open_model(tmp_path / "nope.skp")
    with pytest.raises(sk.StorageError, match=r"model file 'file://.*nope.skp' does not exist"):
        open_model(f"file://{tmp_path}/nope.skp")
    with pytest.raises(sk.StorageError, match=r"model file 's3://models/absent.skp.*' does not exist"):
        open_model(s3.uri("absent.skp"))
    with pytest.raises(sk.StorageError, match="cannot open model URI 'nosuch://x/m.skp'"):
        open_model("nosuch://x/m.skp")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(sk.PayloadError, match="notes.txt' is neither a spark_keras payload nor a .keras"):
        open_model(f"file://{tmp_path}/notes.txt")
    import zipfile

    with zipfile.ZipFile(tmp_path / "broken.keras", "w") as archive:  # a zip, not a model
        archive.writestr("config.json", "{not json")
    with pytest.raises(sk.PayloadError, match=r"Keras cannot load the .keras file '.*broken.keras'"):
        open_model(tmp_path / "broken.keras")


def _race(writers: int, rounds: int, save) -> list[BaseException]:
    """``writers`` threads calling ``save(writer)`` ``rounds`` times, each round started
    together; the errors they raised."""
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def run(writer: int) -> None:
        for _ in range(rounds):
            barrier.wait()
            try:
                save(writer)
            except BaseException as exc:  # collected: the test names them all
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def test_threads_writing_one_path_each_leave_a_whole_file(tmp_path):
    """Threads of one process share a pid: each atomic write needs a temporary file of
    its own, or one thread's rename takes another's half-written file (or fails)."""
    path = tmp_path / "m.skp"
    versions = [bytes([w]) * (2 * 2**20 + w) for w in range(8)]  # 2 MB, each its own size
    errors = _race(8, 5, lambda w: storage.write_local(path, versions[w]))
    assert not errors, errors
    assert path.read_bytes() in versions
    assert os.listdir(tmp_path) == ["m.skp"]  # no temporary file left


def test_threads_saving_models_to_one_path_leave_one_loadable_model(tmp_path):
    path = tmp_path / "m.skp"
    writers = [models.mlp(64, 512, 2) for _ in range(6)]
    payloads = [sk.dumps(m) for m in writers]
    errors = _race(len(writers), 3, lambda w: sk.save(writers[w], path))
    assert not errors, errors
    which = payloads.index(path.read_bytes())  # whole: one of the models, bit for bit
    x = np.ones((2, 64), "float32")
    np.testing.assert_array_equal(sk.load(path)(x), writers[which](x))
    assert os.listdir(tmp_path) == ["m.skp"]


def _modules_imported(module: str) -> set[str]:
    """The spark_keras modules ``import module`` loads in a fresh interpreter, the
    package's ``__init__`` left out (it imports the public API of every layer)."""
    code = textwrap.dedent(f"""
        import importlib, importlib.util, sys, types
        package = types.ModuleType("spark_keras")  # the package, without its __init__
        package.__path__ = importlib.util.find_spec("spark_keras").submodule_search_locations
        sys.modules["spark_keras"] = package
        importlib.import_module({module!r})
        print(" ".join(sorted(n for n in sys.modules if n.startswith("spark_keras."))))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    return set(out.stdout.split())


def test_storage_and_flavour_import_nothing_of_the_payload_layer():
    storage_needs = _modules_imported("spark_keras.storage")
    assert storage_needs == {"spark_keras.storage", "spark_keras.errors"}, storage_needs
    flavour_needs = _modules_imported("spark_keras.flavour")
    assert "spark_keras.flavour" in flavour_needs
    assert not [m for m in flavour_needs if m.startswith("spark_keras.payload")], flavour_needs
    # the payload layer stands on its own, whatever the package's __init__ imports first
    assert "spark_keras._version" in _modules_imported("spark_keras.payload.stored")


# --- on Spark ---------------------------------------------------------------------------

@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_s3_models_are_read_by_the_executor_once_and_match_bit_for_bit(spark, build_log, s3, tmp_path):
    model = models.mlp(6, 16, 3)
    x = np.random.default_rng(3).standard_normal((48, 6)).astype("float32")
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(48)],
                               "id long, f array<float>").repartition(8)
    want = predictor_for(model)([x], 1024)[0]

    s3.put("mlp.skp", sk.dumps(model))
    s3.put("mlp.keras", _keras_bytes(model, tmp_path))
    for name in ("mlp.skp", "mlp.keras"):
        bm = sk.BroadcastModel(spark, s3.uri(name))
        assert type(bm._transport).__name__ == "StorageTransport"
        _settle()
        read_by_driver = s3.gets(name)
        assert read_by_driver == 1
        for _ in range(2):  # two actions, 8 tasks each, on all the executor's workers
            got = bm.transform(df, "f").orderBy("id").toPandas()["prediction"]
            np.testing.assert_array_equal(np.stack(got.to_numpy()), want, err_msg=name)

        def score(rows, bm=bm):  # the RDD worker pool
            rows = list(rows)
            return zip([r.id for r in rows], bm.predict_partition([r.f for r in rows]))

        rdd_got = dict(df.rdd.mapPartitions(score).collect())
        np.testing.assert_array_equal(np.stack([rdd_got[i] for i in range(48)]), want)
        _settle()
        assert s3.gets(name) - read_by_driver == 1, (name, s3.requests)  # one executor, one read
        builds = builds_by_worker(build_log, bm.key)
        assert len(builds) >= 2 and set(builds.values()) == {1}, builds  # SQL and RDD workers
        infos = worker_cache_infos(spark, bm)
        memory = [i["memory_by_key"][bm.key] for i in infos.values() if bm.key in i["memory_by_key"]]
        assert memory and all(m["shared"] and m["private_bytes"] == 0 for m in memory), infos


def test_a_model_changed_or_damaged_in_storage_is_refused(spark, s3):
    """A model file replaced, damaged or deleted in storage since the driver read it is not
    the job's model: the workers refuse it and read the version the job was planned with
    from the driver's copy instead (tests/spark/test_versions.py); reading the file itself
    names what is wrong with it."""
    df = spark.createDataFrame([(1, [1.0, 2.0, 3.0, 4.0])], "id long, f array<float>")
    original = sk.dumps(models.mlp(4, 8, 1))
    want = predictor_for(sk.loads(original))([np.array([[1, 2, 3, 4]], "float32")], 1024)[0][0, 0]

    changed = sk.BroadcastModel(spark, s3.put("changed.skp", original))
    s3.put("changed.skp", sk.dumps(models.mlp(4, 8, 1)))
    assert changed.transform(df, "f").collect()[0].prediction == want
    with pytest.raises(sk.PayloadChangedError, match=r"model file 's3://models/changed.skp.*' changed"):
        changed._transport.stored.read_payload()  # which the workers found, and set aside

    damaged = sk.BroadcastModel(spark, s3.put("damaged.skp", original))
    body = bytearray(original)
    body[-8] ^= 0xFF  # the header (and its digest) intact, a weight flipped
    s3.put("damaged.skp", bytes(body))
    assert damaged.transform(df, "f").collect()[0].prediction == want
    with pytest.raises(sk.PayloadError, match="checksum"):
        sk.loads(damaged._transport.stored.read_payload())  # read whole: its checksum fails

    gone = sk.BroadcastModel(spark, s3.put("gone.skp", original))
    s3.fs.delete_file("models/gone.skp")
    assert gone.transform(df, "f").collect()[0].prediction == want
    with pytest.raises(sk.StorageError, match=r"model file 's3://models/gone.skp.*' does not exist"):
        gone._transport.stored.read_payload()


def test_a_file_uri_model_after_unpersist_and_destroy(spark, build_log, tmp_path):
    from spark_keras.executor.transport.executor_file import executor_folder

    model = models.mlp(4, 8, 2)
    sk.save(model, tmp_path / "m.skp")
    bm = sk.BroadcastModel(spark, f"file://{tmp_path}/m.skp")
    df = spark.createDataFrame([(i, [float(i)] * 4) for i in range(16)],
                               "id long, f array<float>").coalesce(1)  # one batch, as `want`'s
    want = predictor_for(model)([np.array([[float(i)] * 4 for i in range(16)], "float32")], 1024)[0]
    first = bm.key
    bm.transform(df, "f").collect()
    bm.unpersist()
    got = bm.transform(df, "f").orderBy("id").toPandas()["prediction"]
    np.testing.assert_array_equal(np.stack(got.to_numpy()), want)
    assert set(builds_by_worker(build_log, bm.key).values()) == {1}
    second = bm.key
    bm.destroy()
    other = sk.BroadcastModel(spark, models.mlp(4, 8, 1))

    def files(_):
        other.release_stale()  # a live handle carries the released keys
        folder = executor_folder()
        yield sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    names = {n for part in spark.sparkContext.parallelize(range(4), 4).mapPartitions(files).collect()
             for n in part}
    assert not any(n.startswith((first, second)) for n in names), names

