"""In a worker: the version of a BroadcastModel that the running Spark task scores with.

The task's scope (:func:`~.scopes.scope_of`: its micro-batch, SQL execution or stage)
is asked of the driver once per process (:func:`.client.ask`), and the answer
this process settles on is kept for the scope: every task of a micro-batch or action
scores with one version. The answer also lists the versions released, whose models this
process drops, and whose payload files leave the executor, before the task goes on.

What the worker acts on comes through Spark's own channel or is authenticated: the
answer arrives over the driver's pinned TLS channel and carries a version's payload
digest and, for custom objects other than the handle's own, only their digest (the
objects themselves are files Spark ships, :mod:`.shipped_objects`); ``safe_mode`` is
the handle's, from the plan, whatever the answer says.

A driver slow to answer (a timeout, a connection reset, while its port still accepts
connections) is asked again for up to :data:`SLOW_DRIVER_WAIT` seconds. A driver that
cannot be reached at all (connection refused, no route to it, a port that does not
accept connections: a firewall) fails the task, and Spark retries it: what a worker sees
of the network is no ground to score with another version than the other workers (a
reset forged on the path would split an action in two). Only where the driver opted in
(``SPARK_KERAS_UNREACHABLE_DRIVER=plan``, carried in the handle's address) does such a
task score with the version its plan was made with, warned once.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import errno
import logging
import re
import socket
import time
from typing import Any, Iterable

from spark_keras.cache import model_cache
from spark_keras.channel import client as channel_client
from spark_keras.channel.scopes import SCOPE_PROPERTIES, scope_of
from spark_keras.errors import ChannelError, SparkKerasError
from spark_keras.executor import shipped_objects
from spark_keras.executor.transport.base import Transport
from spark_keras.executor.transport.served import ServedTransport
from spark_keras.executor.transport.storage import StorageTransport
from spark_keras.payload.stored import StoredModel

logger = logging.getLogger("spark_keras")

# In a worker: released keys already dropped here (versions, and the BroadcastModels
# the driver destroyed or unpersisted)
dropped: set[str] = set()
# (handle name, scope) -> the handle of the version the scope scores with (None: the
# handle itself, its first version, or the plan's when the driver cannot be reached);
# least recently used first. Every use of a scope's answer refreshes it, so a scope
# whose tasks run here keeps its answer; one unused while _MAX_CHOSEN other scopes were
# used here asks the driver again, whose pin answers the same (see versions.MAX_PINS)
_chosen: collections.OrderedDict[tuple[str, str | None], Any] = collections.OrderedDict()
_unreachable_warned: set[str] = set()
_MAX_CHOSEN = 1000
# seconds a worker keeps asking a driver that does not answer (timeouts, resets)
SLOW_DRIVER_WAIT = 180.0
_SHA256 = re.compile(r"[0-9a-f]{64}")
# what a connection attempt meets when the driver cannot be reached at all
_UNREACHABLE = {errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN,
                errno.EHOSTDOWN, errno.EADDRNOTAVAIL}


def task_scope() -> tuple[bool, str | None]:
    """``(in a task, its scope)``."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return False, None
    properties = {k: context.getLocalProperty(k) for k in SCOPE_PROPERTIES}
    return True, scope_of(properties, context.stageId())


def for_task(handle: Any) -> Any:
    """``handle`` (a BroadcastModel) as the version the running task scores with: itself
    on the driver, outside a task, or as a version's copy; else :func:`version_for`."""
    if handle._model is not None or handle._versions is None:
        return handle
    in_task, scope = task_scope()
    return version_for(handle, scope) if in_task else handle


def version_for(handle: Any, scope: str | None) -> Any:
    """``handle`` (a BroadcastModel unpickled here) as the version the driver says
    ``scope`` scores with; the versions it says are released are dropped first. The
    outcome is kept for ``scope``.

    Raises:
        ChannelError: the driver cannot be reached at all (the task fails; Spark retries
            it), unless the driver opted in to the plan's version
            (``SPARK_KERAS_UNREACHABLE_DRIVER=plan``) and the plan was made with the
            handle's own version: then the handle as its plan was made (warned once).
        SparkKerasError: the driver did not answer within :data:`SLOW_DRIVER_WAIT`.
    """
    try:
        _chosen.move_to_end((handle._name, scope))  # kept: used now
        return _chosen[(handle._name, scope)] or handle
    except KeyError:  # not asked here yet
        pass
    address = handle._versions
    try:
        answer = _ask(address, handle._name, scope)
    except ChannelError as exc:  # the driver cannot be reached at all
        where = (f"cannot reach the driver at {address.url} for the version of model "
                 f"{handle._name} this task scores with ({exc})")
        if handle._planned != 1:
            raise ChannelError(f"{where}; set SPARK_KERAS_DRIVER_HOST to an address of the "
                               f"driver that the executors reach") from exc
        if not address.plan_if_unreachable:
            raise ChannelError(
                f"{where}: the task fails rather than score with the version its plan was "
                f"made with, which an update() may have replaced for the other tasks "
                f"(Spark retries it). Set SPARK_KERAS_DRIVER_HOST to an address of the driver "
                f"that the executors reach; where they never can, set "
                f"SPARK_KERAS_UNREACHABLE_DRIVER=plan on the driver to score with the plan's "
                f"version (update() then does not reach such tasks)") from exc
        if handle._name not in _unreachable_warned:
            _unreachable_warned.add(handle._name)
            logger.warning("cannot reach the driver at %s for model versions (%s): scoring with "
                           "the version this plan was made with; update() does not reach this "
                           "query", address.url, exc)
        return _keep(handle._name, scope, None) or handle
    drop_released([(gone["key"], ServedTransport if gone["index"] > 1 else type(handle._transport))
                   for gone in answer["released"]])
    version = answer["version"]
    chosen = None if version["index"] == 1 else _as_version(handle, version)
    return _keep(handle._name, scope, chosen) or handle


