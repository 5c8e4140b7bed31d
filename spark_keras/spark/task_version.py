"""In a worker: the version of a BroadcastModel that the running Spark task scores with.

The task's scope (:func:`~.versions.scope_of`: its micro-batch, SQL execution or stage)
is asked of the driver once per process (:func:`.version_server.ask`); the answer also
lists the versions released, whose models this process drops, and whose payload files
leave the executor, before the task goes on.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from ..cache import model_cache
from ..errors import ChannelError, SparkKerasError
from ..payload.shipment import Shipment
from ..payload.stored import StoredModel
from . import version_server
from .transport import ServedTransport, StorageTransport
from .versions import SCOPE_PROPERTIES, scope_of

logger = logging.getLogger("spark_keras")

# In a worker: released keys already dropped here (versions, and the BroadcastModels
# the driver destroyed or unpersisted)
dropped: set[str] = set()
# (handle name, scope) -> the handle of the version the scope scores with (None: the
# handle itself, its first version)
_chosen: dict[tuple[str, str | None], Any] = {}
_unreachable_warned: set[str] = set()
_MAX_CHOSEN = 1000


def task_scope() -> tuple[bool, str | None]:
    """``(in a task, its scope)``."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return False, None
    properties = {k: context.getLocalProperty(k) for k in SCOPE_PROPERTIES}
    return True, scope_of(properties, context.stageId())


def version_for(handle: Any, scope: str | None) -> Any:
    """``handle`` (a BroadcastModel unpickled here) as the version the driver says
    ``scope`` scores with; the versions it says are released are dropped first. A driver
    that cannot be reached leaves the handle as its plan was made (warned once), unless
    the plan was made with a later version than the handle's own."""
    if (handle._name, scope) in _chosen:
        return _chosen[(handle._name, scope)] or handle
    address = handle._versions
    try:
        answer = version_server.ask(address, handle._name, scope)
    except ChannelError as exc:
        if handle._planned != 1:
            raise SparkKerasError(
                f"cannot reach the driver at {address.url} for the version of model "
                f"{handle._name} this task scores with ({exc}); set SPARK_KERAS_DRIVER_HOST "
                f"to an address of the driver that the executors reach") from exc
        if handle._name not in _unreachable_warned:
            _unreachable_warned.add(handle._name)
            logger.warning("cannot reach the driver at %s for model versions (%s): scoring with "
                           "the version this plan was made with; update() does not reach this "
                           "query", address.url, exc)
        return handle
    for gone in answer["released"]:
        if gone["key"] not in dropped:
            model_cache.drop(gone["key"])
            transport = ServedTransport if gone["index"] > 1 else type(handle._transport)
            transport.forget([gone["key"]])
            dropped.add(gone["key"])
    version = answer["version"]
    chosen = None if version["index"] == 1 else _as_version(handle, version)
    if len(_chosen) > _MAX_CHOSEN:
        _chosen.clear()
    _chosen[(handle._name, scope)] = chosen
    return chosen or handle


def _as_version(handle: Any, version: dict[str, Any]) -> Any:
    """A copy of ``handle`` building ``version`` (the driver's answer): its payload read
    from the driver, or from storage for a URI (from the driver if it changed there)."""
    source = version["source"]
    served = ServedTransport(handle._versions, handle._name, version["index"])
    chosen = copy.copy(handle)
    chosen._key, chosen._nbytes, chosen._version = version["key"], version["nbytes"], version["label"]
    chosen._index, chosen._versions = version["index"], None
    chosen._recipe = Shipment(b"", version_server.objects_bytes(source["objects"]),
                              source["safe_mode"])
    chosen._transport = served if source["stored"] is None else \
        StorageTransport(StoredModel(**source["stored"]), handle._transport.rdds, served)
    return chosen
