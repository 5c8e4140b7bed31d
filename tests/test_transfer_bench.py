"""The transfer benchmark's byte counter (:mod:`bench.socket_bytes`) counts what one
process sent another over a real loopback socket, and only that direction: the figure
the "driver sent x payload" target rests on. No Spark: about a second."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from bench.socket_bytes import SocketBytes

SENT = 5 * 2**20

RECEIVER = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
got = 0
while got < int(sys.argv[2]):
    got += len(s.recv(1 << 20))
s.sendall(b"k")
s.recv(1)
"""


def test_socket_bytes_counts_what_this_process_sent_to_another():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port), str(SENT)])
    sockets = SocketBytes()
    try:
        conn, _ = listener.accept()
        conn.sendall(os.urandom(SENT))
        assert conn.recv(1) == b"k"  # the child read it all: acknowledged
        sockets.sample()  # while the socket is open
        conn.sendall(b"x")
        child.wait(timeout=30)
        conn.close()
    finally:
        sockets.stop()
        listener.close()
        child.kill()
    me, other = {os.getpid()}, {child.pid}
    assert SENT <= sockets.sent(me, other) <= SENT + 1024
    assert sockets.sent(other, me) <= 16  # the child's one byte back
    assert sockets.sent(me, {child.pid + 10**7}) == 0  # no socket to that process
