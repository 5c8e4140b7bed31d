"""A large payload carried to every executor at ship time through Spark's own block
transfer (classic Spark), so that the driver sends it about once whatever the number of
executors; each executor's file of it is then written before any task needs it, and the
handle's transport is the driver's copy (:class:`.ServedTransport`), which executors that
were not there download when they need it.

The payload goes in waves of :data:`WAVE_CHUNKS` chunks, each chunk a PySpark broadcast
(Spark's TorrentBroadcast: 4 MiB blocks under Spark's authentication and network
encryption). For a wave, one job whose task on each executor fetches a share of the
wave's chunks from the driver (the seed), then the driver lets its own blocks of them go,
then one job whose task on each executor fetches the whole wave, from the executors that
hold its blocks, and writes it into the executor's partial file; then the wave's
broadcasts are destroyed. No block manager holds more than a wave, the driver's included,
and the driver sends each block once (Spark picks a block's source among all its holders
at random, the driver among them: with the driver's copy kept, it would send about
1 + 1/2 + ... + 1/n copies for n executors). A last job hashes each executor's partial
file and publishes it as the executor's payload file only if its SHA-256 is the one the
driver fixed (:mod:`spark_keras.payload.host_file`).

Any failure (an executor lost between a seed and its wave, a file that cannot be
written) stops the warm-up, not the ship: executors whose file is not there download it
from the driver when they first need it, checked against the same digest."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Iterator

from spark_keras.errors import PayloadError
from spark_keras.executor.transport.broadcast import _forget_loaded_value
from spark_keras.executor.transport.executor_file import executor_folder
from spark_keras.executor.transport.served import Hashing, ServedTransport
from spark_keras.executor.transport.slot_wait import run_unless_stalled
from spark_keras.payload import host_file
from spark_keras.private_folder import private_folder

logger = logging.getLogger("spark_keras")

# bytes per chunk: two of Spark's default 4 MiB broadcast blocks (spark.broadcast.blockSize)
# once pickled, Java-serialized and LZ4-framed (which adds at most 1/255 + 16 bytes); a
# chunk of exactly 8 MiB took three, the third of a few KiB and a round trip of its own
CHUNK_BYTES = 8 * 2**20 - 64 * 2**10
# chunks in the block managers at once: 64 MiB of a 1 GiB heap's ~430 MiB storage memory
WAVE_CHUNKS = 8
PART = ".part"


def executors(sc: Any) -> int:
    """The executors apart from the driver (0 in local mode, where the driver's block
    manager is the only one)."""
    return max(sc._jsc.sc().getExecutorMemoryStatus().size() - 1, 0)


def warm(sc: Any, path: str, key: str, nbytes: int, served: ServedTransport) -> int:
    """Write ``key``'s file (the payload the driver keeps at ``path``, ``nbytes`` long,
    ``served``'s digest) on each of ``sc``'s executors through Spark's block transfer;
    the number of executors whose file was published (0 if the warm-up stopped, or gave
    up waiting for task slots other jobs hold: :mod:`.slot_wait`)."""
    return run_unless_stalled(sc, functools.partial(_warm, sc, path, key, nbytes, served), 0,
                              f"model {key}: the executors' files at ship")


def _warm(sc: Any, path: str, key: str, nbytes: int, served: ServedTransport) -> int:
    count = executors(sc)
    tasks = max(count, 1)
    chunks = -(-nbytes // CHUNK_BYTES)
    blocks = _driver_blocks(sc) if count > 1 else None  # (else nothing to seed)
    try:
        with open(path, "rb") as f:
            for first in range(0, chunks, WAVE_CHUNKS):
                _wave(sc, f, first, min(first + WAVE_CHUNKS, chunks), key, tasks, blocks)
        seal = functools.partial(_seal, key, nbytes, served)
        landed = sum(_each_executor(sc, tasks, seal))
    except Exception as exc:  # the executors without the file download it when they need it
        logger.warning("model %s: the executors' files were not written through Spark's block "
                       "transfer (%s); executors download it from the driver when they need it",
                       key, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        sc.parallelize(range(tasks), tasks).foreach(functools.partial(_drop_part, key))
        return 0
    logger.info("model %s: %d chunks of %.1f MB in Spark's block transfer, the file written on "
                "%d of %d executors", key, chunks, CHUNK_BYTES / 2**20, landed, tasks)
    return landed


def _driver_blocks(sc: Any) -> Any:
    """The driver's BlockManager (JVM), or None where it cannot be reached (the driver
    then keeps its blocks of a wave until the wave is written: it sends about
    1 + 1/2 + ... + 1/n copies for n executors). Read from SparkEnv's field: Py4J cannot
    call SparkEnv's methods (resolving them loads classes PySpark's JVM lacks)."""
    try:
        field = sc._jvm.java.lang.Class.forName("org.apache.spark.SparkEnv") \
            .getDeclaredField("blockManager")
        field.setAccessible(True)
        return field.get(sc._jsc.sc().env())
    except Exception as exc:
        logger.info("the driver keeps its blocks of each wave of chunks: %s",
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None


def _wave(sc: Any, f: Any, first: int, end: int, key: str, tasks: int, blocks: Any) -> None:
    """Chunks ``first`` to ``end`` (exclusive) of the payload file ``f`` into every
    executor's partial file of ``key``, seeded first if the driver's BlockManager
    ``blocks`` is given; their broadcasts destroyed everywhere after."""
    wave: list[Any] = []
    try:
        for number in range(first, end):  # the driver's Python holds one chunk
            f.seek(number * CHUNK_BYTES)
            data = f.read(CHUNK_BYTES)
            wave.append(sc.broadcast(data))
            del data
        if blocks is not None:  # each executor a share from the driver, which lets its blocks go
            shares = [sc.parallelize([k], 1).mapPartitions(functools.partial(_fetch, wave[k::tasks]))
                      for k in range(tasks) if wave[k::tasks]]
            sc.union(shares).collect()
            for chunk in wave:
                blocks.removeBroadcast(chunk._jbroadcast.id(), True)
        write = functools.partial(_write, key, first * CHUNK_BYTES, wave)
        _each_executor(sc, tasks, write)
    finally:
        for chunk in wave:
            chunk.destroy(blocking=True)


def _each_executor(sc: Any, tasks: int, function: Any) -> list[Any]:
    """``function`` run as ``tasks`` tasks launched together (a barrier stage): with a
    task per executor and a slot each, one on every executor (tasks of a plain job can
    all land on the first executor whose slot frees up)."""
    return sc.parallelize(range(tasks), tasks).barrier().mapPartitions(function).collect()


def _fetch(chunks: list[Any], items: Iterator[Any]) -> Iterator[int]:
    """In a worker: nothing; the executor fetched ``chunks`` before the task began."""
    _drain(items)
    return iter(())


def _drain(items: Iterator[Any]) -> None:
    """Read the task's input to its end: PySpark reuses a worker only then (else each
    wave's job would start workers afresh, and import this package in each)."""
    for _ in items:
        pass


