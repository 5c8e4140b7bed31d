"""The channel's protocol: a request head parsed within bounds, and the answers' forms.

A request is ``GET <path>?<query>`` over HTTP/1.x, with the token of its scope in the
``X-Spark-Keras-Token`` header (:mod:`.credentials`) and, for a file answer, maybe
``Range: bytes=<start>-[<last>]`` (``206``, ``Content-Range``): a reader whose transfer was
cut resumes where it stopped, a reader of a part asks for that part alone. Its head is
at most ``HEAD_BYTES`` and ``HEAD_LINES`` header lines (else 431). An answering function
gives an :class:`Answer` (a short body or a file), or a :class:`Later` one, or raises
:class:`Refused` (4xx or 5xx with a one-line reason). Every answer closes its connection: no keep-alive.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http
import re
import urllib.parse
from typing import BinaryIO, Callable

from spark_keras.channel.credentials import token_scope

HEAD_BYTES = 8 << 10
HEAD_LINES = 32
TOKEN_HEADER = b"x-spark-keras-token"
_RANGE = re.compile(rb"bytes=([0-9]{1,18})-([0-9]{1,18})?")


class Refused(Exception):
    """Raised by an answering function: the request gets ``status`` and the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Answer:
    """A request's answer: ``body`` (of type ``kind``), or ``size`` bytes read from
    ``file`` (closed once sent), from byte ``start`` to byte ``stop`` (excluded; None: to
    its end) if the request asked so."""

    body: bytes = b""
    kind: str = "application/json"
    file: BinaryIO | None = None
    size: int = 0
    start: int = 0
    stop: int | None = None


@dataclasses.dataclass
class Later:
    """An answer given once ``until`` is done, or ``within`` seconds passed (awaited on
    the event loop: no thread of the pool waits): ``then()``'s, run in the pool."""

    until: concurrent.futures.Future
    within: float
    then: Callable[[], Answer]


# (path, query, the scope its token was made for) -> answer; may raise Refused
Answering = Callable[[str, dict[str, str], str], "Answer | Later"]


def too_long() -> Refused:
    """The refusal of a request head past ``HEAD_BYTES`` or ``HEAD_LINES``."""
    return Refused(431, f"a request head is at most {HEAD_BYTES} bytes and {HEAD_LINES} header lines")


def parse_request(head: bytes, secret: bytes
                  ) -> tuple[str, dict[str, str], str, int, int | None]:
    """A request head's path, query, its token's scope (made with ``secret``) and the
    bytes a file answer starts and stops at (its ``Range: bytes=<start>-[<last>]``, else
    0 and None; any other range is ignored), once its token is checked."""
    lines = head.split(b"\r\n")
    if len(lines) > HEAD_LINES + 1 or len(head) > HEAD_BYTES:
        raise too_long()
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise Refused(400, "a malformed request line")
    if parts[0] != b"GET":
        raise Refused(405, "only GET is answered")
    token, start, stop = b"", 0, None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise Refused(400, "a malformed header line")
        name = name.strip().lower()
        if name == TOKEN_HEADER:
            token = value.strip()
        elif name == b"range" and (asked := _RANGE.fullmatch(value.strip())):
            start = int(asked.group(1))
            stop = None if asked.group(2) is None else int(asked.group(2)) + 1
    scope = token_scope(secret, token)
    if scope is None:
        raise Refused(403, "bad token")
    try:
        url = urllib.parse.urlsplit(parts[1].decode("ascii"))
        query = dict(urllib.parse.parse_qsl(url.query, max_num_fields=8, errors="strict"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(400, f"a malformed request target ({exc})") from None
    return url.path, query, scope, start, stop


def answer_head(status: int, kind: str, length: int, extra: str = "") -> bytes:
    """An answer's status line and headers (``extra``: more header lines)."""
    return (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {length}\r\n{extra}Connection: close\r\n\r\n").encode()


def refusal(status: int, message: str, retry_after: int) -> bytes:
    """A refusal's whole answer; a 503 tells to come back in ``retry_after`` seconds."""
    body = message.encode("utf-8", "replace")
    extra = f"Retry-After: {retry_after}\r\n" if status == 503 else ""
    return answer_head(status, "text/plain; charset=utf-8", len(body), extra) + body
