"""Where executors reach the driver's channel, where it listens, and what a worker that
cannot reach it does.

Executors reach it at the driver's address (:func:`driver_host`): ``spark.driver.host``
on classic Spark, the Connect server's host's view of this machine on Connect
(``127.0.0.1`` for a local server); set ``SPARK_KERAS_DRIVER_HOST`` (and
``SPARK_KERAS_DRIVER_PORT``, default any free port) where that is not the address
executors can reach. It listens at that address, or at
``SPARK_KERAS_DRIVER_BIND_ADDRESS`` or ``spark.driver.bindAddress`` if set
(:func:`bind_address`); when the address is not one of this machine's and neither is
set, on every interface, with a warning (:func:`listening_socket`). A task that cannot
reach it fails, unless ``SPARK_KERAS_UNREACHABLE_DRIVER=plan`` (read at start, carried
in the address: :func:`plan_if_unreachable`) lets it score with its plan's version
(:mod:`spark_keras.executor.task_version`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from typing import Any

from spark_keras.errors import ArgumentError, SparkKerasError

logger = logging.getLogger("spark_keras")

BIND_ENV = "SPARK_KERAS_DRIVER_BIND_ADDRESS"
# what a worker that cannot reach the driver at all does: "fail" its task (the default),
# or score with the version its "plan" was made with (update() does not reach it)
UNREACHABLE_ENV = "SPARK_KERAS_UNREACHABLE_DRIVER"


def driver_host(spark: Any, connect: bool) -> str:
    """This driver's address as the executors of ``spark`` (a Connect session if
    ``connect``) reach it."""
    if connect:
        if getattr(spark.client, "host", None) in (None, "localhost", "127.0.0.1", "::1"):
            return "127.0.0.1"  # a local Connect server: its executors are on this machine
        return socket.gethostbyname(socket.gethostname())
    sc = getattr(spark, "sparkContext", spark)
    return socket.gethostbyname(sc.getConf().get("spark.driver.host") or socket.gethostname())


def bind_address(spark: Any, connect: bool) -> str | None:
    """Where this driver's channel listens: ``SPARK_KERAS_DRIVER_BIND_ADDRESS``, else
    ``spark.driver.bindAddress`` (classic Spark), else None (at its advertised host)."""
    if os.environ.get(BIND_ENV):
        return os.environ[BIND_ENV]
    if connect:
        return None  # the Connect server's settings are not this process's
    sc = getattr(spark, "sparkContext", spark)
    return sc.getConf().get("spark.driver.bindAddress") or None


def plan_if_unreachable() -> bool:
    """``SPARK_KERAS_UNREACHABLE_DRIVER``: ``plan`` (True) lets a worker that cannot reach
    the driver score with its plan's version; ``fail`` (False, the default) fails the task."""
    value = os.environ.get(UNREACHABLE_ENV, "fail").strip().lower()
    if value not in ("fail", "plan"):
        raise ArgumentError(f"{UNREACHABLE_ENV}={value!r}: use 'fail' (the default: a task "
                            f"that cannot reach the driver fails) or 'plan' (it scores with "
                            f"the version its plan was made with)")
    return value == "plan"


def listening_socket(host: str, port: int, bind: str | None) -> socket.socket:
    """The channel's listening socket: at ``bind`` if set, else at ``host`` (what
    executors are told); on every interface, with a warning, if ``host`` is not an
    address of this machine (a container behind a NAT, say)."""
    if bind:
        try:
            return _listen(bind, port)
        except OSError as exc:
            raise SparkKerasError(f"the driver's channel cannot listen at {bind} port {port} "
                                  f"(spark.driver.bindAddress or {BIND_ENV}): {exc}") from exc
    try:
        return _listen(host, port)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            raise SparkKerasError(f"the driver's channel cannot listen at {host} port {port}: "
                                  f"{exc}; set SPARK_KERAS_DRIVER_PORT to a free port (0: any)") from exc
        everywhere = "::" if ":" in host else "0.0.0.0"
        logger.warning("the driver's channel cannot listen at %s, the address executors are told "
                       "(%s): it listens on every interface of this machine (%s) instead; set "
                       "spark.driver.bindAddress (or %s) to the address executors reach it at",
                       host, exc, everywhere, BIND_ENV)
        return _listen(everywhere, port)


def _listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    return sock
