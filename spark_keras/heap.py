"""Long-lived objects out of the garbage collector's reach (``gc.freeze``).

TensorFlow and Keras leave about 400,000 objects that the cyclic garbage collector
tracks, and a full collection walks all of them: about 0.2 s of CPU on a 2-core x86_64
machine. PySpark's daemon runs one after every task of a reused Python worker, so every
task paid it (it was most of the time an identity ``mapInArrow`` took in a worker that
had imported TensorFlow). Frozen objects are skipped by every later collection; they are
still freed by reference counting, but a reference cycle among them is reclaimed only
after :func:`refreeze`.

In a Spark Python worker the model cache freezes the heap after each build (TensorFlow
is imported by then), the preloading daemon before it forks (so collections in its
workers do not write to, and copy, the pages they share with it), and a model that leaves
the cache is reclaimed by :func:`refreeze`. Elsewhere (a driver, a notebook, Dask or pool
workers, which collect far less often) nothing is frozen unless
``SPARK_KERAS_GC_FREEZE=1``; ``SPARK_KERAS_GC_FREEZE=0`` turns it off everywhere.

A process forked from one that froze (a worker of the preloading daemon) inherits the
frozen objects, and shares their pages with its parent. It freezes nothing of its own:
Python has no partial unfreeze, and ``gc.unfreeze`` followed by a collection would walk,
and so write to and copy, every inherited object (about 100 MB of a worker's shared
pages). Its own objects (the models it builds) stay in the collector's generations, so a
collection reclaims a dropped model's cycles, and each one walks only what the worker
made since the fork: about 2,400 objects (0.4 ms) with a small MLP built and called,
19,000 (a few ms) with MobileNetV2, against the daemon's 420,000 it skips.
"""

from __future__ import annotations

import gc
import os

ENV = "SPARK_KERAS_GC_FREEZE"

# the process whose gc.freeze made the frozen objects (None: none of ours); a forked
# child inherits the value, which then names its parent
_frozen_by: int | None = None


def enabled() -> bool:
    """Whether freezing is on: ``SPARK_KERAS_GC_FREEZE`` if set (``1``/``0``), else in a
    Spark Python worker or daemon only (the JVM gives those their factory secret)."""
    setting = os.environ.get(ENV, "").strip().lower()
    if setting:
        return setting not in ("0", "false", "no", "off")
    return "PYTHON_WORKER_FACTORY_SECRET" in os.environ


def inherited() -> bool:
    """True in a process forked after its parent froze objects: they are its parent's
    (their pages shared with it), and this process must not unfreeze them."""
    return _frozen_by is not None and _frozen_by != os.getpid() and gc.get_freeze_count() > 0


def freeze(collect: bool = True) -> int:
    """Collect once (unless ``collect`` is False: nothing to collect, as after imports),
    then freeze every object the collector tracks; how many are frozen (0 when turned
    off). In a process whose frozen objects are inherited (:func:`inherited`) nothing
    more is frozen."""
    global _frozen_by
    if not enabled():
        return 0
    if inherited():
        return gc.get_freeze_count()
    if collect:
        gc.collect()
    gc.freeze()
    _frozen_by = os.getpid()
    return gc.get_freeze_count()


def refreeze() -> int:
    """Unfreeze, so that cycles among frozen objects that nothing references any more (a
    model dropped from the cache) are collected, then :func:`freeze` again. In a process
    whose frozen objects are inherited, only collect: its own objects were never frozen,
    and the inherited ones stay frozen (and shared)."""
    if not enabled():
        return 0
    if inherited():
        gc.collect()
        return gc.get_freeze_count()
    gc.unfreeze()
    return freeze()
