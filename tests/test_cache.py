"""The per-process model cache: one build per key under concurrency, LRU bounds."""

from __future__ import annotations

import threading
import time

from spark_keras.cache import ModelCache


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
