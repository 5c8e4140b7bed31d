"""A large payload carried to every executor at ship time, the driver sending it about
once whatever the number of executors (classic Spark); each executor's file of it is
then written before any task needs it, and the handle's transport is the driver's copy
(:class:`.ServedTransport`), which executors that were not there download when they
need it.

One Spark job of two stages. Its map tasks each download a share of
:data:`SHARE_BYTES` from the driver's channel (``Range``: the driver's link carries the
payload once) and give every chunk of it to each of the job's reduce tasks, one per
executor, through Spark's shuffle: executors fetch the shares from each other (Spark's
block transfer, under its authentication and network encryption; Kryo, so that no
chunk stays in a heap once written). Each reduce task writes the chunks at their
offsets into the executor's payload file (:func:`spark_keras.payload.host_file.land`:
a temporary file of its own, renamed into place) only if the whole file's SHA-256 is
the one the driver fixed. The shuffle's files are removed when the job ends.

Any failure (an executor lost, a file that cannot be written) stops the warm-up, not
the ship: executors whose file is not there download it from the driver when they
first need it, checked against the same digest."""

from __future__ import annotations

import functools
import logging
from typing import Any, Iterator

from spark_keras.errors import PayloadError
from spark_keras.executor.transport.executor_file import executor_folder
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.executor.transport.slot_wait import run_unless_stalled
from spark_keras.payload import host_file
from spark_keras.payload.digest import file_digest

logger = logging.getLogger("spark_keras")

# bytes per shuffle record (a chunk, after its offset): 256 KiB records (under G1's
# humongous size) made the ship slower (72.6 s against 38.5 s, load 13-22), not the JVMs smaller
CHUNK_BYTES = 4 * 2**20
# bytes per map task's share, at most: a reduce task fetches a share at a time from
# another executor (within Spark's 48 MiB of spark.reducer.maxSizeInFlight, off the heap)
SHARE_BYTES = 32 * 2**20
_OFFSET = 8  # bytes: a record's offset, little-endian, before its chunk


def executors(sc: Any) -> int:
    """The executors apart from the driver (0 in local mode, where the driver's block
    manager is the only one)."""
    return max(sc._jsc.sc().getExecutorMemoryStatus().size() - 1, 0)


def warm(sc: Any, key: str, nbytes: int, served: ServedTransport) -> int:
    """Write ``key``'s file (the payload ``served`` reads from the driver's channel,
    ``nbytes`` long) on each of ``sc``'s executors; the number of executors whose
    file was written (0 if the warm-up stopped, or gave up waiting for task slots other
    jobs hold: :mod:`.slot_wait`)."""
    return run_unless_stalled(sc, functools.partial(_warm, sc, key, nbytes, served), 0,
                              f"model {key}: the executors' files at ship")


def _warm(sc: Any, key: str, nbytes: int, served: ServedTransport) -> int:
    from pyspark import RDD
    from pyspark.serializers import NoOpSerializer

    tasks = max(executors(sc), 1)
    shares = -(-nbytes // SHARE_BYTES)
    shares += -shares % tasks  # as many on each executor: every one or none preferred
    share = -(-nbytes // shares)
    mapped = sc.parallelize(range(shares), shares).mapPartitions(
        functools.partial(_share, served, nbytes, share, tasks))
    mapped._bypass_serializer = True  # the records go as they are (no pickle)
    jvm = sc._jvm
    shuffled = jvm.PairwiseRDD(mapped._jrdd.rdd()).asJavaPairRDD().partitionBy(
        jvm.PythonPartitioner(tasks, id(_share)))
    shuffled.rdd().setSerializer(jvm.org.apache.spark.serializer.KryoSerializer(sc._jsc.sc().conf()))
    records: Any = RDD(jvm.PythonRDD.valueOfPair(shuffled), sc, NoOpSerializer())
    try:
        landed = len(set(records.mapPartitions(
            functools.partial(_assemble, key, nbytes, served)).collect()))
    except Exception as exc:  # the executors without the file download it when they need it
        logger.warning("model %s: the executors' files were not written through Spark's "
                       "shuffle (%s); executors download it from the driver when they need it",
                       key, str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__)
        return 0
    finally:
        _remove_shuffle(sc, shuffled.rdd())
    logger.info("model %s: %d shares of %.1f MB through Spark's shuffle, the file written on "
                "%d of %d executors", key, shares, share / 2**20, landed, tasks)
    return landed


def _remove_shuffle(sc: Any, shuffled: Any) -> None:
    """The shuffle's files removed from every executor now (else when the JVM collects
    the RDD: Spark's ContextCleaner)."""
    try:
        shuffle = shuffled.dependencies().head().shuffleId()
        sc._jsc.sc().cleaner().get().doCleanupShuffle(shuffle, True)
    except Exception as exc:
        logger.info("the shuffle of a payload's shares is left to Spark's cleaner: %s",
                    str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)


def _share(served: ServedTransport, nbytes: int, share: int, tasks: int,
           items: Iterator[int]) -> Iterator[bytes]:
    """In a worker: the shares ``items`` of the payload, downloaded from the driver, as
    records (offset and chunk) each given to every one of the ``tasks`` reduce tasks
    (PySpark's pairs of a packed partition number and its value)."""
    from pyspark.serializers import pack_long

    for number in items:
        start = number * share
        data = served.read_range(start, min(start + share, nbytes)) if start < nbytes else b""
        for at in range(0, len(data), CHUNK_BYTES):
            record = (start + at).to_bytes(_OFFSET, "little") + data[at:at + CHUNK_BYTES]
            for task in range(tasks):
                yield pack_long(task)
                yield record
        del data


def _assemble(key: str, nbytes: int, served: ServedTransport,
              records: Iterator[bytes]) -> Iterator[str]:
    """In a worker: the executor's file of ``key`` written from ``records`` (each chunk at
    its offset) if its SHA-256 is the one the driver fixed; the executor's folder if the
    file is there."""
    folder = executor_folder()

    def write(f: Any) -> None:
        for record in records:
            f.seek(int.from_bytes(record[:_OFFSET], "little"))
            f.write(memoryview(record)[_OFFSET:])
        f.flush()
        served.check_digest(file_digest(f.name), "through Spark's shuffle")
        f.seek(0, 2)

    try:
        if folder is None:
            return iter(())
        host_file.land(folder, key, nbytes, write=write, verify=served.check_file)
    except PayloadError as exc:  # not the payload: this executor downloads it when it needs it
        logger.info("%s", exc)
        return iter(())
    finally:
        for _ in records:  # read to its end: PySpark reuses a worker only then
            pass
    return iter([folder])
