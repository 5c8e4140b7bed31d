"""TensorFlow's start-up noise: the native lines its import prints (absl's "All log
messages before absl::InitializeLog() ..." and oneDNN's notice) before it applies
``TF_CPP_MIN_LOG_LEVEL``. :func:`quiet_tensorflow_startup`, around a first import, drops
the ones that level hides, as TensorFlow would have; :func:`spark_keras.flavour.current`
imports Keras inside it, so every spark_keras code path is quiet (docs/guide/deploying.md: Quiet logs).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from typing import Iterator

LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"

# absl's notice, printed (to file descriptor 2) with the first native log line of a
# process when nothing has initialized absl logging yet: TensorFlow does not
ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
# an absl log line, "I0000 00:00:1796090096.918610    1928 port.cc:153] oneDNN ...": its
# severity letter (I, W, E; F lines are never dropped)
ABSL_LINE = r"^([IWE])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^ \]]+:\d+\] "

# Lines the C libraries under TensorFlow's ops print straight to stderr, whatever
# TF_CPP_MIN_LOG_LEVEL says: libjpeg's, for a damaged JPEG that tf.io.decode_jpeg or
# decode_image meets (the op's own error says what went wrong, and becomes the row's
# reason). Row isolation calls the model again on parts of the batch, and each failing call
# prints them again: 12-16 lines per damaged image. Dropped at level 2 and above.
NATIVE_NOISE = (r"^(Improper call to JPEG library in state \d+|Corrupt JPEG data: .*"
                r"|Premature end of JPEG file|Invalid JPEG file structure: .*"
                r"|Not a JPEG file: .*|Unsupported marker type 0x[0-9a-f]+)\r?$")

# The filter runs in its own small process: were the importing process to abort (a
# native fatal error), the filter still reads what it wrote and passes it on. It ignores
# SIGINT and SIGHUP (its parent's group's signals) and ends when every writer has closed.
_FILTER = r"""
import os, re, select, signal, sys
for sig in (signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)
level, banner, line = int(sys.argv[1]), sys.argv[2].encode(), re.compile(sys.argv[3].encode())
noise = re.compile(sys.argv[4].encode()) if level >= 2 else None
rank = {b"I": 0, b"W": 1, b"E": 2}
def keep(text):
    if text == banner:
        return False
    if noise is not None and noise.match(text):
        return False
    m = line.match(text)
    return m is None or rank[m.group(1)] >= level
out, pending = sys.stderr.buffer, b""
piece = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)")  # a line, or a progress bar's step
while True:
    if pending and not select.select([0], [], [], 0.25)[0]:
        # a line left unfinished a moment (a prompt, a bar): passed on as it is so far
        if keep(pending):
            out.write(pending)
            out.flush()
        pending = b""
        continue
    chunk = os.read(0, 65536)
    if not chunk:
        break
    data = pending + chunk
    end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    pending = data[end:]
    kept = b"".join(p for p in piece.findall(data, 0, end) if keep(p.rstrip(b"\r\n")))
    if kept:
        out.write(kept)
        out.flush()
if pending and keep(pending):
    out.write(pending)
    out.flush()
