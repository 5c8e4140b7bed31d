"""On the driver: the payload of a model a :class:`BroadcastModel` ships, read once.

A small payload is kept in memory and broadcast (Spark's torrent broadcast: fast, and
executors share the blocks among themselves). A large one, over :data:`LARGE_PAYLOAD`,
never exists in memory and never passes through a JVM heap: it is streamed from the
model's variables into a file of the driver's version server (with Keras 3 on TensorFlow
without copying the weights: :func:`spark_keras.save`), and each executor streams it
from there into its own file, which its workers map. Spark's broadcast would hold it in
the driver's and every executor's JVM heap, and ``SparkContext.addFile`` cannot remove a
file again (every executor fetches every file added, for the application's lifetime:
each version of a model, forever). A model given by URI is read by the executors
straight from storage (:class:`~.transport.storage.StorageTransport`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
from typing import Any, Callable, Iterator, Mapping

from spark_keras.errors import ArgumentTypeError
from spark_keras.payload import codec
from spark_keras.payload.stored import StoredModel, is_keras_archive, load_keras, open_model
from spark_keras.storage import is_uri

logger = logging.getLogger("spark_keras")

# Payloads above this many bytes are shipped from a file of the driver, not broadcast:
# a broadcast holds the whole payload in the driver's and every executor's JVM heap
# (Spark's default driver heap is 1 GiB)
LARGE_PAYLOAD = 64 * 2**20


@dataclasses.dataclass
class DriverPayload:
    """A model and its payload on the driver: in memory (``data``: a small one, or a
    URI's), in a file (``path``, in the driver's version server's folder: a large one), or
    both once the version server keeps a copy of one in memory."""

    model: Any
    nbytes: int
    data: bytes | None = None
    path: str | None = None
    stored: StoredModel | None = None  # a model given by URI

    @property
    def kept(self) -> Any:
        """What the version server keeps of it: the file's path, else the bytes."""
        return self.path if self.path is not None else self.data

    def to_file(self, new_file: Callable[[], str]) -> None:
        """Write an in-memory payload to a fresh file of the version server (``path``),
        so that keeping it is a rename; nothing is left if the write fails."""
        if self.path is None and self.data is not None:
            with _new_file(new_file) as path:
                with open(path, "wb") as f:
                    f.write(self.data)
            self.path = path

    def discard(self) -> None:
        """Remove the payload's file, if it has one (a model refused once read)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.remove(self.path)
            self.path = None


SHIP = ("auto", "driver", "broadcast")


def check_ship(ship: Any, connect: bool) -> None:
    """Refuse an unknown ``ship=``, and ``"broadcast"`` on Spark Connect."""
    if ship not in SHIP:
        raise ArgumentTypeError(f"ship must be one of {', '.join(map(repr, SHIP))}, not {ship!r}")
    if ship == "broadcast" and connect:
        raise ArgumentTypeError("ship='broadcast' is for classic Spark: Spark Connect has no "
                                "broadcast (use 'auto', a session artifact, or 'driver')")


def read(model_or_path: Any, custom_objects: Mapping[str, Any] | None, safe_mode: bool, *,
         new_file: Callable[[], str], ship: str = "auto") -> DriverPayload:
    """The model and its payload: ``model_or_path`` as :class:`BroadcastModel` takes it.

    Args:
        new_file: a fresh path where a payload file may be written (the version server's).
        ship: ``"auto"`` (a file over :data:`LARGE_PAYLOAD`), ``"driver"`` (a file,
            whatever the size) or ``"broadcast"`` (in memory, whatever the size).
    """
    to_file = ship == "driver"
    limit = float("inf") if ship == "broadcast" else LARGE_PAYLOAD
    if isinstance(model_or_path, (str, os.PathLike)):
        location = os.fspath(model_or_path)
        kind = None if is_uri(location) else _large_file_kind(location, to_file, limit)
        if kind == "payload":
            with _new_file(new_file) as path:
                shutil.copyfile(location, path)  # streamed, file to file
                # the driver's model on weights mapped from the copy: no copy in memory
                model = codec.load(path, custom_objects=custom_objects, safe_mode=safe_mode,
                                   share_weights=True)
            return DriverPayload(model, os.path.getsize(path), path=path)
        if kind == "keras":
            return _written(load_keras(location, custom_objects, safe_mode), custom_objects,
                            new_file)
        model, data, stored = open_model(location, custom_objects=custom_objects,
                                         safe_mode=safe_mode)
        return DriverPayload(model, len(data), data=data, stored=stored)
    model = model_or_path
    if to_file or weights_nbytes(model) > limit:
        return _written(model, custom_objects, new_file)
    data = codec.dumps(model, custom_objects=custom_objects)
    return DriverPayload(model, len(data), data=data)


def _written(model: Any, custom_objects: Mapping[str, Any] | None,
             new_file: Callable[[], str]) -> DriverPayload:
    with _new_file(new_file) as path:
        codec.save(model, path, custom_objects=custom_objects)
    nbytes = os.path.getsize(path)
    logger.info("payload of %s written to %s (%.1f MB): shipped from the driver's file",
                type(model).__name__, path, nbytes / 2**20)
    return DriverPayload(model, nbytes, path=path)


@contextlib.contextmanager
def _new_file(new_file: Callable[[], str]) -> Iterator[str]:
    """A path from ``new_file()``, removed again if the block raises (a model that cannot
    be saved or loaded leaves nothing in the version server's folder)."""
    path = new_file()
    try:
        yield path
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(path)
        raise


def _large_file_kind(path: str, to_file: bool, limit: float) -> str | None:
    """``"payload"`` or ``"keras"`` for a local model file to ship from a file of the
    driver (over ``limit`` bytes, or ``to_file``); else None."""
    try:
        if not (to_file or os.path.getsize(path) > limit):
            return None
        with open(path, "rb") as f:
            if codec.is_payload(f.read(16)):
                return "payload"
        return "keras" if is_keras_archive(path) else None
    except OSError:
        return None  # open_model names the file it cannot read


def weights_nbytes(model: Any) -> int:
    """The size of ``model``'s variables, from their shapes and dtypes (nothing read)."""
    total = 0
    for variable in getattr(model, "weights", []):
        name = str(getattr(variable.dtype, "name", variable.dtype))
        bits = re.findall(r"\d+", name)
        itemsize = max(int(bits[0]) // 8, 1) if bits else 1  # bool: 1 byte
        count = 1
        for dim in variable.shape:
            count *= int(dim or 0)
        total += count * itemsize
    return total
