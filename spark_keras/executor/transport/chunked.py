"""A large payload as chunks, each a Spark broadcast of bounded size (classic Spark): the
driver sends each block about once and executors fetch the blocks from each other
(Spark's TorrentBroadcast, under Spark's own authentication and network encryption),
while no heap holds more than a chunk's blocks on their way. The first worker of an
executor that needs the model writes the chunks, in order, into the executor's file,
refused unless its SHA-256 is the one the driver fixed; every worker maps that file.

A chunk is a ``bytes`` value that PySpark's own broadcast mechanism pickles on the driver
and unpickles in the worker; nothing else of it is interpreted before the digest check.
"""

from __future__ import annotations

import logging
from typing import Any

from spark_keras.errors import PayloadError
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.broadcast import _forget_loaded_value
from spark_keras.executor.transport.executor_file import build_written
from spark_keras.executor.transport.served import Hashing, ServedTransport
from spark_keras.payload.shipment import Shipment

logger = logging.getLogger("spark_keras")

# bytes per chunk: two of Spark's default 4 MiB broadcast blocks (spark.broadcast.blockSize)
CHUNK_BYTES = 8 * 2**20


def broadcast_chunks(sc: Any, path: str) -> list[Any]:
    """The file at ``path`` as broadcasts of :data:`CHUNK_BYTES` each, read one chunk at a
    time (the driver's Python holds one chunk); none is left if one fails."""
    chunks: list[Any] = []
    try:
        with open(path, "rb") as f:
            while data := f.read(CHUNK_BYTES):
                chunks.append(sc.broadcast(data))
                del data
    except BaseException:
        for chunk in chunks:
            chunk.destroy()
        raise
    return chunks


class ChunkedTransport(Transport):
    """A payload as chunk broadcasts, checked against ``served``'s digest; ``served``
    (the driver's copy) is also the way in a SparkContext other than the chunks' one."""

    def __init__(self, sc: Any, chunks: list[Any], served: ServedTransport) -> None:
        self._sc, self.chunks, self.served = sc, chunks, served

    @classmethod
    def ship(cls, sc: Any, served: ServedTransport, path: str) -> "ChunkedTransport":
        """The payload the driver keeps at ``path`` (``served``'s) broadcast in chunks."""
        chunks = broadcast_chunks(sc, path)
        logger.info("model %s version %d: %d chunk broadcasts", served.name, served.index,
                    len(chunks))
        return cls(sc, chunks, served)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        return build_written(recipe, key, nbytes, share_weights, self.write, self.read,
                             verify=self.served.check_file)

    def write(self, out: Any) -> None:
        """Write the chunks into ``out`` from its start; raises
        :class:`~spark_keras.errors.PayloadError` unless the whole is the payload whose
        digest the driver fixed (``out`` then holds bytes nobody may use)."""
        out.seek(0)
        out.truncate()
        hashing = Hashing(out)
        for number, chunk in enumerate(self.chunks):
            try:
                data = chunk.value
                if not isinstance(data, bytes):
                    raise PayloadError(f"chunk {number} of model {self.served.name} version "
                                       f"{self.served.index} is a {type(data).__name__}, not "
                                       f"bytes: refused, nothing was built from it")
                hashing.write(data)
                del data
            finally:
                _forget_loaded_value(chunk)  # one chunk in this worker's memory at a time
        out.flush()
        self.served.check_digest(hashing.hexdigest(), "from its chunk broadcasts")

    def read(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.write(buffer)
        return buffer.getvalue()

    def _context_stopped(self) -> bool:
        return self._sc is not None and self._sc._jsc is None

    def renew(self, blocking: bool) -> None:
        """Broadcast the chunks afresh (read back one at a time from the driver's files
        of them) and destroy the old ones, everywhere: executors fetch the new ones
        only if the model is used again. (Not ``unpersist``: a reused Python worker keeps
        the path of a chunk it was sent, whose file an unpersist removes.)"""
        if self._context_stopped():
            return
        fresh: list[Any] = []
        try:
            for chunk in self.chunks:
                fresh.append(self._sc.broadcast(chunk.value))
                _forget_loaded_value(chunk)
        except BaseException:
            for chunk in fresh:
                chunk.destroy()
            raise
        old, self.chunks = self.chunks, fresh
        for chunk in old:
            chunk.destroy(blocking)

    def destroy(self, blocking: bool) -> None:
        if not self._context_stopped():  # else they went with their context
            for chunk in self.chunks:
                chunk.destroy(blocking)

    def __reduce__(self) -> tuple:
        if self._context_stopped():  # the chunks went with their context: the driver's copy
            served = self.served
            return (ServedTransport, (served.address, served.name, served.index, served.sha256))
        return (ChunkedTransport, (None, self.chunks, self.served))
