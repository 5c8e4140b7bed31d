"""A per-process LRU cache of rebuilt models.

Every Python worker process (Spark, Dask, a multiprocessing pool) keeps one module-level
:class:`ModelCache`, so a model is rebuilt once per process, not once per task. Entries
are keyed by a string the caller chooses (a BroadcastModel's id), bounded by a number of
entries and by the payload bytes they represent, and evicted least recently used.

Limits come from ``SPARK_KERAS_CACHE_MAX_ENTRIES`` / ``SPARK_KERAS_CACHE_MAX_BYTES``
(set them on executors with ``spark.executorEnv.*``) or :func:`configure_cache`.

With ``SPARK_KERAS_BUILD_LOG=/some/dir`` every build is also appended, as one JSON line,
to ``/some/dir/builds-<host>-<pid>.jsonl``: a record that outlives worker processes
(Spark discards idle or interrupted workers, and their :func:`cache_info` with them).
Each call size a model was held to because a larger call ran out of memory
(:mod:`spark_keras.inference.call_sizes`) goes to ``call-rows-<host>-<pid>.jsonl``
beside it (``read_build_log(folder, "call-rows")``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from spark_keras import heap
from spark_keras.quiet import quiet_native_noise

logger = logging.getLogger("spark_keras")

DEFAULT_MAX_ENTRIES = 4
MAX_ROOM = 64  # the most entries make_room keeps (KeyedModels with more keys: LRU beyond)
DEFAULT_MAX_BYTES = 8 * 1024**3


@dataclass
class _Entry:
    value: Any
    nbytes: int
    memory: dict[str, Any] = field(default_factory=dict)  # shared/private weight bytes
    placement: dict[str, Any] = field(default_factory=dict)  # device, task CPUs, threads
    call_rows: dict[str, int] = field(default_factory=dict)  # shape -> rows per call kept


class ModelCache:
    """Thread-safe LRU of built models; concurrent requests for one key build once."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES,
                 entries_chosen: bool = False):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # the entry limit was chosen (environment, configure): make_room leaves it be
        self._entries_chosen = entries_chosen
        self._room_for: str | None = None  # why make_room raised the limit
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._builds: dict[str, int] = {}
        self._build_seconds: dict[str, float] = {}
        self._hits = 0
        self._evictions = 0

    def get_or_build(self, key: str, build: Callable[[], tuple]) -> _Entry:
        """The entry for ``key``. On a miss ``build()`` returns ``(value, nbytes)``,
        ``(value, nbytes, memory)`` or ``(value, nbytes, memory, placement)``, ``memory``
        saying where the weights live (``shared``, ``shared_bytes``, ``private_bytes``;
        ``shared_fallback``: why not shared, when the shared file could not be written),
        ``placement`` the device the model was built on and the budget it was built
        with (see :mod:`spark_keras.executor.resources`)."""
        with self._lock:
            entry = self._hit(key)
            if entry is not None:
                return entry
            key_lock = self._building.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                entry = self._hit(key)  # another thread built it while we waited
                if entry is not None:
                    return entry
            quiet_native_noise()  # once per process, before its first model runs
            started = time.perf_counter()
            value, nbytes, *extra = build()
            seconds = time.perf_counter() - started
            entry = _Entry(value, nbytes, *(dict(e) for e in extra))
            with self._lock:
                self._builds[key] = self._builds.get(key, 0) + 1
                self._build_seconds[key] = self._build_seconds.get(key, 0.0) + seconds
                self._entries[key] = entry
                evicted = self._evict_over_limits(keep=key)
                self._building.pop(key, None)
            # the model, and TensorFlow imported for it, out of every later collection's
            # way; a model evicted for it is reclaimed first (see spark_keras.heap)
            if evicted:
                heap.refreeze()
            else:
                heap.freeze()
            logger.info("built model %s in %.2fs (pid %d)%s%s", key, seconds, os.getpid(),
                        " on shared weights" if entry.memory.get("shared") else "",
                        f" on {entry.placement['device']}" if "device" in entry.placement else "")
            _log_build(key, seconds, nbytes, {**entry.memory, **entry.placement})
            return entry

    def key_of(self, model: Any) -> str | None:
        """The key of the entry holding ``model`` (None: not cached here)."""
        with self._lock:
            return next((k for k, e in self._entries.items() if e.value is model), None)

    def keep_call_rows(self, model: Any, shape: str, rows: int) -> str | None:
        """Record that ``model``'s calls on rows of ``shape`` are held to ``rows`` rows (see
        :mod:`spark_keras.inference.call_sizes`); its key (None: not cached here)."""
        with self._lock:
            key = next((k for k, e in self._entries.items() if e.value is model), None)
            if key is not None:
                self._entries[key].call_rows[shape] = rows
            return key

    def _hit(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self._hits += 1
        return entry

    def _evict_over_limits(self, keep: str | None = None) -> int:
        """Evict least recently used entries (never ``keep``, the one just built) until
        within the limits; how many were evicted."""
        evicted = 0
        while self._entries and (len(self._entries) > self.max_entries
                                 or self._total_bytes() > self.max_bytes):
            oldest = next(iter(self._entries))
            if oldest == keep and len(self._entries) == 1:
                break  # one model larger than the byte limit still has to be usable
            if oldest == keep:
                self._entries.move_to_end(keep)
                continue
            del self._entries[oldest]
            self._evictions += 1
            evicted += 1
            logger.info("evicted model %s from the cache (pid %d)", oldest, os.getpid())
        return evicted

    def _total_bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def builds_of(self, key: str) -> tuple[int, float]:
        """How many times this process built ``key`` (on any device: ``key@GPU:1``, ...),
        and the seconds those builds took; counts only grow (eviction and drop keep them)."""
        with self._lock:
            keys = _device_keys(self._builds, key)
            return sum(self._builds[k] for k in keys), sum(self._build_seconds[k] for k in keys)

    def drop(self, key: str) -> bool:
        """Forget ``key`` and its builds on other devices (``key@GPU:1``, ...); True if
        any was cached."""
        with self._lock:
            keys = _device_keys(self._entries, key)
            for k in keys:
                del self._entries[k]
        if keys:
            heap.refreeze()  # the dropped models' reference cycles are collected
        return bool(keys)

    def make_room(self, models: int, why: str) -> None:
        """Keep up to ``models`` entries (at most :data:`MAX_ROOM`) where one task uses that
        many models in turn (a KeyedModels task: every key's rows in every batch), so
        that each is built once per process instead of once per batch. Only while the
        entry limit is the default: one chosen (``SPARK_KERAS_CACHE_MAX_ENTRIES``,
        :func:`configure_cache`) stays; ``max_bytes`` still bounds the weight bytes."""
        with self._lock:
            wanted = min(int(models), MAX_ROOM)
            if self._entries_chosen or wanted <= self.max_entries:
                return
            self.max_entries, self._room_for = wanted, why
        logger.info("model cache: room for %d models (%s), pid %d", wanted, why, os.getpid())

    def configure(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        with self._lock:
            if max_entries is not None:
                self.max_entries = max(1, int(max_entries))
                self._entries_chosen, self._room_for = True, None
            if max_bytes is not None:
                self.max_bytes = max(0, int(max_bytes))
            evicted = self._evict_over_limits()
        if evicted:
            heap.refreeze()

    def clear(self) -> None:
        with self._lock:
            had = bool(self._entries)
            self._entries.clear()
        if had:
            heap.refreeze()

    def info(self) -> dict[str, Any]:
        with self._lock:
            return {
                "pid": os.getpid(),
                "builds": sum(self._builds.values()),
                "builds_by_key": dict(self._builds),
                "hits": self._hits,
                "evictions": self._evictions,
                "entries": len(self._entries),
                "keys": list(self._entries),
                "memory_by_key": {k: dict(e.memory) for k, e in self._entries.items()},
                "placement_by_key": {k: dict(e.placement) for k, e in self._entries.items()},
                "call_rows_by_key": {k: dict(e.call_rows) for k, e in self._entries.items() if e.call_rows},
                "bytes": self._total_bytes(),
                "build_seconds": sum(self._build_seconds.values()),
                "max_entries": self.max_entries,
                "max_entries_for": self._room_for,  # None: the default or a chosen limit
                "max_bytes": self.max_bytes,
            }


def _device_keys(keys: Any, key: str) -> list[str]:
    """``key`` and its builds on other devices (``key@GPU:1``, ...) among ``keys``."""
    return [k for k in keys if k == key or k.startswith(f"{key}@")]


def note_call_rows(model: Any, record: dict[str, Any]) -> str | None:
    """Write ``record`` (a call size ``model`` was held to: ``shape``, ``rows``, ``tried``,
    ``reason``) to the build log's ``call-rows`` file, with the model's cache key; the key
    (None: the model is not cached here, a driver's own model say)."""
    key = model_cache.keep_call_rows(model, record["shape"], record["rows"])
    _log_record("call-rows", {"key": key, "model": getattr(model, "name", None), **record})
    return key


def _log_build(key: str, seconds: float, nbytes: int, memory: dict[str, Any]) -> None:
    _log_record("builds", {"key": key, "seconds": round(seconds, 4), "nbytes": nbytes, **memory})


def _log_record(kind: str, fields: dict[str, Any]) -> None:
    """Append ``fields`` (with pid, host and time) to ``<kind>-<host>-<pid>.jsonl`` in the
    ``SPARK_KERAS_BUILD_LOG`` folder, if one is set."""
    folder = os.environ.get("SPARK_KERAS_BUILD_LOG")
    if not folder:
        return
    record = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time(), **fields}
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{kind}-{record['host']}-{record['pid']}.jsonl")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:  # observability must never break scoring
        logger.warning("cannot write build log in %s: %s", folder, exc)


def read_build_log(folder: str, kind: str = "builds") -> list[dict[str, Any]]:
    """All records of ``kind`` written under ``folder`` (see ``SPARK_KERAS_BUILD_LOG``):
    ``"builds"``, one per model build, or ``"call-rows"``, one per call size a model was
    held to after a call ran out of memory."""
    records = []
    if os.path.isdir(folder):
        for name in sorted(os.listdir(folder)):
            if name.startswith(f"{kind}-") and name.endswith(".jsonl"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    records += [json.loads(line) for line in f if line.strip()]
    return records


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


model_cache = ModelCache(
    max_entries=_env_int("SPARK_KERAS_CACHE_MAX_ENTRIES", DEFAULT_MAX_ENTRIES),
    max_bytes=_env_int("SPARK_KERAS_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES),
    entries_chosen=bool(os.environ.get("SPARK_KERAS_CACHE_MAX_ENTRIES")),
)


def cache_info() -> dict[str, Any]:
    """This process's model cache statistics.

    Returns:
        A dict: builds (total and by key), hits, evictions, entries, bytes, seconds
        spent building, limits (``max_entries_for``: why a KeyedModels task raised the
        default entry limit, else None), the process id, and per entry (``memory_by_key``)
        whether its weights are shared with other processes (``shared``), how many
        weight bytes are shared and private to this process, and, for a model built on
        its own copy because the host's shared payload file could not be written (a
        full or read-only disk), why (``shared_fallback``); and per entry
        (``placement_by_key``) where a Spark worker built it: ``device`` (TensorFlow's,
        ``CPU:0`` or ``GPU:<i>``), ``requested_device`` and ``gpu_address`` (the GPU
        Spark assigned the task, if any), ``task_cpus`` and TensorFlow's
        ``intra_op_threads`` / ``inter_op_threads`` (0: TensorFlow's default). A model
        built for another GPU has its own entry, keyed ``<key>@GPU:<i>``. The build log
        records the same fields. ``call_rows_by_key``: per cached model whose calls ran
        out of memory, the most rows per call it is held to since (shape of a row's
        inputs -> rows), for this process's life; the build log's ``call-rows`` records
        say the same.
    """
    return model_cache.info()


def configure_cache(*, max_entries: int | None = None, max_bytes: int | None = None) -> None:
    """Change this process's cache limits, evicting at once if it is over them.

    Args:
        max_entries: the most models kept (at least 1; default 4, or
            ``SPARK_KERAS_CACHE_MAX_ENTRIES``; a KeyedModels task raises the default to
            its number of keys, at most 64, unless a limit was chosen); None keeps the
            current limit.
        max_bytes: the most weight bytes kept (default 8 GiB, or
            ``SPARK_KERAS_CACHE_MAX_BYTES``); None keeps the current limit.
    """
    model_cache.configure(max_entries=max_entries, max_bytes=max_bytes)
