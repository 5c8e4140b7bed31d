"""Releasing models on Spark Connect, where handles of different transports meet: a
worker using a session-artifact handle still removes the executor files of a released
model read from a URI (StorageTransport)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("grpc")
pytest.importorskip("zstandard")

import spark_keras as sk  # noqa: E402

from . import models  # noqa: E402

pytestmark = pytest.mark.timeout(600)


def _executor_files(connect, handle=None) -> dict[str, list[str]]:
    """The payload folder's files of each executor the tasks ran on, after ``handle``
    (if any) released the stale models in each task's worker."""
    import pyarrow as pa

    def report(batches):
        from spark_keras.spark.transport import executor_folder

        if handle is not None:
            handle.release_stale()  # a live handle carries the released keys
        for _ in batches:
            pass
        folder = executor_folder()
        names = sorted(os.listdir(folder)) if folder and os.path.isdir(folder) else []
        yield pa.RecordBatch.from_arrays([pa.array([json.dumps([folder, names])])], names=["s"])

    rows = connect.range(4, numPartitions=4).mapInArrow(report, "s string").collect()
    return dict(json.loads(r.s) for r in rows)


def test_an_artifact_handle_removes_a_released_uri_models_files(connect, tmp_path):
    model = models.mlp(4, 8, 2)
    sk.save(model, tmp_path / "m.skp")
    stored = sk.BroadcastModel(connect, f"file://{tmp_path}/m.skp")
    assert type(stored._transport).__name__ == "StorageTransport"
    df = connect.createDataFrame([(i, [float(i)] * 4) for i in range(8)], "id long, f array<float>")
    assert stored.transform(df, "f").count() == 8
    key = stored.key
    before = _executor_files(connect)
    assert any(f"{key}.skp" in names for names in before.values()), before  # landed there

    stored.destroy()
    other = sk.BroadcastModel(connect, models.mlp(4, 8, 1))
    assert type(other._transport).__name__ == "ArtifactTransport"
    after = _executor_files(connect, other)
    assert set(after) == set(before)
    assert not any(n.startswith(key) for names in after.values() for n in names), after
