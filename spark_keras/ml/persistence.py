"""Saving and loading a :class:`~spark_keras.ml.KerasTransformer`: Spark's JSON metadata
(``DefaultParamsWriter``) plus the model's payload as a file in the stage's folder, where
:func:`~spark_keras.spark.paths.stage_file` says Spark put the metadata. Nothing is
pickled; a loaded stage holds its payload, checked against the metadata's record."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from spark_keras import storage
from spark_keras._version import __version__
from spark_keras.errors import PayloadError, SparkKerasError, StorageError
from spark_keras.executor.transport import is_connect
from spark_keras.ml.source import PAYLOAD_FILE, ModelSource
from spark_keras.spark.paths import stage_file

# spark_keras.ml.KerasTransformer, handed in by its read() and write(): not imported, as
# spark_keras.ml imports this module
KerasTransformer = Any

__all__ = ["KerasTransformerWriter", "KerasTransformerReader"]

logger = logging.getLogger("spark_keras")


def _metadata_context(spark: Any) -> Any:
    """What Spark's metadata writer and reader take: the SparkContext on classic Spark
    (PySpark 3.5 takes nothing else), the session on Connect."""
    return spark if is_connect(spark) else spark.sparkContext


class KerasTransformerWriter(MLWriter):
    """Saves the stage's params as Spark's JSON metadata and its payload as a file."""

    def __init__(self, instance: "KerasTransformer") -> None:
        super().__init__()
        self.instance = instance
        self._prepared: tuple[bytes, dict[str, Any], str] | None = None

    def _handleOverwrite(self, path: str) -> None:
        if is_connect(self.sparkSession):  # no JVM here: the Connect ML helper does it
            try:
                from pyspark.ml.connect.readwrite import RemoteMLWriter
            except ImportError as exc:  # PySpark < 4.0
                raise SparkKerasError(
                    f"this PySpark cannot overwrite {path!r} over Spark Connect (it has no "
                    f"Connect ML helper): remove the folder first, or save elsewhere") from exc
            RemoteMLWriter.handleOverwrite(path, True)
        else:
            super()._handleOverwrite(path)

    def save(self, path: str) -> None:
        """Save the stage at ``path``. Everything that can fail before the files are
        written (serializing the model, reading the payload file it was made from,
        resolving where the payload goes) is done before an existing folder is removed."""
        self._prepared = self._prepare(path)
        try:
            super().save(path)
        finally:
            self._prepared = None

    def _prepare(self, path: str) -> tuple[bytes, dict[str, Any], str]:
        """The payload, its metadata record, and where it goes for a stage at ``path``."""
        from spark_keras.payload import format as fmt

        payload = self.instance._require_source().payload()
        header = fmt.unpack(payload, verify=False).header
        record = {"file": PAYLOAD_FILE, "nbytes": len(payload),
                  "body_sha256": header["body_sha256"], "keras": header.get("keras"),
                  "model_class": header.get("model_class")}
        location = stage_file(self.sparkSession, path, PAYLOAD_FILE)
        storage.size(location)  # an unreachable or unusable URI fails here
        return payload, record, location

    def saveImpl(self, path: str) -> None:
        stage = self.instance
        payload, record, location = self._prepared or self._prepare(path)
        extra = {"sparkKeras": {"version": __version__, "payload": record}}
        # metadata first: Spark refuses to write it over an existing stage
        params = {p.name: v for p, v in stage._paramMap.items() if v is not None}
        DefaultParamsWriter.saveMetadata(stage, path, _metadata_context(self.sparkSession),
                                         extraMetadata=extra, paramMap=params)
        if not storage.is_uri(location) and is_connect(self.sparkSession) \
                and not os.path.isdir(os.path.join(os.path.dirname(location), "metadata")):
            raise StorageError(
                f"the Spark Connect server wrote the stage's metadata at {path!r} on a "
                f"filesystem this client does not see, and the client writes the model's "
                f"payload: save to a URI both reach (s3://..., hdfs://...) or a shared mount")
        storage.write(location, payload)
        logger.info("saved %s: %.1f MB payload at %s", stage.uid, len(payload) / 2**20, location)


class KerasTransformerReader(MLReader["KerasTransformer"]):
    """Loads a stage saved by :class:`KerasTransformerWriter`."""

    def __init__(self, cls: type["KerasTransformer"]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> "KerasTransformer":
        """The stage saved at ``path``, holding its model's payload in memory.

        Raises:
            SparkKerasError: ``path`` holds another kind of stage.
            PayloadError: its payload is missing from the metadata, or is not the one the
                metadata describes.
            StorageError: its payload file is missing.
        """
        spark = self.sparkSession
        metadata = DefaultParamsReader.loadMetadata(path, _metadata_context(spark))
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata.get("class") != expected:
            raise SparkKerasError(f"{path!r} holds a {metadata.get('class')}, not a {expected}")
        record = (metadata.get("sparkKeras") or {}).get("payload")
        if not isinstance(record, dict) or not isinstance(record.get("file"), str):
            raise PayloadError(f"the metadata of {path!r} names no model payload: it was not "
                               f"saved by KerasTransformer")
        stage = self.cls()
        stage._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(stage, metadata)
        location = stage_file(spark, path, os.path.basename(record["file"]))
        size = storage.size(location)
        if size is None:
            hint = ""
            if is_connect(spark) and not storage.is_uri(location):
                hint = (" (on Spark Connect this client reads the payload: a plain path must be "
                        "on a filesystem the client and the server share, or use a URI)")
            raise StorageError(f"the model payload of the KerasTransformer saved at {path!r} is "
                               f"missing: {location}{hint}")
        # the stage holds its payload from now on: whatever is saved over the folder later,
        # it scores (and saves) the model it was loaded with
        payload = _checked_payload(storage.read(location), location, record)
        stage._source = ModelSource(payload=payload, saved_at=path)
        return stage


def _checked_payload(payload: bytes, location: str, record: Mapping[str, Any]) -> bytes:
    """``payload``, read from ``location``, unless it is not the one the stage's metadata
    ``record`` describes (its size and body digest) or its body does not match its digest."""
    from spark_keras.payload import format as fmt

    damaged = "the saved stage is damaged, or its payload was replaced"
    if len(payload) != record.get("nbytes"):
        raise PayloadError(f"the model payload {location} has {len(payload)} bytes, the "
                           f"stage's metadata says {record.get('nbytes')}: {damaged}")
    try:
        digest = fmt.unpack(payload).header["body_sha256"]  # verifies the body too
    except PayloadError as exc:
        raise PayloadError(f"the model payload {location} is not sound ({exc}): {damaged}") \
            from exc
    expected = record.get("body_sha256")
    if digest != expected:
        raise PayloadError(f"the model payload {location} has body digest {digest[:12]}..., "
                           f"the stage's metadata says {str(expected)[:12]}...: {damaged}")
    return payload
