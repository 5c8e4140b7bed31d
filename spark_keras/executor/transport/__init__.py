"""How a BroadcastModel's payload reaches executors, and how a worker builds from it: one
module per kind of transport behind the small interface of :mod:`.base`, the kind chosen
by :func:`transport_for`.

* :mod:`.broadcast` (classic Spark): a Spark broadcast of the payload bytes.
* :mod:`.chunked` (classic Spark, a payload over 64 MiB): at ship time, each executor's
  file of it written through Spark's block transfer, in waves of chunk broadcasts that
  executors fetch from each other (the driver sends about one copy); the handle's
  transport is then the driver's copy (:mod:`.served`), for executors that were not there.
* :mod:`.artifact` (Spark Connect, which has no SparkContext and no broadcast): a session
  artifact, one copy in each executor's session folder.
* :mod:`.storage` (a model given by URI, classic or Connect): each executor reads it
  straight from storage, checked against the driver's digest.
* :mod:`.served`: streamed from the driver's copy (``ship="driver"``, the versions
  ``update`` ships to plans made before it, a URI's file changed in storage), refused
  unless its SHA-256 is the one the driver fixed.

All but the artifact land in one file per executor (:mod:`.executor_file`) that every
worker maps: one copy of the weights per executor. The model's custom objects and
``safe_mode`` (the payload-less :class:`~spark_keras.payload.shipment.Shipment`) travel
in the handle itself: small, and needed before any payload is touched.
"""
from __future__ import annotations

from typing import Any, Callable

from spark_keras.executor.driver_payload import DriverPayload
from spark_keras.executor.transport.artifact import ArtifactTransport
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.broadcast import BroadcastTransport
from spark_keras.executor.transport.chunked import warm
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.executor.transport.storage import StorageTransport


def is_connect(spark: Any) -> bool:
    """True for a Spark Connect session (``pyspark.sql.connect``)."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except Exception:  # Connect's client libraries are not installed: not a Connect session
        return False
    return isinstance(spark, ConnectSession)


def transport_for(spark: Any, key: str, payload: DriverPayload,
                  keep: Callable[[], ServedTransport], ship: str = "auto") -> Transport:
    """How ``payload`` reaches ``spark``'s executors: from storage if the model has a
    URI (``payload.stored``; from the driver once the file there changed); else from the
    driver's file with ``ship="driver"``; else as a session artifact (Connect; from the
    driver for the tasks that do not see it); else, on classic Spark, as a broadcast with
    ``ship="broadcast"`` or when the payload is in memory (a small one, see
    :mod:`spark_keras.executor.driver_payload`); when not, from the driver's file, which
    :func:`.chunked.warm` writes on every executor first (``key``'s file).

    ``keep()`` is called exactly when the driver must keep a copy to serve: it keeps the
    payload in the driver's version server (setting ``payload.path``) and gives the
    :class:`ServedTransport` that reads it from there."""
    if payload.stored is not None:
        return StorageTransport(payload.stored, rdds=not is_connect(spark), served=keep())
    if ship != "driver" and is_connect(spark):
        served = keep()
        assert payload.path is not None, "keep() puts the payload in the driver's file"
        return ArtifactTransport.upload(spark, key, payload.path, served)
    sc = getattr(spark, "sparkContext", spark)
    if ship == "broadcast" or (ship == "auto" and payload.data is not None):
        assert payload.data is not None, "a payload to broadcast is read into memory"
        return BroadcastTransport(sc, payload.data)
    served = keep()
    if ship == "auto":
        warm(sc, key, payload.nbytes, served)
    return served
