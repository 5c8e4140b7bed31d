"""An S3-compatible server for tests: moto's, on a free local port, in a thread of the
test process; it counts the requests it serves per object."""

from __future__ import annotations

import collections
import logging
import re
from typing import Any

BUCKET = "models"
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) (/[^ ?]*)')  # may be coloured


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self._handler = _Counting(self.requests)

    def __enter__(self) -> "S3Server":
        logging.getLogger("werkzeug").addHandler(self._handler)
        logging.getLogger("werkzeug").setLevel(logging.INFO)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"{host}:{port}"
        self.fs.create_dir(BUCKET)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.stop()
        logging.getLogger("werkzeug").removeHandler(self._handler)

    @property
    def fs(self) -> Any:
        import pyarrow.fs

        return pyarrow.fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http",
                                       region="us-east-1", allow_bucket_creation=True)

    def uri(self, name: str) -> str:
        """The ``s3://`` URI of ``name``, as ``pyarrow.fs`` resolves it anywhere."""
        return f"s3://{BUCKET}/{name}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"

    def put(self, name: str, data: bytes) -> str:
        with self.fs.open_output_stream(f"{BUCKET}/{name}") as f:
            f.write(data)
        return self.uri(name)

    def gets(self, name: str) -> int:
        """How many GET requests the object ``name`` has served."""
        return self.requests[("GET", f"/{BUCKET}/{name}")]


class _Counting(logging.Handler):
    def __init__(self, counter: collections.Counter) -> None:
        super().__init__(logging.INFO)
        self._counter = counter

    def emit(self, record: logging.LogRecord) -> None:
        found = _REQUEST.search(record.getMessage())
        if found:
            self._counter[found.groups()] += 1
