"""The per-process model cache: one build per key under concurrency, LRU bounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from spark_keras.cache import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, ModelCache
from tests.conftest import REPO_ROOT


def test_concurrent_requests_build_once():
    cache = ModelCache(max_entries=4, max_bytes=10**9)
    builds = []
    start = threading.Barrier(8)

    def build():
        builds.append(threading.get_ident())
        time.sleep(0.2)  # a slow rebuild: every other thread arrives while it runs
        return object(), 10

    results = []

    def ask():
        start.wait()
        results.append(cache.get_or_build("m", build).value)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len({id(r) for r in results}) == 1
    info = cache.info()
    assert info["builds_by_key"] == {"m": 1} and info["hits"] == 7


def test_different_keys_build_separately():
    cache = ModelCache()
    a = cache.get_or_build("a", lambda: ("model a", 1)).value
    b = cache.get_or_build("b", lambda: ("model b", 1)).value
    assert (a, b) == ("model a", "model b")


def test_lru_by_entries_and_bytes():
    cache = ModelCache(max_entries=2, max_bytes=100)
    for key in ("a", "b"):
        cache.get_or_build(key, lambda key=key: (key, 10))
    cache.get_or_build("a", lambda: ("rebuilt", 10))  # a hit: "a" is now most recent
    cache.get_or_build("c", lambda: ("c", 10))        # evicts "b", the least recent
    assert cache.info()["keys"] == ["a", "c"] and cache.info()["evictions"] == 1
    cache.get_or_build("big", lambda: ("big", 95))    # over the byte limit: evict others
    info = cache.info()
    assert info["keys"] == ["big"] and info["bytes"] == 95 and info["evictions"] == 3
    cache.get_or_build("huge", lambda: ("huge", 500))  # one model over the limit still serves
    assert cache.info()["keys"] == ["huge"]
    cache.configure(max_entries=1, max_bytes=10**6)
    assert cache.drop("huge") and not cache.drop("huge")
    assert cache.info()["entries"] == 0


def test_configure_shrinking_evicts_least_recent_at_once():
    cache = ModelCache(max_entries=4, max_bytes=1000)
    for key, nbytes in (("a", 10), ("b", 20), ("c", 30), ("d", 40)):
        cache.get_or_build(key, lambda key=key, nbytes=nbytes: (key, nbytes))
    cache.get_or_build("b", lambda: ("rebuilt", 20))
    cache.get_or_build("a", lambda: ("rebuilt", 10))  # recency, oldest first: c, d, b, a
    cache.configure(max_entries=2)
    info = cache.info()
    assert info["keys"] == ["b", "a"] and info["evictions"] == 2 and info["bytes"] == 30
    cache.configure(max_bytes=15)
    info = cache.info()
    assert info["keys"] == ["a"] and info["evictions"] == 3 and info["bytes"] == 10
    assert (info["max_entries"], info["max_bytes"]) == (2, 15)
    # what was evicted is gone: asking again builds it
    assert cache.get_or_build("c", lambda: ("c again", 5)).value == "c again"
    assert cache.info()["builds_by_key"] == {"a": 1, "b": 1, "c": 2, "d": 1}


_ENV_PROBE = """
import json
import spark_keras as sk
from spark_keras.cache import model_cache
limits = sk.cache_info()
for key in ("a", "b", "c"):
    model_cache.get_or_build(key, lambda key=key: (key, 600))
