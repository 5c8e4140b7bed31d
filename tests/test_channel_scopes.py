"""What a holder of one handle's token can do over the driver's channel (issue 51, items
5, 7 and 8): a real local[2] driver, real handles, real TLS requests.

* Tokens: each handle carries a token for its own scope (``model:<name>``); it reads
  neither another handle's payloads nor pins another's versions (403).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

import spark_keras as sk
from spark_keras.spark.version_server import ask, download

from . import models


def _frame(spark, n: int = 40, n_features: int = 4):
    x = np.random.default_rng(0).standard_normal((n, n_features), dtype=np.float32)
    return spark.createDataFrame([(i, x[i].tolist()) for i in range(n)],
                                 "id long, features array<float>")


# --- tokens (items 5 and 8) -----------------------------------------------------------


def test_a_handles_token_reads_its_own_payload_and_nothing_of_another_handles(spark):
    """Handles A and B, both served from the driver's files: A's token (what A's plans
    carry to every executor) downloads A's payload, and is refused (403) B's payload and
    B's versions; each handle's own tasks score with their own tokens."""
    a = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8, name="a"), ship="driver")
    b = sk.BroadcastModel(spark, models.mlp(n_features=4, hidden=8, name="b"), ship="driver")
    try:
        assert a._versions.token != b._versions.token
        out = io.BytesIO()
        assert download(a._versions, a._name, 1, out) > 0
        with open(a._server.payload_path(a._name, 1), "rb") as f:
            assert out.getvalue() == f.read()
        with pytest.raises(sk.SparkKerasError, match="refused /payload: 403"):
            download(a._versions, b._name, 1, io.BytesIO())
        with pytest.raises(sk.SparkKerasError, match="refused /resolve: 403"):
            ask(a._versions, b._name, "sql:1")
        assert not b._schedule.is_pinned("sql:1")
        for handle in (a, b):  # the workers' downloads and requests, each with its token
            scored = handle.transform(_frame(spark), "features", version_col="v").toPandas()
            assert len(scored) == 40 and set(scored.v) == {"1"}
    finally:
        a.destroy()
        b.destroy()
