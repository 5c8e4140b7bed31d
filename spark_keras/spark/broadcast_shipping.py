"""How a :class:`~spark_keras.spark.broadcast.BroadcastModel`'s first version leaves the
driver: its payload read (a model, a file, or a URI the executors read themselves), the
transport chosen and made for it (a broadcast, the driver's channel, storage, a Spark
Connect session artifact: :func:`~spark_keras.executor.transport.transport_for`), and the
version registered with the driver's version server, which then answers the workers'
tasks. When a step fails nothing of the payload stays on the driver. Later versions:
:mod:`.broadcast_versions`."""

from __future__ import annotations

import logging
import os
from typing import Any

from spark_keras.channel import driver_address, version_server, versions
from spark_keras.channel.credentials import model_scope
from spark_keras.errors import SparkKerasError
from spark_keras.executor import driver_payload
from spark_keras.executor.environment import check_environment
from spark_keras.executor.transport import is_connect, transport_for
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.payload.safety import check_rebuildable
from spark_keras.payload.shipment import Shipment
from spark_keras.spark import broadcast_lifecycle, exposure

logger = logging.getLogger("spark_keras")


def check(spark: Any, model_or_path: Any, version: str | None, ship: str,
          refresh: float | None) -> tuple[str, float | None]:
    """The constructor's ``version=``, ``ship=`` and ``refresh=`` checked before a file is
    written: ``(the first version's label, seconds between checks of a URI or None)``."""
    label = versions.check_label(version, [])
    driver_payload.check_ship(ship, is_connect(spark))
    return label, versions.check_refresh(refresh, model_or_path)


def ship(handle: Any, spark: Any, model_or_path: Any, label: str, ship: str,
         watch_every: float | None) -> None:
    """Ship ``model_or_path`` as version 1 (``label``) of ``handle`` (a BroadcastModel
    being made, its arguments checked) by the route ``ship`` names; a URI is watched every
    ``watch_every`` seconds (None: not watched). The version server stays open while the
    handle, or the Spark context, lives."""
    if not isinstance(model_or_path, (str, os.PathLike)):  # a file is loaded under safe_mode
        check_rebuildable(model_or_path, handle._safe_mode)
    if not is_connect(spark):
        check_environment(getattr(spark, "sparkContext", spark))
    with version_server.serving(
            lambda: driver_address.driver_host(spark, is_connect(spark)),
            lambda: driver_address.bind_address(spark, is_connect(spark))) as server:
        exposure.warn_if_exposed(spark)  # the token travels as privately as Spark's RPC
        payload = driver_payload.read(model_or_path, handle._custom_objects, handle._safe_mode,
                                      new_file=server.new_file, ship=ship)
        handle._name = handle.new_key(payload.model)
        try:
            _first_version(handle, spark, server, payload, label, ship, watch_every)
        except BaseException:  # nothing of it stays on the driver
            payload.discard()
            server.forget(handle._name)
            raise
    logger.info("shipped %s: %.1f MB payload (%s)", handle._key, handle._nbytes / 2**20,
                type(handle._transport).__name__)


def carried(handle: Any) -> dict[str, Any]:
    """What a closure or a broadcast structure carries of ``handle`` (its pickled state):
    no model, nothing of the driver's, the keys released so far; a worker's handle is the
    first version (its own transport and recipe), the one current when it was pickled is
    asked for."""
    if handle._released:
        raise SparkKerasError(f"BroadcastModel {handle._key} was destroyed")
    state = dict(handle.__dict__, _model=None, _stale=tuple(broadcast_lifecycle.released),
                 _schedule=None, _watch=None, _custom_objects=None, _server=None, _lock=None,
                 _finalizer=None, _application=None,
                 _version=handle._first_label, _index=1, _planned=handle._index)
    state["_signature"] = handle.signature
    return state


def _first_version(handle: Any, spark: Any, server: version_server.Server,
                   payload: driver_payload.DriverPayload, label: str, ship: str,
                   watch_every: float | None) -> None:
    """``payload`` (read) shipped as version 1 of ``handle`` under ``handle._name``."""
    model = payload.model
    handle._model = model
    handle._epoch = 0
    handle._key = name = handle._name
    handle._nbytes = payload.nbytes
    handle._signature = None
    # the payload travels on its own (a broadcast, a file, a Connect artifact), so a
    # worker that finds it already on disk never unpickles it; the rest is small
    # and travels in the handle
    handle._recipe = Shipment.recipe_of(model, custom_objects=handle._custom_objects,
                                        safe_mode=handle._safe_mode)
    handle._server = server
    handle._application = spark  # where update() adds new custom objects' files
    # the handle's own token: its versions and payloads, nothing of another handle's
    handle._versions = server.address_for(model_scope(name))
    handle._version, handle._index, handle._first_label = label, 1, label

    def keep() -> ServedTransport:  # the driver's copy, where transport_for needs one
        payload.path = kept = server.keep_payload(name, 1, payload.kept)
        return ServedTransport.of(handle._versions, name, 1, kept)  # its digest fixed

    handle._transport = transport_for(spark, name, payload, keep, ship)
    # whether its versions' files are written on every executor through Spark's block
    # transfer when they ship (transport.chunked): later ones too (broadcast_versions)
    handle._chunked = ship == "auto" and isinstance(handle._transport, ServedTransport)
    handle._schedule = versions.Schedule(versions.Version(1, label, name, payload.nbytes))
    handle._watch = None if watch_every is None else versions.Watch(handle, payload.stored, watch_every)
    server.register(name, handle._schedule, None if handle._watch is None else handle._watch.check)
