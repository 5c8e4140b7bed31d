"""The benchmark code runs end to end at tiny sizes (so it cannot rot)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import REPO_ROOT


def test_bench_quick_runs_and_prints_tables():
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "loads speed-up" in out and "MLP 90MB" in out
    for method in ("predict_batch_udf", "closure pandas_udf", "BroadcastModel.predict_udf",
                   "BroadcastModel.transform", "identity mapInArrow", "raw model (1 process)"):
        assert method in out
    for variant in ("array", "scalars", "vector"):
        assert re.search(rf"\|\s+{variant} \|", out), variant
    assert "CNN transform / ceiling" in out and "peak worker RSS" in out
