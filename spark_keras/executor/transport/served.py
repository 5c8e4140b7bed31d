"""A version's payload streamed from the driver's copy, refused unless its SHA-256 is the
one the driver fixed; downloads resumed where the network cut them, a busy driver asked
again when it says."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import random
import time
from typing import Any, BinaryIO, cast

from spark_keras.channel.client import DriverBusy
from spark_keras.errors import ChannelError, PayloadError
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.executor_file import build_written
from spark_keras.payload.digest import check_file, file_digest
from spark_keras.payload.shipment import Shipment

logger = logging.getLogger("spark_keras")


@dataclasses.dataclass(frozen=True)
class ServedTransport(Transport):
    """A version's payload read from the driver (:mod:`spark_keras.channel.version_server`):
    the versions ``update`` shipped, and a first version shipped ``"driver"``. The first
    worker of an executor that needs it writes it to the executor's folder; every worker
    maps that file.

    ``sha256`` is the payload file's digest, fixed by the driver when it kept its copy
    (:func:`file_digest`) and carried by the handle (a first version) or the driver's
    authenticated answer (later ones): the download is hashed as it is written and
    refused, before anything uses it, unless it matches. A download the network cuts
    (reset, stalled, refused) resumes where it stopped, in the same file (``Range``),
    until :data:`DOWNLOAD_ATTEMPTS` attempts in a row add nothing: only a failure to
    write the local file is the folder's (:class:`~spark_keras.errors.LocalWriteError`). A
    driver serving its maximum of readers says when to come back (503): asked again then,
    for up to :data:`BUSY_WAIT` seconds, without counting attempts."""

    address: Any  # channel.client.Address
    name: str
    index: int
    sha256: str

    @classmethod
    def of(cls, address: Any, name: str, index: int, path: str) -> "ServedTransport":
        """The transport of version ``index`` of ``name``, whose copy the driver keeps at
        ``path``: its digest is fixed now."""
        return cls(address, name, index, file_digest(path))

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        return build_written(recipe, key, nbytes, share_weights, self.write, self.read,
                             verify=self.check_file)

    def check_file(self, path: str) -> None:
        """Refuse the executor's payload file at ``path`` (found written, before a
        worker builds from it) unless its SHA-256 is the one the driver fixed (see
        :func:`spark_keras.payload.digest.check_file` for a damaged one)."""
        check_file(path, self.sha256, f"model {self.name} version {self.index}")

    def write(self, out: Any) -> None:
        """Write the payload into ``out`` (an open file, or a buffer), from its start;
        raises :class:`~spark_keras.errors.PayloadError` if it is not the payload whose
        digest the driver fixed (``out`` then holds bytes nobody may use)."""
        hashing = Hashing(out)
        self._download(hashing)
        out.flush()
        self.check_digest(hashing.hexdigest(), "from the driver")

    def read_range(self, start: int, stop: int) -> bytes:
        """Bytes ``start`` to ``stop`` (excluded) of the payload, from the driver (a part:
        its caller checks the whole it goes into against :attr:`sha256`)."""
        import io

        buffer = io.BytesIO()
        self._download(Hashing(buffer), start, stop)
        return buffer.getvalue()

    def _download(self, hashing: "Hashing", first: int = 0, stop: int | None = None) -> None:
        """Bytes ``first`` to ``stop`` of the payload written through ``hashing`` from its
        start, resumed where the network cuts them, asked again while the driver is busy."""
        from spark_keras.channel import client as channel_client

        delay, attempt, busy_since = 1.0, 0, None
        out = hashing.out
        while True:
            start = hashing.written  # a transfer cut short resumes after its last byte
            out.seek(start)
            out.truncate()
            try:
                channel_client.download(self.address, self.name, self.index,
                                        cast(BinaryIO, hashing), first + start, stop)
                break
            except DriverBusy as exc:  # not an attempt: come back when the driver says
                busy_since = busy_since or time.monotonic()
                waited = time.monotonic() - busy_since
                if waited + exc.retry_after > BUSY_WAIT:
                    raise ChannelError(f"cannot download version {self.index} of model "
                                       f"{self.name}: the driver stayed at its maximum of "
                                       f"readers for {waited:.0f} s ({exc})") from exc
                logger.info("%s; version %d of model %s is asked for again in about %.0f s",
                            exc, self.index, self.name, exc.retry_after)
                time.sleep(exc.retry_after * random.uniform(1.0, 2.0))  # not all at once
            except ChannelError as exc:
                if hashing.written > start:  # progress: the attempts that added nothing count
                    delay, attempt = 1.0, 0
                attempt += 1
                if attempt == DOWNLOAD_ATTEMPTS:
                    raise ChannelError(f"cannot download version {self.index} of model "
                                       f"{self.name} from the driver ({attempt} attempts "
                                       f"without progress): {exc}") from exc
                logger.warning("the download of version %d of model %s from the driver failed "
                               "after %d bytes (%s); trying again from there in %.0f s",
                               self.index, self.name, hashing.written, exc, delay)
                time.sleep(delay)
                delay *= 2

    def check_digest(self, found: str, source: str) -> None:
        """Refuse a payload that arrived (``source``: how) with SHA-256 ``found``
        unless it is the digest the driver fixed (:class:`~spark_keras.errors.PayloadError`)."""
        if not hmac.compare_digest(found, self.sha256):
            raise PayloadError(
                f"the payload of model {self.name} version {self.index} {source} has "
                f"sha256 {found}, not {self.sha256}, the digest the driver fixed when it "
                f"shipped it: it was altered after it was shipped; refused, nothing was "
                f"built from it")

    def read(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.write(buffer)
        return buffer.getvalue()


# attempts in a row that add no byte to a download from the driver (1, 2, 4 s apart)
DOWNLOAD_ATTEMPTS = 4
# seconds a download keeps coming back while the driver answers that it serves its
# maximum of readers (503, channel_server.RETRY_AFTER): not counted as attempts
BUSY_WAIT = 900.0


class Hashing:
    """A file to write whose bytes are hashed on their way in."""

    def __init__(self, out: Any) -> None:
        self.out, self._hash = out, hashlib.sha256()
        self.written = 0

    def write(self, data: Any) -> int:
        self._hash.update(data)
        n = self.out.write(data)
        self.written += memoryview(data).nbytes
        return n

    def hexdigest(self) -> str:
        return self._hash.hexdigest()
