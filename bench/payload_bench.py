"""Rebuild speed: Keras's own pickle path against the spark_keras payload (from bytes,
and from a payload file with shared weights, as executors load it), side by side."""

from __future__ import annotations

import gc
import os
import pickle
import statistics
import tempfile
import time
from typing import Callable

import spark_keras as sk
from spark_keras import flavour

keras = flavour.current().module  # Keras 3, or tf-keras under TF_USE_LEGACY_KERAS=1


def mlp_90mb():
    # 4096*2048 + 2048*4096 + 4096*2048 float32 ~ 100 MB -> trimmed to ~90 MB
    return keras.Sequential([
        keras.Input((2048,)),
        keras.layers.Dense(4096, activation="relu"),
        keras.layers.Dense(3584, activation="relu"),
        keras.layers.Dense(1024),
    ], name="mlp_90mb")


MODELS: dict[str, Callable[[], object]] = {
    "ResNet50": lambda: keras.applications.ResNet50(weights=None),
    "VGG16": lambda: keras.applications.VGG16(weights=None),
    "MLP 90MB": mlp_90mb,
}


def _best(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
    return min(times), statistics.median(times)


def run(repeats: int = 3, names: list[str] | None = None) -> list[dict]:
    rows = []
    for name, build in MODELS.items():
        if names and name not in names:
            continue
        model = build()
        size_mb = sum(w.numpy().nbytes for w in model.weights) / 2**20
        pickled = pickle.dumps(model)
        payload = sk.dumps(model)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.skp")
            with open(path, "wb") as f:  # written once: its pages stay in the page cache
                f.write(payload)
            # alternate the paths so machine noise hits them alike
            pk_load, sk_load, file_load = [], [], []
            # (each lambda binds what it reads: the loop deletes them after its row)
            for _ in range(repeats):
                pk_load.append(_best(lambda p=pickled: pickle.loads(p), 1)[0])
                sk_load.append(_best(lambda p=payload: sk.loads(p), 1)[0])
                file_load.append(_best(lambda: sk.load(path, share_weights=True), 1)[0])
        pk_dump = _best(lambda m=model: pickle.dumps(m), 1)[0]
        sk_dump = _best(lambda m=model: sk.dumps(m), 1)[0]
        rows.append({
            "model": name, "weights MB": size_mb,
            "pickle MB": len(pickled) / 2**20, "payload MB": len(payload) / 2**20,
            "pickle dumps s": pk_dump, "payload dumps s": sk_dump,
            "pickle loads s": min(pk_load), "payload loads s": min(sk_load),
            "file load s": min(file_load),
            "loads speed-up": min(pk_load) / min(sk_load),
            "file load speed-up": min(pk_load) / min(file_load),
        })
        del model, pickled, payload
        keras.backend.clear_session()
    return rows