after_bytes = sk.cache_info()
sk.configure_cache(max_entries=1)
print(json.dumps({"limits": limits, "after_bytes": after_bytes, "after_configure": sk.cache_info()}))
"""


def _probe_cache(**env: str) -> dict:
    """cache_info() seen by a fresh process that imports spark_keras with ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_KERAS_CACHE_")}
    proc = subprocess.run([sys.executable, "-c", _ENV_PROBE], env={**clean, **env}, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_limits_from_environment_at_import():
    found = _probe_cache(SPARK_KERAS_CACHE_MAX_BYTES="1000", SPARK_KERAS_CACHE_MAX_ENTRIES="3")
    assert (found["limits"]["max_bytes"], found["limits"]["max_entries"]) == (1000, 3)
    # three 600-byte models under a 1000-byte limit: only the newest stays
    assert found["after_bytes"]["keys"] == ["c"] and found["after_bytes"]["evictions"] == 2
    assert found["after_bytes"]["builds"] == 3
    # configure_cache reconfigures that same process-wide cache
    assert found["after_configure"]["max_entries"] == 1 and found["after_configure"]["keys"] == ["c"]


def test_unset_environment_gives_the_defaults():
    found = _probe_cache()
    assert found["limits"]["max_bytes"] == DEFAULT_MAX_BYTES
    assert found["limits"]["max_entries"] == DEFAULT_MAX_ENTRIES
    assert found["after_bytes"]["keys"] == ["a", "b", "c"] and found["after_bytes"]["evictions"] == 0
    assert found["after_configure"]["keys"] == ["c"] and found["after_configure"]["evictions"] == 2


_FREEZE_PROBE = """
import gc, json, weakref
from spark_keras.cache import ModelCache

class Model:  # a reference cycle, as a Keras model has
    def __init__(self):
        self.me = self

gc.unfreeze()
cache = ModelCache(max_entries=1)
first = weakref.ref(cache.get_or_build("a", lambda: (Model(), 1)).value)
frozen_after_build = gc.get_freeze_count()
cache.get_or_build("b", lambda: (Model(), 1))  # evicts "a"
gc.collect()
evicted_collected = first() is None
second = weakref.ref(cache.get_or_build("b", lambda: (Model(), 1)).value)
cache.drop("b")
gc.collect()
print(json.dumps({"frozen": frozen_after_build, "evicted_collected": evicted_collected,
                  "dropped_collected": second() is None, "tracked": len(gc.get_objects())}))
"""


def _probe_freeze(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SPARK_KERAS_GC_FREEZE", "PYTHON_WORKER_FACTORY_SECRET")}
    proc = subprocess.run([sys.executable, "-c", _FREEZE_PROBE], env={**clean, **env},
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_build_freezes_the_heap_in_spark_workers_and_when_asked():
    for env in ({"PYTHON_WORKER_FACTORY_SECRET": "x"}, {"SPARK_KERAS_GC_FREEZE": "1"}):
        found = _probe_freeze(**env)
        assert found["frozen"] > 1000, (env, found)
        # a model that leaves the cache is still reclaimed, though it was frozen
        assert found["evicted_collected"] and found["dropped_collected"], (env, found)


def test_nothing_is_frozen_elsewhere_or_when_turned_off():
    for env in ({}, {"PYTHON_WORKER_FACTORY_SECRET": "x", "SPARK_KERAS_GC_FREEZE": "0"}):
        found = _probe_freeze(**env)
        assert found["frozen"] == 0, (env, found)
        assert found["evicted_collected"] and found["dropped_collected"], (env, found)


_FORKED_PROBE = """
import gc, json, os, weakref
from spark_keras import heap
from spark_keras.cache import ModelCache

def private_dirty_kb():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty:"))

class Model:  # a reference cycle, as a Keras model has
    def __init__(self):
        self.me = self

parents = [[i] for i in range(400_000)]  # the parent's heap (a daemon's): ~30 MB, tracked
heap.freeze()
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # a worker: builds a model, then drops it
    inherited = gc.get_freeze_count()
    cache = ModelCache()
    ref = weakref.ref(cache.get_or_build("a", lambda: (Model(), 1)).value)
    before = private_dirty_kb()
    cache.drop("a")
    found = {"inherited": inherited, "growth_kb": private_dirty_kb() - before,
             "dropped_collected": ref() is None, "frozen": gc.get_freeze_count()}
    os.write(write, json.dumps(found).encode())
    os._exit(0)
os.close(write)
print(os.read(read, 10_000).decode())
os.waitpid(pid, 0)
"""


def test_a_forked_child_reclaims_its_models_without_copying_its_parents_frozen_pages():
    """A child of a process that froze (a daemon's worker) drops a model: the model is
    collected, but the inherited frozen objects are not unfrozen and walked, which would
    write to (and copy) every page holding one: 30 MB here before the fix."""
    clean = {k: v for k, v in os.environ.items() if k != "PYTHON_WORKER_FACTORY_SECRET"}
    proc = subprocess.run([sys.executable, "-c", _FORKED_PROBE], cwd=REPO_ROOT, timeout=120,
                          env={**clean, "SPARK_KERAS_GC_FREEZE": "1"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["inherited"] > 400_000 and found["dropped_collected"], found
    assert found["growth_kb"] < 5 * 1024, found  # ~0.1 MB; 30 MB when it unfroze them
    assert found["frozen"] == found["inherited"], found  # the child froze nothing of its own


def test_make_room_raises_the_default_entry_limit_only():
    """A KeyedModels task makes room for its keys' models (each then built once per
    process, not once per batch): the default limit rises, up to MAX_ROOM; a limit chosen
    in the environment or with configure stays; max_bytes still evicts."""
    from spark_keras.cache import MAX_ROOM

    cache = ModelCache(max_entries=4, max_bytes=10**9)
    cache.make_room(12, "KeyedModels of 12 keys")
    for _ in range(3):  # rows in random key order: every batch uses every model
        for key in range(12):
            cache.get_or_build(f"k{key}", lambda: (object(), 10))
    info = cache.info()
    assert (info["builds"], info["evictions"], info["entries"]) == (12, 0, 12), info
    assert (info["max_entries"], info["max_entries_for"]) == (12, "KeyedModels of 12 keys")
    cache.make_room(1000, "KeyedModels of 1000 keys")
    assert cache.max_entries == MAX_ROOM
    cache.configure(max_entries=2)  # chosen: evicts, and make_room leaves it
    cache.make_room(12, "KeyedModels of 12 keys")
    assert (cache.max_entries, cache.info()["max_entries_for"], cache.info()["entries"]) == (2, None, 2)
    chosen = ModelCache(max_entries=3, entries_chosen=True)  # SPARK_KERAS_CACHE_MAX_ENTRIES
    chosen.make_room(12, "KeyedModels of 12 keys")
    assert chosen.max_entries == 3
    tight = ModelCache(max_entries=4, max_bytes=25)
    tight.make_room(12, "KeyedModels of 12 keys")
    for key in range(5):
        tight.get_or_build(f"k{key}", lambda: (object(), 10))
    assert tight.info()["entries"] == 2  # 25 bytes hold two 10-byte models
