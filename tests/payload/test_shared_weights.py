"""Weights shared through a memory-mapped payload file: fidelity, privacy of writes,
memory across real processes, and the write-once file protocol (killed writer, damaged
file, concurrent first use)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal

import keras
import numpy as np
import pytest

import spark_keras as sk
from spark_keras.inference import predictor_for
from spark_keras.payload import codec, host_file, mapped
from spark_keras.payload.shipment import Shipment
from tests import models

pytestmark = pytest.mark.timeout(300)


def _assert_identical(a, b) -> None:
    keras.tree.map_structure(lambda p, q: np.testing.assert_array_equal(np.asarray(p), np.asarray(q)), a, b)


def _adapted_text_model() -> keras.Model:
    """Assets (an adapted vocabulary) and non-trainable state (BatchNormalization)."""
    lookup = keras.layers.StringLookup()
    lookup.adapt(np.array(["a", "b", "c", "a", "d"]))
    inp = keras.Input((3,), dtype="string")
    h = keras.layers.CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="count")(lookup(inp))
    h = keras.layers.BatchNormalization()(keras.layers.Dense(8)(h))
    return keras.Model(inp, keras.layers.Dense(2)(h))


@pytest.mark.parametrize("build, inputs", [
    (models.actor_cnn, lambda m: models.random_like_inputs(m, 4)),
    (models.multi_io, lambda m: models.random_like_inputs(m, 7)),
    (_adapted_text_model, lambda m: __import__("tensorflow").constant([["a", "b", "z"], ["d", "d", "c"]])),
], ids=["cnn", "multi-io", "assets"])
def test_shared_load_is_bit_identical_and_shares_every_weight(tmp_path, build, inputs):
    model = build()
    x = inputs(model)
    path = tmp_path / "m.skp"
    sk.save(model, path)
    shared, memory = codec.load_mapped(path, share_weights=True)
    _assert_identical(model(x), shared(x))
    _assert_identical(model.predict(x, verbose=0), shared.predict(x, verbose=0))
    if build is not _adapted_text_model:  # string inputs have no compiled predictor
        _assert_identical(predictor_for(model)(keras.tree.flatten(x)),
                          predictor_for(shared)(keras.tree.flatten(x)))
    total = sum(np.asarray(v.numpy()).nbytes for v in model.variables if v.dtype != "string")
    # every float variable's buffer lies inside the mapping (TensorFlow's assign op
    # adopted the DLPack tensor instead of copying it)
    assert memory.shared and memory.shared_bytes >= total - 64 * len(model.variables)
    assert memory.private_bytes <= 64 * len(model.variables), memory
    assert _bytes_on_mappings_of(shared, path) == memory.shared_bytes  # seen by the kernel too
    private, copied = codec.load_mapped(path, share_weights=False)
    _assert_identical(model(x), private(x))
    assert copied.shared_bytes == 0 and copied.private_bytes >= total - 64 * len(model.variables)
    # no weight of the private model lies in a mapping of the file (were share_weights
    # ignored, its variables would be views of a mapping kept alive by them)
    assert _bytes_on_mappings_of(private, path) == 0


def _bytes_on_mappings_of(model, path) -> int:
    """Bytes of ``model``'s variables whose buffers lie in this process's mappings of
    the file ``path`` (from /proc/self/maps: whatever spark_keras reports)."""
    target = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                start, end = (int(a, 16) for a in fields[0].split("-"))
                ranges.append((start, end))
    found = 0
    for variable in model.variables:
        address, nbytes = mapped._buffer(variable)
        found += nbytes if any(start <= address < end for start, end in ranges) else 0
    return found


def test_writes_stay_in_the_writing_model(tmp_path):
    model = models.mlp(8, 32, 2)
    path = tmp_path / "m.skp"
    sk.save(model, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    x = np.random.default_rng(0).standard_normal((5, 8)).astype("float32")
    a = sk.load(path, share_weights=True)
    b = sk.load(path, share_weights=True)  # a second mapping, as another process has
    a.layers[0].kernel.assign_add(np.ones((8, 32), "float32"))
    a.layers[1].kernel.assign(np.zeros((32, 2), "float32"))
    a.compile(optimizer="sgd", loss="mse")
    a.fit(x, np.ones((5, 2), "float32"), epochs=1, verbose=0)  # training: in-place updates
    assert not np.array_equal(np.asarray(a(x)), np.asarray(model(x)))
    _assert_identical(b(x), model(x))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # the file never changes
    _assert_identical(sk.load(path, share_weights=True)(x), model(x))


def test_only_safe_arrays_become_shared_tensors():
    buffer = np.zeros(1024 + 16, dtype=np.uint8)
    base = (-buffer.ctypes.data) % 64
    aligned = buffer[base: base + 512].view(np.float32)
    assert mapped.shared_tensor(aligned, "float32") is not None
    unaligned = buffer[base + 4: base + 516].view(np.float32)
    assert mapped.shared_tensor(unaligned, "float32") is None  # TensorFlow would abort
    assert mapped.shared_tensor(aligned, "float64") is None
    read_only = aligned.copy()
    read_only.flags.writeable = False
    assert mapped.shared_tensor(read_only, "float32") is None
    assert mapped.shared_tensor(aligned[:0], "float32") is None


def test_bfloat16_weights_fall_back_to_a_copy(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, dtype="bfloat16")])
    path = tmp_path / "bf16.skp"
    sk.save(model, path)
    loaded, memory = codec.load_mapped(path, share_weights=True)
    x = np.ones((2, 4), "float32")
    _assert_identical(model(x), loaded(x))
    assert memory.private_bytes > 0


# --- memory across real processes ---------------------------------------------------------

def _pss_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Pss:"))


def _load_and_hold(path: str, share: bool, barrier, results) -> None:
    import keras as _keras  # imported before the baseline: TensorFlow's pages are not the model's

    _keras.ops.convert_to_numpy(_keras.ops.ones((2, 2)) @ _keras.ops.ones((2, 2)))
    barrier.wait()
    before = _pss_kb()
    barrier.wait()
    model = sk.load(path, share_weights=share)
    model(np.zeros((1, 512), "float32"))  # touches every weight page
    barrier.wait()  # every process holds its model now
    results.put(_pss_kb() - before)
    barrier.wait()


@pytest.mark.parametrize("share", [True, False], ids=["shared", "copies"])
@pytest.mark.slow  # four processes holding a 50 MB model: 40 s
def test_four_processes_hold_one_copy(tmp_path, share):
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(4096), keras.layers.Dense(2048),
                              keras.layers.Dense(1)])  # 40 MB
    path = str(tmp_path / "big.skp")
    sk.save(model, path)
    weights_kb = sum(v.numpy().nbytes for v in model.variables) / 1024
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_load_and_hold, args=(path, share, barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    growth = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
    ratio = sum(growth) / weights_kb
    if share:
        assert ratio <= 1.5, (growth, weights_kb)
    else:
        assert ratio >= 3.5, (growth, weights_kb)  # the baseline this feature removes


# --- the write-once file protocol ---------------------------------------------------------

def _land_counting(folder: str, payload: bytes, log: str, barrier) -> tuple[int, int]:
    def fetch():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return payload

    barrier.wait()
    path = host_file.land(folder, "m", len(payload), fetch)
    return host_file.identity(path)


def _land_in(folder, payload, log, barrier, results):
    results.put(_land_counting(folder, payload, log, barrier))


@pytest.mark.slow  # a whole process or session of its own: make test-slow
def test_concurrent_first_use_writes_once(tmp_path):
    payload = sk.dumps(models.mlp(32, 256, 4))
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    log = str(tmp_path / "fetches.log")
    procs = [ctx.Process(target=_land_in, args=(str(tmp_path / "f"), payload, log, barrier, results))
             for _ in range(4)]
    for p in procs:
        p.start()
    identities = {results.get(timeout=120) for _ in procs}
    for p in procs:
        p.join(30)
    assert len(identities) == 1  # every process got the same file
    assert len(open(log).read().split()) == 1  # written by one of them
    assert sorted(os.listdir(tmp_path / "f")) == ["m.skp", "m.skp.lock"]


def _die_while_writing(folder: str, payload: bytes) -> None:
    def fetch():
        # what a writer killed mid-write leaves: the lock taken, half a temporary file
        path = host_file.path_for(folder, "m")
        with open(f"{path}.tmp-{os.getpid()}", "wb") as f:
            f.write(payload[: len(payload) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    host_file.land(folder, "m", len(payload), fetch)


def test_a_killed_writer_leaves_nothing_that_is_used(tmp_path):
    model = models.mlp(16, 64, 2)
    payload = sk.dumps(model)
    folder = str(tmp_path / "f")
    proc = mp.get_context("spawn").Process(target=_die_while_writing, args=(folder, payload))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    leftovers = os.listdir(folder)
    assert "m.skp" not in leftovers and any(".tmp-" in n for n in leftovers)
    shipment = Shipment.of(model)
    loaded, nbytes, memory = shipment.build_shared(folder, "m", len(payload))
    x = np.ones((3, 16), "float32")
    _assert_identical(loaded(x), model(x))
    assert memory["shared"] and nbytes == len(payload)
    assert sorted(os.listdir(folder)) == ["m.skp", "m.skp.lock"]  # the stale temp is gone


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_file_is_detected_and_rewritten(tmp_path, damage):
    model = models.mlp(16, 64, 2)
    shipment = Shipment.of(model)
    folder = str(tmp_path / "f")
    path = host_file.land(folder, "m", len(shipment.payload), lambda: shipment.payload)
    data = bytearray(open(path, "rb").read())
    if damage == "truncated":
        data = data[:-100]
    else:
        data[-100] ^= 0xFF  # in the last tensor
    with open(path, "r+b") as f:  # in place: the same inode, as disk damage would be
        f.truncate(0)
        f.write(data)
    before = host_file.identity(path)
    loaded, _, memory = shipment.build_shared(folder, "m", len(shipment.payload))
    x = np.ones((3, 16), "float32")
    _assert_identical(loaded(x), model(x))
    assert memory["shared"]
    assert host_file.identity(path) != before
    assert open(path, "rb").read() == shipment.payload


class _Unregistered(keras.layers.Layer):
    def call(self, x):
        return 2 * x


def test_a_payload_that_cannot_load_is_not_rewritten(tmp_path):
    """A sound file whose model cannot be built here (an unknown custom class) raises
    the loading error; the file is not rewritten."""
    model = keras.Sequential([keras.Input((4,)), _Unregistered()])
    payload = sk.dumps(model)
    folder = str(tmp_path / "f")
    path = host_file.land(folder, "m", len(payload), lambda: payload)
    before = host_file.identity(path)
    with pytest.raises(sk.PayloadError, match="custom class is unknown"):
        Shipment(payload, b"", True).build_shared(folder, "m", len(payload))
    assert host_file.identity(path) == before
    loaded, _, _ = Shipment.of(model).build_shared(folder, "m", len(payload))
    assert isinstance(loaded.layers[0], _Unregistered)


def test_a_process_without_the_payload_cannot_write_the_file(tmp_path):
    """A pool child or a Dask worker that let go of the payload bytes refuses clearly
    when the file it should map is missing."""
    shipment = Shipment.of(models.mlp(4, 8, 1)).without_payload()
    with pytest.raises(sk.PayloadError, match="holds no copy of the payload"):
        shipment.build_shared(str(tmp_path / "f"), "m", 1234)


def test_a_streaming_writer_lands_a_whole_file_or_nothing(tmp_path):
    payload = sk.dumps(models.mlp(4, 8, 2))
    folder = str(tmp_path / "f")

    def broken(out):  # a download that dies half-way
        out.write(payload[:100])
        raise OSError("connection reset")

    with pytest.raises(OSError, match="connection reset"):
        host_file.land(folder, "m", len(payload), write=broken)
    with pytest.raises(sk.PayloadError, match="the payload of m is 100 bytes, expected"):
        host_file.land(folder, "m", len(payload), write=lambda out: out.write(payload[:100]))
    assert os.listdir(folder) == ["m.skp.lock"]  # no partial file, no temporary left
    path = host_file.land(folder, "m", len(payload), write=lambda out: out.write(payload))
    assert open(path, "rb").read() == payload
    with pytest.raises(TypeError, match="one of fetch and write"):
        host_file.land(folder, "n", 1)
