"""The interface every kind of transport (:mod:`spark_keras.executor.transport`) gives: in a
worker, build the model and remove the executor's files of released models; on the
driver, renew, release and check what was shipped."""

from __future__ import annotations

from spark_keras.executor.transport.executor_file import discard_files
from spark_keras.payload.shipment import Shipment


class Transport:
    """What every transport does; by default there is nothing to renew or release."""

    rdds = True  # usable from rdd.mapPartitions (not on Spark Connect)

    def build(self, recipe: Shipment, key: str, nbytes: int, share_weights: bool) -> tuple:
        """In a worker: ``(model, nbytes, memory)`` built from the shipped payload."""
        raise NotImplementedError

    def renew(self, blocking: bool) -> None:
        """On the driver, after ``unpersist()``: workers will build again under a new key."""

    def destroy(self, blocking: bool) -> None:
        """On the driver: release what was shipped."""

    def check_alive(self, key: str) -> None:
        """On the driver: raise if what was shipped can no longer reach a task."""

    @staticmethod
    def forget(keys: list[str]) -> None:
        """In a worker: remove the executor's files of released models."""
        discard_files(keys)