def drop_released(released: Iterable[tuple[str, type[Transport]]]) -> list[str]:
    """Drop the models of ``released`` (``(key, transport class)`` pairs) not dropped
    here yet, and have each transport remove the executor's files of its keys.

    Returns:
        The keys dropped now.
    """
    by_transport: dict[type[Transport], list[str]] = {}
    for key, transport in released:
        if key not in dropped:
            by_transport.setdefault(transport, []).append(key)
    stale = [key for keys in by_transport.values() for key in keys]
    for key in stale:
        model_cache.drop(key)
    for transport, keys in by_transport.items():  # the files of each, where it put them
        transport.forget(keys)
    dropped.update(stale)
    return stale


def _keep(name: str, scope: str | None, chosen: Any) -> Any:
    _chosen[(name, scope)] = chosen
    _chosen.move_to_end((name, scope))
    while len(_chosen) > _MAX_CHOSEN:
        _chosen.popitem(last=False)
    return chosen


def _ask(address: Any, name: str, scope: str | None) -> dict[str, Any]:
    """The driver's answer, asked again while it does not come (a timeout, a reset) but
    its port accepts connections, for up to :data:`SLOW_DRIVER_WAIT` seconds.

    Raises:
        ChannelError: the driver cannot be reached at all (refused, no route, a port
            that accepts no connection).
        SparkKerasError: it did not answer within :data:`SLOW_DRIVER_WAIT` seconds.
    """
    started = time.monotonic()
    delay, attempts = 1.0, 0
    while True:
        attempts += 1
        try:
            return channel_client.ask(address, name, scope)
        except ChannelError as exc:
            if _unreachable(exc) or not _listening(address):
                raise
            waited = time.monotonic() - started
            if waited + delay > SLOW_DRIVER_WAIT:
                raise SparkKerasError(
                    f"the driver at {address.url} did not answer which version of model {name} "
                    f"this task scores with within {waited:.0f} s ({attempts} attempts; the "
                    f"last: {exc}): the driver is overloaded, or something on the path drops "
                    f"the connection") from exc
            logger.warning("the driver at %s did not answer for model %s (%s); asking again "
                           "in %.0f s", address.url, name, exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


def _unreachable(exc: BaseException) -> bool:
    """True if ``exc`` (or what caused it) says the driver cannot be reached at all, not
    that it was slow or the connection broke."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (ConnectionRefusedError, socket.gaierror)):
            return True
        if isinstance(cause, OSError) and not isinstance(cause, TimeoutError) \
                and cause.errno in _UNREACHABLE:
            return True
        cause = cause.__cause__
    return False


def _listening(address: Any) -> bool:
    """True if a TCP connection to the driver's port is accepted: its kernel answers, so
    the driver is there but slow (a silent firewall, or no route, times out here too)."""
    try:
        with socket.create_connection((address.host, address.port),
                                      timeout=min(channel_client.TIMEOUT, 10.0)):
            return True
    except OSError:
        return False


def _as_version(handle: Any, version: dict[str, Any]) -> Any:
    """A copy of ``handle`` building ``version`` (the driver's answer): its payload read
    from the chunk broadcasts the plan carries of it, else from the driver, checked
    against the digest the answer carries, or from storage for a URI (from the driver if
    it changed there); its custom objects the handle's own, or
    the file Spark shipped of them (checked); ``safe_mode`` always the handle's."""
    source, index, name = version["source"], version["index"], handle._name
    digest = source.get("sha256")
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise SparkKerasError(f"the driver's answer for model {name} version {index} carries "
                              f"no payload digest ({str(digest)[:80]!r}): refused")
    served = ServedTransport(handle._versions, name, index, digest)
    objects = handle._recipe.objects if source.get("objects") is None else \
        shipped_objects.fetch(source["objects"], name, index)
    chosen = copy.copy(handle)  # through __getstate__: the plan's released keys are put back
    chosen._stale = handle._stale  # (they are dropped before the chosen version builds)
    chosen._key, chosen._nbytes, chosen._version = version["key"], version["nbytes"], version["label"]
    chosen._index, chosen._versions = index, None
    chosen._recipe = dataclasses.replace(handle._recipe, objects=objects)
    if source.get("stored") is not None:
        chosen._transport = StorageTransport(StoredModel(**source["stored"]),
                                             handle._transport.rdds, served)
    else:
        chosen._transport = served
    return chosen