"""


def min_log_level() -> int:
    """``TF_CPP_MIN_LOG_LEVEL`` as TensorFlow reads it (0: everything, 1: no INFO, 2: no
    WARNING, 3: no ERROR)."""
    try:
        return int(os.environ.get(LOG_LEVEL_ENV, "0"))
    except ValueError:
        return 0


@contextlib.contextmanager
def quiet_tensorflow_startup() -> Iterator[None]:
    """Around a first import of TensorFlow: drop the native start-up lines it prints
    before applying ``TF_CPP_MIN_LOG_LEVEL`` that this level hides.

    TensorFlow logs through absl; lines logged while its shared libraries load, before
    TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL``, are printed whatever it says: oneDNN's
    "oneDNN custom operations are on ..." (INFO, twice) and absl's "WARNING: All log
    messages before absl::InitializeLog() is called are written to STDERR" ahead of each.
    With the level at 1 or more, this drops absl's notice and the absl lines below the
    level; everything else written to file descriptor 2 meanwhile (Python warnings,
    errors, tracebacks) passes through unchanged and in order. Nothing is filtered at
    level 0 (the default), if TensorFlow is already imported, or if the filter cannot
    start. The filter is a small child process reading a pipe; it ends with the block.
    """
    if min_log_level() < 1 or "tensorflow" in sys.modules:
        yield
        return
    global _filtering
    with _FILTERING:  # one thread at a time: file descriptor 2 is the process's
        if _filtering:  # nested in this thread: already filtered
            yield
            return
        _filtering = True
        try:
            with _filtered_stderr(min_log_level()):
                yield
        finally:
            _filtering = False


_FILTERING = threading.RLock()
_filtering = False


@contextlib.contextmanager
def _filtered_stderr(level: int) -> Iterator[None]:
    if "tensorflow" in sys.modules:  # imported by another thread meanwhile
        yield
        return
    fds = _flushed_pipe()
    if fds is None:
        yield
        return
    read_fd, write_fd = fds
    saved = None
    try:
        saved = os.dup(2)
        proc = _start_filter(level, read_fd, saved)
    except (OSError, ValueError):
        for fd in (read_fd, write_fd, saved):
            if fd is not None:
                os.close(fd)
        yield
        return
    os.close(read_fd)
    _onto_stderr(write_fd)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last writer: the filter reads to the end
        os.close(saved)
        with contextlib.suppress(subprocess.TimeoutExpired):
            # (a process started meanwhile may hold the pipe open: the filter then
            # passes its output on until it exits)
            proc.wait(timeout=10)


def _flushed_pipe() -> tuple[int, int] | None:
    """A pipe for the filter, once what Python buffered for stderr is out (None: no pipe
    could be made, stderr stays as it is)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        return os.pipe()
    except OSError:
        return None


def _onto_stderr(write_fd: int) -> None:
    """File descriptor 2 becomes the pipe's writing end (its only one in this process)."""
    os.dup2(write_fd, 2)
    os.close(write_fd)


def _start_filter(level: int, read_fd: int, stderr_fd: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", _FILTER, str(level), ABSL_BANNER, ABSL_LINE,
         NATIVE_NOISE],
        stdin=read_fd, stdout=subprocess.DEVNULL, stderr=stderr_fd, close_fds=True)


_native_filter_pid: int | None = None  # the process whose stderr goes through the filter


def quiet_native_noise() -> None:
    """For the rest of this process: with ``TF_CPP_MIN_LOG_LEVEL`` at 2 or more, drop the
    lines of :data:`NATIVE_NOISE` (libjpeg's, on a damaged image) from file descriptor 2,
    and TensorFlow's absl lines below the level; everything else passes unchanged and in
    order. Called where a process builds its first model (:mod:`spark_keras.cache`); once
    per process, and not again in a child forked after it (its stderr is the same pipe).
    Only in a worker process (Spark's, a pool's, Dask's): a driver's or a notebook's
    stderr is left as it is, and so is stderr when the filter cannot start."""
    global _native_filter_pid
    level = min_log_level()
    if level < 2 or _native_filter_pid is not None or not _a_worker_process():
        return
    with _FILTERING:
        if _native_filter_pid is not None:
            return
        fds = _flushed_pipe()
        if fds is None:
            return
        read_fd, write_fd = fds
        try:
            _start_filter(level, read_fd, 2)
        except (OSError, ValueError):
            os.close(write_fd)
            return
        finally:
            os.close(read_fd)
        _onto_stderr(write_fd)
        _native_filter_pid = os.getpid()


def _a_worker_process() -> bool:
    """A process Spark (its worker factory's environment), multiprocessing or Dask (a
    multiprocessing child) started to run tasks."""
    import multiprocessing

    return any(name in os.environ for name in ("PYTHON_WORKER_FACTORY_SECRET",
                                               "PYTHON_WORKER_FACTORY_PORT")) \
        or multiprocessing.parent_process() is not None
