"""Dask round trips: Keras's own pickling vs ``make_picklable`` vs a ``ship`` handle.

One LocalCluster (2 worker processes, 1 thread each) whose workers preload this module
(``--preload spark_keras.dask`` with ``SPARK_KERAS_PRELOAD``), so Keras's own pickling
finds the registered subclass too. Every path runs the same task: one prediction, a
float back. The paths alternate within each repeat so machine noise hits them alike.
"""

from __future__ import annotations

import gc
import os
import pickle
import time
from typing import Any, Callable

import keras
import numpy as np

import spark_keras as sk
from bench.models import actor_model
from spark_keras.dask import PRELOAD_ENV, ship
from spark_keras.inference import signature_of

MODULE = "bench.dask_bench"  # what the workers preload


@keras.saving.register_keras_serializable(package="sk_bench")
class Tower(keras.Model):
    """A subclassed model with get_config (the Dask story), ~5 MB of weights."""

    def __init__(self, width: int = 1024, depth: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.width, self.depth = width, depth
        self.blocks = [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
        self.head = keras.layers.Dense(10)

    def call(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def get_config(self):
        return {**super().get_config(), "width": self.width, "depth": self.depth}


def _tower() -> keras.Model:
    model = Tower()
    model(np.zeros((1, 256), "float32"))
    return model


MODELS: dict[str, Callable[[], keras.Model]] = {"actor CNN": actor_model, "subclassed Tower": _tower}


def _score(model: Any, x: np.ndarray) -> float:
    return float(np.asarray(model(x)).sum())


def _score_shipped(handle: Any, x: np.ndarray) -> float:
    return _score(handle.value, x)


def _round_trip(client: Any, fn: Callable, arg: Any, x: np.ndarray,
                **kw: Any) -> tuple[float, float]:
    """(seconds for submit + result, the task's value); pure=False: no hashing the model."""
    start = time.perf_counter()
    value = client.submit(fn, arg, x, pure=False, **kw).result()
    return time.perf_counter() - start, value


def _one_repeat(client: Any, model: Any, picklable: Any, x: np.ndarray,
                workers: list[str]) -> dict[str, tuple[float, float]]:
    """Each path once: path -> (seconds, task value). The ship path's first call builds
    on one worker, a call pinned to the other builds there, then both only hit the cache."""
    out = {"keras": _round_trip(client, _score, model, x),
           "payload": _round_trip(client, _score, picklable, x)}
    start = time.perf_counter()
    with ship(client, model) as handle:
        value = client.submit(_score_shipped, handle, x, pure=False, workers=workers[:1]).result()
        out["ship"] = (time.perf_counter() - start, value)
        _round_trip(client, _score_shipped, handle, x, workers=workers[1:])
        out["cached"] = min(_round_trip(client, _score_shipped, handle, x) for _ in range(3))
    return out


def _row(name: str, model: Any, times: dict[str, list[float]]) -> dict:
    best = {path: min(seconds) for path, seconds in times.items()}
    return {
        "model": name,
        "weights MB": sum(w.nbytes for w in model.get_weights()) / 2**20,
        "keras pickle MB": len(pickle.dumps(model)) / 2**20,
        "payload MB": len(sk.dumps(model)) / 2**20,
        "keras s": best["keras"],
        "make_picklable s": best["payload"],
        "ship 1st call s": best["ship"],
        "ship cached s": best["cached"],
        "make_picklable speed-up": best["keras"] / best["payload"],
        "ship cached speed-up": best["keras"] / best["cached"],
    }


def run(repeats: int = 3) -> list[dict]:
    """Seconds per round trip (submit + result) on each path, per model; min over repeats."""
    from distributed import Client, LocalCluster

    env = {PRELOAD_ENV: MODULE, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    rows = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      preload=["spark_keras.dask"], env=env) as cluster, Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"])
        for name, build in MODELS.items():
            model = build()
            shape = signature_of(model).inputs[0].shape
            x = np.random.default_rng(0).standard_normal((1, *shape)).astype("float32")
            expected = _score(model, x)
            picklable = sk.make_picklable(sk.loads(sk.dumps(model)))  # same weights
            times: dict[str, list[float]] = {"keras": [], "payload": [], "ship": [], "cached": []}
            for _ in range(max(1, repeats)):
                gc.collect()
                for path, (seconds, value) in _one_repeat(client, model, picklable, x,
                                                          workers).items():
                    if not np.isclose(value, expected, rtol=1e-4, atol=1e-4):
                        raise AssertionError(f"{name}, {path}: {value} != {expected}")
                    times[path].append(seconds)
            rows.append(_row(name, model, times))
            del model, picklable
            keras.backend.clear_session()
    return rows
