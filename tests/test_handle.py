"""The extension contract of ModelHandle: a minimal front-end of its own (the payload held
in memory) scores through the engine every front-end uses, on the driver and as a
worker's unpickled copy that rebuilds the model once."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.handle import ModelHandle
from spark_keras.inference import columns as cols
from spark_keras.inference.engine import score
from spark_keras.payload.shipment import Shipment
from tests import models


class InMemoryModel(ModelHandle):
    """A front-end written against the public contract only: the shipment travels inside
    the handle (the driver's model does not), and a worker rebuilds from it."""

    def __init__(self, model=None, *, shipment: Shipment | None = None, key: str | None = None,
                 signature=None, preprocess=None) -> None:
        shipment = shipment or Shipment.of(model)
        super().__init__(key or self.new_key(model, "memory-"), len(shipment.payload),
                         model=model, signature=signature, preprocess=preprocess)
        self.shipment, self.released = shipment, False

    def build_model(self) -> tuple:
        return self.shipment.build()

    def check_usable(self) -> None:
        if self.released:
            raise sk.SparkKerasError(f"{self.key} was released")

    def __reduce__(self) -> tuple:  # what a task carries: no Keras object
        return (_unpickle, (self.shipment, self.key, self.signature, self.preprocess))


def _unpickle(shipment: Shipment, key: str, signature, preprocess) -> InMemoryModel:
    return InMemoryModel(shipment=shipment, key=key, signature=signature, preprocess=preprocess)


def test_a_custom_handle_scores_through_the_engine():
    model = models.mlp(n_features=4, hidden=8, outputs=2)
    x = np.random.default_rng(5).standard_normal((10, 4)).astype("float32")
    x[3, 1] = np.nan
    want = np.asarray(model(x))
    driver = InMemoryModel(model)
    worker = pickle.loads(pickle.dumps(driver))  # as a task receives it: no model yet
    assert worker.value is not model and driver.value is model
    for handle in (driver, worker):
        scored = score(handle, cols.from_numpy(x, handle.signature), batch_size=4,
                       on_invalid="null")
        assert scored.invalid.tolist() == [i == 3 for i in range(10)]
        np.testing.assert_allclose(scored.outputs[0], np.delete(want, 3, axis=0), atol=1e-6)
    score(worker, cols.from_numpy(x[:2], worker.signature), batch_size=4)
    assert sk.cache_info()["builds_by_key"][worker.key] == 1  # built once, then cached
    assert worker.signature == driver.signature and worker.nbytes == driver.nbytes > 0
    worker.released = True
    with pytest.raises(sk.SparkKerasError, match="was released"):
        score(worker, cols.from_numpy(x, worker.signature), batch_size=4)


def test_a_handle_without_build_model_names_its_class():
    class Incomplete(ModelHandle):
        pass

    with pytest.raises(NotImplementedError, match="Incomplete implements build_model"):
        _ = Incomplete("k", 1).value
