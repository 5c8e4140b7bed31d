"""When a :class:`~spark_keras.spark.broadcast.BroadcastModel` lets go, on the driver:
``unpersist`` (a new key, the old one released), ``destroy`` (released everywhere) and
garbage collection (a finalizer: the driver's copies and registry entries go). The keys
released are recorded here and every handle shipped afterwards carries them, so a worker
using any handle first drops those models and the executor's files of them
(:func:`~spark_keras.executor.task_version.drop_released`)."""

from __future__ import annotations

import collections
import weakref
from typing import Any

from spark_keras.channel import version_server, versions
from spark_keras.errors import SparkKerasError
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.served import ServedTransport

# Keys of BroadcastModels released on this driver, each with the class of the transport
# that shipped it (what a pickled handle carries as its _stale)
released: collections.deque[tuple[str, type[Transport]]] = collections.deque(maxlen=256)


def check_usable(handle: Any) -> None:
    """Raise if ``handle`` was destroyed, or its transport can no longer deliver (a
    stopped Spark context); drop what the driver had released."""
    if handle._released:
        raise SparkKerasError(f"BroadcastModel {handle._key} was destroyed: it can no longer "
                              f"be used")
    handle._transport.check_alive(handle._key)
    handle.release_stale()


def unpersist(handle: Any, blocking: bool) -> None:
    """:meth:`BroadcastModel.unpersist <spark_keras.spark.broadcast.BroadcastModel.unpersist>`."""
    with handle._lock:
        handle.check_usable()
        _release_keys(handle)
        handle._transport.renew(blocking)
        handle._epoch += 1
        handle._key = f"{handle._name}.{handle._epoch}"
        if handle._schedule is not None:  # every version is built afresh under a new key
            handle._schedule.rename(lambda v: handle._key if v.index == 1
                                      else f"{handle._name}.v{v.index}.{handle._epoch}")


def destroy(handle: Any, blocking: bool) -> None:
    """:meth:`BroadcastModel.destroy <spark_keras.spark.broadcast.BroadcastModel.destroy>`."""
    with handle._lock:
        if handle._released:
            return  # destroyed already: nothing more to release
        _release_keys(handle)
        handle._released = True
        handle._model = None
        handle._transport.destroy(blocking)
        schedule, handle._schedule = handle._schedule, None
    if schedule is not None:  # on the driver: its copies, and the server if idle
        if handle._finalizer is not None:
            handle._finalizer.detach()
        handle._server.forget(handle._name)
        version_server.close_if_idle(handle._server)


def on_collected(handle: Any) -> weakref.finalize:
    """A finalizer releasing what ``handle`` (just shipped, on the driver) holds once it
    is garbage-collected; it does not run at exit, when the server's folder goes whole."""
    finalizer = weakref.finalize(handle, _collected, handle._server, handle._name,
                                 handle._schedule, type(handle._transport))
    finalizer.atexit = False
    return finalizer


def _release_keys(handle: Any) -> None:
    """Workers drop the models and the executor's files of the current keys (every
    version's) when they next use a handle (any BroadcastModel's); the files go with
    the executor at the latest."""
    if handle._schedule is None:
        released.append((handle._key, type(handle._transport)))
    else:
        released.extend(_keys_of(handle._schedule, type(handle._transport)))


def _keys_of(schedule: versions.Schedule, transport: type[Transport]) -> list[tuple[str, type[Transport]]]:
    """``(key, transport class)`` of every version of ``schedule`` (version 1 travels by
    the handle's own ``transport``, later ones from the driver)."""
    return [(v.key, ServedTransport if v.index > 1 else transport)
            for v in list(schedule.versions.values())]


def _collected(server: version_server.Server, name: str, schedule: versions.Schedule,
               transport: type[Transport]) -> None:
    """A BroadcastModel garbage-collected on the driver (its finalizer): workers drop its
    models when they next use a handle, and the driver its payload copies and registry
    entries (plans made with it still find its current version while Spark runs; see
    :meth:`.version_server.Server.retire`)."""
    released.extend(_keys_of(schedule, transport))
    version_server.retire_soon(server, name)
