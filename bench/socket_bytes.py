"""The bytes each TCP socket on this machine carried, with the processes that own it
(``ss -tinp``: each socket's ``bytes_acked`` and owners, sampled every 50 ms; a socket that
closes between two samples loses at most its last 50 ms): what the driver's processes
sent to the executors' (:mod:`bench.transfer_bench`)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

from bench.sampler import Sampler

_ACKED = re.compile(r"bytes_acked:(\d+)")
_PIDS = re.compile(r"pid=(\d+)")


class SocketBytes(Sampler):
    """Every TCP socket's bytes acknowledged and owners, sampled until :meth:`stop`."""

    def __init__(self, interval: float = 0.05) -> None:
        self.seen: dict[tuple[str, str], dict[str, Any]] = {}
        super().__init__(interval)

    def sample(self) -> None:
        try:
            out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True,
                                 timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return
        key = None
        for line in out.splitlines():
            if not line.startswith((" ", "\t")):  # a socket: state, queues, local, peer, users
                fields = line.split()
                key = (fields[3], fields[4]) if len(fields) >= 5 else None
                if key is not None:
                    entry = self.seen.setdefault(key, {"pids": set(), "acked": 0})
                    entry["pids"].update(int(p) for p in _PIDS.findall(line))
            elif key is not None and (found := _ACKED.search(line)):
                entry = self.seen[key]
                entry["acked"] = max(entry["acked"], int(found.group(1)))

    def stop(self) -> None:
        self.halt()
        self.sample()

    def sent(self, senders: set[int], receivers: set[int]) -> int:
        """Bytes acknowledged on the sockets of ``senders`` whose other end belongs to one
        of ``receivers``."""
        total = 0
        for (local, peer), entry in self.seen.items():
            other = self.seen.get((peer, local))
            if entry["pids"] & senders and other is not None and other["pids"] & receivers:
                total += entry["acked"]
        return total


def driver_sent(sockets: SocketBytes, processes: list[dict[str, Any]]) -> int:
    """What the driver's processes sent to the executors' (``processes``: the roles
    :class:`.large_bench.Peaks` found)."""
    driver = {p["pid"] for p in processes if p["role"] in ("driver Python", "driver JVM")}
    executors = {p["pid"] for p in processes
                 if p["role"] in ("executor JVM", "Python daemon", "Python worker")}
    return sockets.sent(driver, executors)
