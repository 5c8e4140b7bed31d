"""A :class:`~spark_keras.spark.broadcast.BroadcastModel`'s later versions, on the driver:
:meth:`~spark_keras.spark.broadcast.BroadcastModel.update` (and a watched URI's new file)
checks the label and that the model fits the current version's inputs and outputs, writes
its payload to the driver's file (and, where version 1 shipped through Spark's block
transfer, writes it on every executor that way too), and adds it to the handle's schedule
(:class:`~spark_keras.channel.versions.Schedule`), whose version server tells each task
which version it scores with. Version 1: :mod:`.broadcast_shipping`."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

from spark_keras.channel import versions
from spark_keras.errors import SparkKerasError
from spark_keras.executor import driver_payload, shipped_objects
from spark_keras.executor.transport.chunked import warm
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.inference.signature import signature_of
from spark_keras.payload.digest import file_digest
from spark_keras.payload.shipment import Shipment

logger = logging.getLogger("spark_keras")


def update(handle: Any, model_or_path: Any, version: str | None,
           custom_objects: Mapping[str, Any] | None) -> str:
    """:meth:`BroadcastModel.update <spark_keras.spark.broadcast.BroadcastModel.update>`
    of ``handle``; returns the new version's label."""
    handle.check_usable()
    schedule = driver_schedule(handle)
    if version is not None:  # refused before anything is read or written
        versions.check_label(version, schedule.labels())
    objects = custom_objects if custom_objects is not None else handle._custom_objects
    _check_fits(handle, model_or_path)
    return adopt(handle, read(handle, model_or_path, objects), label=version, custom_objects=objects)


def _check_fits(handle: Any, model: Any) -> None:
    """Refuse a model object that does not fit before its payload is written (a
    file's model is checked once read, in :func:`adopt`)."""
    if isinstance(model, (str, os.PathLike)):
        return
    try:
        new = signature_of(model)
    except Exception:  # not a model: reading it says what is wrong
        return
    versions.check_fits(handle.signature, new)


def read(handle: Any, model_or_path: Any, custom_objects: Mapping[str, Any] | None
         ) -> driver_payload.DriverPayload:
    """``model_or_path`` read as a payload of ``handle`` (its ``safe_mode``), in a file of
    the driver's version server."""
    return driver_payload.read(model_or_path, custom_objects, handle._safe_mode,
                               new_file=handle._server.new_file)


def adopt(handle: Any, payload: driver_payload.DriverPayload, *, label: str | None = None,
          custom_objects: Mapping[str, Any] | None = None) -> str:
    """Update ``handle`` to a model already read (``payload``: the model, its payload
    and, for a URI, its StoredModel; a watched URI ships its new file this way;
    ``label`` defaults to the version's number, or the next one not taken). The
    version's number and label are chosen and it is added in one step, under the
    handle's lock; a payload refused leaves no file. Where version 1 shipped through
    Spark's block transfer (:mod:`~spark_keras.executor.transport.chunked`), this one's
    file is written on every executor the same way once it is added: a plan made in the
    meantime downloads it from the driver's copy."""
    try:
        name, server = handle._name, handle._server
        objects = custom_objects if custom_objects is not None else handle._custom_objects
        model, stored = payload.model, payload.stored
        versions.check_fits(handle.signature, signature_of(model))
        recipe = Shipment.recipe_of(model, custom_objects=objects, safe_mode=handle._safe_mode)
        payload.to_file(server.new_file)  # the slow part, before the lock
        assert payload.path is not None, "to_file() puts the payload in the driver's file"
        # what the driver's answer tells workers (safe_mode is the handle's, in the
        # plan): the payload's digest, and that of custom objects other than the
        # handle's own, which Spark ships (no pickle in an answer)
        digest = file_digest(payload.path)
        source = {"sha256": digest,
                  "objects": shipped_objects.ship(handle._application, recipe.objects,
                                                  handle._recipe.objects),
                  "stored": None if stored is None else dataclasses.asdict(stored)}
        with handle._lock:
            handle.check_usable()
            schedule = driver_schedule(handle)
            index = schedule.next_index()
            label = versions.check_label(label, schedule.labels(), index)
            payload.path = server.keep_payload(name, index, payload.kept)
            added = versions.Version(index, label, f"{name}.v{index}", payload.nbytes, source)
            schedule.add(added)
            handle._model, handle._version, handle._index = model, label, index
    except BaseException:
        payload.discard()
        raise
    sc = getattr(handle._application, "sparkContext", handle._application) \
        if handle._chunked else None
    if sc is not None and sc._jsc is not None:  # (the context stopped: from the driver)
        warm(sc, added.key, added.nbytes,
             ServedTransport(handle._versions, name, index, digest))
    logger.info("model %s: version %s shipped (%.1f MB payload)", name, label,
                payload.nbytes / 2**20)
    return label


def driver_schedule(handle: Any) -> versions.Schedule:
    """``handle``'s versions, on the driver.

    Raises:
        SparkKerasError: ``handle`` was unpickled in a worker.
    """
    if handle._schedule is None:
        raise SparkKerasError("update() is for the driver: this BroadcastModel was unpickled "
                              "in a worker")
    return handle._schedule
