"""A TCP relay on 127.0.0.1 for the driver's channel tests: what passes through it, and
how, is its subclass's (:meth:`Relay.pump`); TLS passes through untouched."""

from __future__ import annotations

import socket
import threading


class Relay:
    """Listens on 127.0.0.1 (``port``) and joins each connection to ``target``. Each
    direction runs :meth:`pump` on a thread of its own; both sockets close when either
    direction ends. ``count``: connections so far (numbered from 0)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.count = 0
        self._lock = threading.Lock()
        self.port = 0
        self.admit()

    def pump(self, src: socket.socket, dst: socket.socket, number: int | None) -> None:
        """Pass ``src``'s bytes to ``dst``: ``number`` is the connection's on the
        server's side, None on the client's."""
        while data := src.recv(65536):
            dst.sendall(data)

    def refuse(self) -> None:
        """Stop listening: a connection to the relay's port is then answered with a reset
        by the kernel (``ECONNREFUSED``), as something on the path forging resets would
        answer it. :meth:`admit` listens again on the same port."""
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        self._listener.close()

    def admit(self) -> None:
        """Listen (again) on the relay's port (any free one the first time)."""
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def close(self) -> None:
        self.refuse()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                number, self.count = self.count, self.count + 1
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._run, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._run, args=(upstream, client, number), daemon=True).start()

    def _run(self, src: socket.socket, dst: socket.socket, number: int | None) -> None:
        try:
            self.pump(src, dst, number)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
