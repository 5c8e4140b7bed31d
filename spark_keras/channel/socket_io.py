"""Reads and writes on a non-blocking TLS socket from an asyncio event loop, a writer
held to its reader's progress.

OpenSSL's state stays the socket's alone: each call on it is tried, and tried again once
the socket is ready (readable, writable) for TLS to go on (:func:`io`). A writer waits
for room in the kernel's send queue only while the reader takes something of what is
queued for it: one that takes nothing for ``WRITE_TIMEOUT`` seconds is dropped, however
long a slow one takes in all (progress read from the socket's send queue, ``TIOCOUTQ``;
where it cannot be, each wait for room gets ``WRITE_TIMEOUT`` seconds: :func:`taken`).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import struct
from typing import Any, Callable

WRITE_TIMEOUT = 30.0  # seconds a reader may take nothing of an answer


async def send(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, data: bytes) -> None:
    """Send ``data`` to a reader that keeps taking it (:func:`taken`)."""
    view = memoryview(data)
    while view:
        sent = await io(loop, sock, functools.partial(sock.send, view), sending=True)
        view = view[sent:]


async def io(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, operation: Callable[[], Any],
             sending: bool = False) -> Any:
    """``operation()`` (a call on the non-blocking socket), again each time TLS can
    go on, until it completes; ``sending``: within the reader's progress bound."""
    while True:
        try:
            return operation()
        except ssl.SSLWantReadError:
            readable = ready(loop, sock, loop.add_reader, loop.remove_reader)
            if sending:
                async with asyncio.timeout(WRITE_TIMEOUT):
                    await readable
            else:
                await readable
        except ssl.SSLWantWriteError:
            if sending:
                await taken(loop, sock)
            else:
                await ready(loop, sock, loop.add_writer, loop.remove_writer)


async def taken(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket) -> None:
    """Return once ``sock`` has room to write; raise ``TimeoutError`` once the reader
    took nothing of what the kernel queued for it for ``WRITE_TIMEOUT`` seconds (the
    queue did not shrink: the kernel wakes a writer only once a third of a large
    buffer drained, which a slow reader may take longer than that to do)."""
    queued, since = _queued(sock), loop.time()
    while (left := since + WRITE_TIMEOUT - loop.time()) > 0:
        try:
            async with asyncio.timeout(left if queued is None else min(left, WRITE_TIMEOUT / 4)):
                await ready(loop, sock, loop.add_writer, loop.remove_writer)
            return
        except TimeoutError:
            now = _queued(sock)
            if queued is not None and now is not None and now < queued:
                since = loop.time()  # progress
            queued = now
    raise TimeoutError(f"the reader took nothing for {WRITE_TIMEOUT:.0f} s")


async def ready(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket, add: Callable[..., Any],
                remove: Callable[[int], Any]) -> None:
    """Return once ``sock`` is ready as ``add`` (the loop's ``add_reader`` or
    ``add_writer``) watches for; ``remove`` stops the watch."""
    future = loop.create_future()
    fd = sock.fileno()
    add(fd, _resolve, future)
    try:
        await future
    finally:
        remove(fd)


def _queued(sock: socket.socket) -> int | None:
    """The bytes in ``sock``'s kernel send queue, not yet acknowledged by the reader's
    (None where the kernel does not tell)."""
    try:
        import fcntl
        import termios

        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except (ImportError, AttributeError, OSError, struct.error):
        return None


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
