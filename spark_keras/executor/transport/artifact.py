"""The payload as a Spark Connect session artifact (Connect has no SparkContext and no
broadcast): uploaded once (``spark.addArtifacts``, streamed in chunks, never inside a
plan); Spark puts one copy in each executor's session folder, which every worker maps."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Any

from spark_keras import flavour
from spark_keras.errors import PayloadError, SparkKerasError
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.payload import host_file
from spark_keras.payload.shipment import Shipment


@dataclasses.dataclass(frozen=True)
class ArtifactTransport(Transport):
    """The payload as a Spark Connect session artifact named ``name``. Connect cannot
    remove an artifact: it stays until the session ends, and after ``unpersist()``
    workers rebuild from the same file. Tasks of a streaming query do not see the
    session's artifacts: with ``served`` (the client's copy, :mod:`spark_keras.channel.version_server`)
    they read the payload from the client instead."""

    name: str
    served: ServedTransport | None = None
    rdds = False

    @classmethod
    def upload(cls, spark: Any, key: str, path: str,
               served: ServedTransport | None = None) -> "ArtifactTransport":
        """Upload the payload file at ``path`` (linked, else copied) as ``<key>.skp``."""
        name = f"{key}{host_file.SUFFIX}"
        with tempfile.TemporaryDirectory(prefix="spark_keras_") as tmp:
            artifact = os.path.join(tmp, name)
            _link_or_copy(path, artifact)
            spark.addArtifacts(artifact, file=True)
        return cls(name, served)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        from pyspark import SparkFiles

        path = SparkFiles.get(self.name)
        if not os.path.isfile(path) and self.served is not None:
            return self.served.build(recipe, key, nbytes, share_weights)
        if not os.path.isfile(path):
            raise SparkKerasError(
                f"the model artifact {self.name!r} is not on this executor ({path}): Spark "
                f"Connect keeps artifacts per session; create the BroadcastModel in the "
                f"session that uses it")
        if os.path.getsize(path) != nbytes:
            raise PayloadError(f"the model artifact {path} has {os.path.getsize(path)} bytes, "
                               f"expected {nbytes}: it is damaged; create the BroadcastModel again")
        try:
            return recipe.build_from_file(path, share_weights=share_weights and flavour.current().shares_weights)
        except PayloadError as exc:
            raise PayloadError(f"the model artifact {self.name!r} cannot be loaded ({exc}); "
                               f"if it is damaged, create the BroadcastModel again") from exc

    @staticmethod
    def forget(keys: list[str]) -> None:
        """Artifacts belong to the session: nothing to remove in a worker."""


def _link_or_copy(source: str, path: str) -> None:
    try:
        os.link(source, path)  # the same file under the artifact's name
    except OSError:  # another file system, or no hard links there
        import shutil

        shutil.copyfile(source, path)
