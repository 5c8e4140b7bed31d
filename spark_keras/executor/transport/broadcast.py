"""The payload as a Spark broadcast (classic Spark): the first worker of an executor that
needs the model writes the broadcast's bytes to the executor's file; every worker maps it."""

from __future__ import annotations

import dataclasses
from typing import Any

from spark_keras import flavour
from spark_keras.errors import SparkKerasError
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.executor_file import executor_folder, join_executor_file
from spark_keras.payload.shipment import Shipment


class BroadcastTransport(Transport):
    """The payload as a broadcast (classic Spark)."""

    def __init__(self, sc: Any, payload: bytes) -> None:
        self._sc = sc
        self._broadcast = sc.broadcast(payload)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        folder = executor_folder() if share_weights and flavour.current().shares_weights else None
        try:
            if folder is not None:
                join_executor_file(folder, key)
                return recipe.build_shared(folder, key, nbytes, fetch=lambda: self._broadcast.value)
            return dataclasses.replace(recipe, payload=self._broadcast.value).build()
        finally:
            _forget_loaded_value(self._broadcast)

    def _context_stopped(self) -> bool:
        """On the driver: whether the SparkContext that made the broadcast stopped."""
        return self._sc is not None and self._sc._jsc is None

    def check_alive(self, key: str) -> None:
        if self._context_stopped():
            raise SparkKerasError(
                f"BroadcastModel {key} was broadcast by a SparkContext that has stopped: its "
                f"tasks cannot load it in another; create the BroadcastModel again in the new "
                f"session (a ship='driver' handle goes on in a new SparkContext)")

    def renew(self, blocking: bool) -> None:
        """Drop the executors' copies; broadcast the payload afresh for later use."""
        payload = self._broadcast.value  # the driver's copy, read from its file
        self._broadcast.destroy(blocking)
        self._broadcast = self._sc.broadcast(payload)

    def destroy(self, blocking: bool) -> None:
        if self._context_stopped():
            return  # its broadcasts went with it
        self._broadcast.destroy(blocking)

    def __reduce__(self) -> tuple:
        return (_broadcast_transport, (self._broadcast,))


def _broadcast_transport(broadcast: Any) -> BroadcastTransport:
    transport = BroadcastTransport.__new__(BroadcastTransport)
    transport._sc, transport._broadcast = None, broadcast
    return transport


def _forget_loaded_value(broadcast: Any) -> None:
    """Let a worker free the unpickled payload bytes once the model is built (PySpark
    reloads a broadcast value from its file on demand), so a worker holds one copy of
    the weights, not two."""
    if getattr(broadcast, "_path", None) is not None:
        broadcast.__dict__.pop("_value", None)
