"""Whether the driver's channel token crosses the network in clear, and the one warning
that says so.

The channel's address, certificate fingerprint and token reach the executors inside
Spark's own messages: task closures and broadcasts on classic Spark, plans on Spark
Connect. The token is therefore exactly as private as Spark's traffic: it was read in
clear in the driver-to-executor block traffic of a ``local-cluster`` without
``spark.authenticate`` and ``spark.network.crypto.enabled`` (not with them), and it
crosses the network in clear between a Spark Connect client and a remote server without
TLS. :func:`warn_if_exposed` logs a warning (logger ``spark_keras``) naming the settings
to turn on, once per process and cause, as a handle starts using the channel; nothing
on a local master (``local``, ``local[...]``: no network between driver and executors),
nothing once the settings are on.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import threading
from typing import Any, Callable

logger = logging.getLogger("spark_keras")

__all__ = ["SETTINGS", "TLS", "settings_off", "tls_off", "warn_if_exposed"]

SETTINGS = ("spark.authenticate", "spark.network.crypto.enabled")
"""Spark's settings that keep its RPC (and so the token in it) private on a cluster."""
TLS = "use_ssl=true"
"""What a Spark Connect connection string holds for its channel to use TLS."""

_LOCAL = re.compile(r"\s*local(\[[^\]]*\])?\s*")  # local, local[4], local[*], local[4,2]

_warned: set[str] = set()  # the warnings this process gave
_lock = threading.Lock()


def settings_off(master: str | None, conf: Callable[[str], str | None]) -> list[str]:
    """The settings of :data:`SETTINGS` that are not ``true`` (``conf(name)`` gives a
    setting's value, None if unset) for a Spark ``master`` whose executors are reached
    over the network (``local-cluster[...]``, ``spark://``, ``yarn``, ``k8s://``...);
    none for a local master."""
    if master is None or _LOCAL.fullmatch(master):
        return []
    return [name for name in SETTINGS if (conf(name) or "").strip().lower() != "true"]


def tls_off(builder: Any) -> bool:
    """True if a Spark Connect client's channel (its ``ChannelBuilder``) reaches a server
    on another host without TLS: no ``use_ssl=true`` (nor a ``token=``, with which
    PySpark uses TLS too) in its connection string. False for a server on this host
    (loopback), and for a builder of unknown kind (it makes its own channel)."""
    secure = getattr(builder, "secure", None)
    host = str(getattr(builder, "host", "") or "").strip("[]")
    if secure is None or not host:
        return False
    return not secure and not _loopback(host)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(spark: Any) -> None:
    """Warn, once per process and cause, if the channel's token crosses the network in
    clear for ``spark`` (a classic or Spark Connect session): see the module's text.
    Never raises: a session that cannot tell is not warned about."""
    try:
        messages = _exposures(spark)
    except Exception as exc:  # a stopped session, a server refusing to read its conf
        logger.debug("cannot tell whether the channel's token is exposed: %s", exc)
        return
    for message in messages:
        with _lock:
            first = message not in _warned
            _warned.add(message)
        if first:
            logger.warning(message)


def _exposures(spark: Any) -> list[str]:
    from spark_keras.executor.transport import is_connect

    what = ("the driver's channel token a handle carries (its holder may read that handle's "
            "model payloads and report to its invalid-row budget)")
    found = []
    if is_connect(spark):
        builder: Any = getattr(spark.client, "_builder", None)
        if tls_off(builder):
            found.append(f"Spark Connect server {builder.host!r} is reached without TLS "
                         f"({TLS} is not in the sc:// connection string): {what} travels "
                         f"inside each plan in clear on the network; add ;{TLS} to the "
                         f"connection string (a server behind a TLS endpoint)")
        master = spark.conf.get("spark.master", None)
        where = f"the Spark Connect server's master {master!r}"

        def conf(name: str) -> str | None:
            return spark.conf.get(name, None)
    else:
        sc = getattr(spark, "sparkContext", spark)
        master, where = sc.master, f"Spark master {sc.master!r}"
        conf = sc.getConf().get
    off = settings_off(master, conf)
    if off:
        found.append(f"{where} runs without {' and '.join(f'{s}=true' for s in off)}: "
                     f"{what} travels to the executors inside Spark's tasks, in clear on the "
                     f"network, where anyone who can read this cluster's traffic reads it; "
                     f"set {' and '.join(f'{s}=true' for s in SETTINGS)} (with Spark's "
                     f"shared secret) to keep it as private as Spark's own RPC")
    return found
