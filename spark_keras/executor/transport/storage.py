"""The payload read by each executor straight from storage (a model given by URI, classic
or Connect): nothing is shipped but the URI; the first worker of an executor that needs
the model reads it into the executor's file, checked against the driver's digest, and
every worker maps that file. A file changed in storage since is read from the driver."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from spark_keras.errors import LocalWriteError, PayloadError, StorageError
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.executor_file import build_written
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.payload.digest import altered, verifies
from spark_keras.payload.shipment import Shipment
from spark_keras.payload.stored import StoredModel

logger = logging.getLogger("spark_keras")


@dataclasses.dataclass(frozen=True)
class StorageTransport(Transport):
    """The payload read by each executor straight from storage (``stored.uri``). Nothing
    to renew (workers read the file again under the handle's new key) or release but
    the executors' files (removed by :meth:`forget`). With ``served`` (the driver's copy
    of the payload it read), a file replaced in storage since is read from the driver
    instead: a job planned with one version keeps it."""

    stored: StoredModel
    rdds: bool = True
    served: ServedTransport | None = None

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        objects = recipe.custom_objects()

        def write(out: Any) -> None:
            try:
                self.stored.write_payload(out, custom_objects=objects, safe_mode=recipe.safe_mode)
            except (PayloadError, StorageError) as exc:
                if self.served is None or isinstance(exc, LocalWriteError):
                    raise
                _from_the_driver(exc)
                out.seek(0)
                out.truncate()
                self.served.write(out)

        def rewrite(out: Any) -> None:  # what storage gave (a sound header) failed to load
            assert self.served is not None
            _from_the_driver(f"the model read from {self.stored.uri!r} was damaged")
            self.served.write(out)

        def in_memory() -> bytes:  # if the executor's folder cannot be written
            try:
                return self.stored.read_payload(custom_objects=objects, safe_mode=recipe.safe_mode)
            except (PayloadError, StorageError) as exc:
                if self.served is None:
                    raise
                _from_the_driver(exc)
                return self.served.read()

        try:
            return build_written(recipe, key, nbytes, share_weights, write, in_memory,
                                 verify=self.check_file,
                                 rewrite=None if self.served is None else rewrite)
        except PayloadError as exc:
            if self.stored.uri in str(exc):
                raise
            raise PayloadError(f"the model read from {self.stored.uri!r} cannot be loaded: "
                               f"{exc}") from exc


    def check_file(self, path: str) -> None:
        """Refuse the executor's payload file at ``path`` (found written, before a
        worker builds from it) unless it is the payload the driver read (its body
        digest; the body is checked against it as the file is loaded)."""
        try:
            self.stored.check(path)
        except PayloadError as exc:
            if not verifies(path):
                return  # damaged: its load fails, and it is written again
            raise altered(path, f"the model read from {self.stored.uri!r}",
                          f"is not the payload the driver read ({exc})") from exc


def _from_the_driver(exc: Exception | str) -> None:
    """Log why a worker reads the version its job was planned with from the driver's copy:
    the file in storage was replaced, broken (truncated, damaged) or deleted since."""
    logger.info("%s; reading the version this job was planned with from the driver", exc)