def _part_path(key: str) -> str | None:
    folder = executor_folder()
    return None if folder is None else host_file.path_for(folder, key) + PART


def _write(key: str, offset: int, chunks: list[Any], items: Iterator[Any]) -> Iterator[int]:
    """In a worker: ``chunks`` written one after the other from ``offset`` on in the
    executor's partial file of ``key`` (its size is the driver's setting)."""
    _drain(items)
    part = _part_path(key)
    if part is None:
        return iter(())
    private_folder(os.path.dirname(part))
    fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in chunks:
            try:
                data = chunk.value
                if not isinstance(data, bytes):
                    raise PayloadError(f"a chunk of {key} at byte {offset} is a "
                                       f"{type(data).__name__}, not bytes: refused")
                os.pwrite(fd, data, offset)
                offset += len(data)
                del data
            finally:
                _forget_loaded_value(chunk)  # one chunk in this worker's memory at a time
    finally:
        os.close(fd)
    return iter(())


def _seal(key: str, nbytes: int, served: ServedTransport, items: Iterator[Any]) -> Iterator[int]:
    """In a worker: the executor's partial file of ``key`` published as its payload file
    if it is the payload whose digest the driver fixed (1), else removed (0)."""
    _drain(items)
    part = _part_path(key)
    if part is None or not os.path.exists(part):
        return iter([0])
    folder = os.path.dirname(part)

    def copy(out: Any) -> None:
        hashing = Hashing(out)
        with open(part, "rb") as f:
            while block := f.read(8 * 2**20):
                hashing.write(block)
        out.flush()
        served.check_digest(hashing.hexdigest(), "from its chunk broadcasts")

    try:
        host_file.land(folder, key, nbytes, write=copy, verify=served.check_file)
    except PayloadError as exc:  # a wave this executor missed: it downloads the payload
        logger.info("%s", exc)
        return iter([0])
    finally:
        _drop_part(key, None)
    return iter([1])


def _drop_part(key: str, _: Any) -> None:
    part = _part_path(key)
    if part is not None and os.path.exists(part):
        os.remove(part)
