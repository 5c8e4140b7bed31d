"""A large payload carried to every executor at ship time through Spark's own block
transfer (classic Spark), so that the driver sends it about once whatever the number of
executors; each executor's file of it is then written before any task needs it, and the
handle's transport is the driver's copy (:class:`.ServedTransport`), which executors that
were not there download when they need it.

The payload goes in waves of :data:`WAVE_CHUNKS` chunks, each chunk a PySpark broadcast
(Spark's TorrentBroadcast: 4 MiB blocks under Spark's authentication and network
encryption). One job per wave, a task per executor: the task fetches the whole wave from
the executors that hold its blocks and writes it into the executor's partial file
(:mod:`.partial_file`), and fetches its share of the next wave from the driver (the
seed; the first wave's seed is a job of its own); the driver then lets its own blocks
of the next wave go, and the wave's broadcasts are destroyed. So the driver sends each
block once (Spark picks a block's source among all its holders at random, the driver
among them: with the driver's copy kept, it would send about 1 + 1/2 + ... + 1/n copies
for n executors), the driver's block manager holds at most a wave, an executor's a wave
and its share of the next (and, for a moment, the wave before while its removal goes
on). The last wave's task publishes the partial file as the executor's payload file
only if its SHA-256, taken as the chunks were written, is the one the driver fixed
(:mod:`spark_keras.payload.host_file`).

Any failure (an executor lost between a seed and its wave, a file that cannot be
written) stops the warm-up, not the ship: executors whose file is not there download it
from the driver when they first need it, checked against the same digest."""

from __future__ import annotations

import functools
import logging
import os
from typing import Any, Iterator

from spark_keras.errors import PayloadError
from spark_keras.executor.transport import partial_file
from spark_keras.executor.transport.broadcast import _forget_loaded_value
from spark_keras.executor.transport.executor_file import executor_folder
from spark_keras.executor.transport.served import ServedTransport
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
    waves = [range(first, min(first + WAVE_CHUNKS, chunks))
             for first in range(0, chunks, WAVE_CHUNKS)]
    alive: list[Any] = []  # the broadcasts not destroyed yet
    try:
        with open(path, "rb") as f:
            wave = _broadcasts(sc, f, waves[0], alive)
            if blocks is not None:  # the first wave's seed: a job of its own
                _spread(sc, tasks, _drain, wave, blocks)
            for number, numbers in enumerate(waves):
                last = number == len(waves) - 1
                following = [] if last else _broadcasts(sc, f, waves[number + 1], alive)
                write = functools.partial(_write, key, nbytes, numbers.start * CHUNK_BYTES, wave,
                                          served if last else None)
                landed = sum(_spread(sc, tasks, write, following if blocks is not None else [],
                                     blocks))
                _destroy(wave, alive, blocking=last)
                wave = following
    except Exception as exc:  # the executors without the file download it when they need it
        logger.warning("model %s: the executors' files were not written through Spark's block "
                       "transfer (%s); executors download it from the driver when they need it",
                       key, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        _destroy(alive, alive, blocking=True)
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


def _broadcasts(sc: Any, f: Any, numbers: range, alive: list[Any]) -> list[Any]:
    """Chunks ``numbers`` of the payload file ``f``, a broadcast each (the driver's
    Python holds one chunk at a time), added to ``alive``."""
    wave: list[Any] = []
    for number in numbers:
        f.seek(number * CHUNK_BYTES)
        data = f.read(CHUNK_BYTES)
        wave.append(sc.broadcast(data))
        alive.append(wave[-1])
        del data
    return wave


def _spread(sc: Any, tasks: int, function: Any, seed: list[Any], blocks: Any) -> list[Any]:
    """``function`` run as ``tasks`` tasks, the k-th of which also fetches the k-th share
    of the broadcasts ``seed`` (an executor fetches a task's broadcasts before the task
    begins); the driver's BlockManager ``blocks`` then lets its own blocks of them go, so
    that executors fetch them from each other.

    A task each, launched together: with a slot per task free (Spark's offers go round
    the executors, a task each), one on every executor. A wave an executor misses
    (another job held its slot) is found by the digest at the last wave: that executor
    downloads the payload when it needs it."""
    jobs = [sc.parallelize([k], 1).mapPartitions(functools.partial(_seeded, function,
                                                                   seed[k::tasks]))
            for k in range(tasks)]
    results = sc.union(jobs).collect()
    if blocks is not None:
        for chunk in seed:
            blocks.removeBroadcast(chunk._jbroadcast.id(), True)
    return results


def _destroy(wave: list[Any], alive: list[Any], blocking: bool) -> None:
    """The broadcasts of ``wave`` destroyed everywhere (and taken out of ``alive``)."""
    for chunk in list(wave):
        chunk.destroy(blocking=blocking)
        alive.remove(chunk)


def _seeded(function: Any, chunks: list[Any], items: Iterator[Any]) -> Iterator[int]:
    """In a worker: ``function(items)``; the executor fetched ``chunks`` before the task
    began (``function`` may be :func:`_drain`: a seed alone, nothing to return)."""
    return function(items) or iter(())


def _drain(items: Iterator[Any]) -> None:
    """Read the task's input to its end: PySpark reuses a worker only then (else each
    wave's job would start workers afresh, and import this package in each)."""
    for _ in items:
        pass


def _part_path(key: str) -> str | None:
    folder = executor_folder()
    return None if folder is None else host_file.path_for(folder, key) + PART


def _write(key: str, nbytes: int, offset: int, chunks: list[Any], served: ServedTransport | None,
           items: Iterator[Any]) -> Iterator[int]:
    """In a worker: ``chunks`` written one after the other from ``offset`` on in the
    executor's partial file of ``key`` (:mod:`.partial_file`); given ``served`` (the
    last wave), the file then published if it is the payload whose digest the driver
    fixed (1), else removed (0)."""
    _drain(items)
    part = _part_path(key)
    if part is None:
        return iter([0])
    private_folder(os.path.dirname(part))
    partial_file.write(part, key, offset, map(_value, chunks))
    if served is None:
        return iter([0])
    try:
        partial_file.publish(part, key, nbytes, served)
    except PayloadError as exc:  # a wave this executor missed: it downloads the payload
        logger.info("%s", exc)
        return iter([0])
    finally:
        _drop_part(key, None)
    return iter([1])


def _value(chunk: Any) -> bytes:
    """In a worker: a chunk broadcast's bytes, the worker's copy let go (one chunk in
    this worker's memory at a time)."""
    try:
        data = chunk.value
        if not isinstance(data, bytes):
            raise PayloadError(f"a chunk of a model payload is a {type(data).__name__}, "
                               f"not bytes: refused")
        return data
    finally:
        _forget_loaded_value(chunk)


def _drop_part(key: str, _: Any) -> None:
    partial_file.forget(key)
    part = _part_path(key)
    if part is not None and os.path.exists(part):
        os.remove(part)
