"""A figure sampled in a thread every ``interval`` seconds until stopped: the base of
:class:`bench.large_bench.Peaks` (processes' memory) and
:class:`bench.socket_bytes.SocketBytes` (sockets' bytes)."""

from __future__ import annotations

import threading


class Sampler:
    """Calls :meth:`sample` every ``interval`` seconds in a daemon thread, from
    construction until :meth:`halt` (a subclass sets its state before ``__init__``)."""

    def __init__(self, interval: float = 0.05) -> None:
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._interval)

    def sample(self) -> None:
        raise NotImplementedError

    def halt(self) -> None:
        """Stop sampling (the last sample taken has ended)."""
        self._stop.set()
        self._thread.join()
