"""Daft's idiomatic scoring for :mod:`bench.peers_bench` and :mod:`bench.peers_text`: the
files' bytes downloaded and decoded by Daft (Rust) into an ``Image`` column, or a string
column read by ``read_parquet``, scored by a class UDF (``@daft.cls``,
:data:`bench.peer_runner.ACTORS` instances at most, a batch method of the bench's batch
size). Daft 0.7 picks where the instances run (it ran them as threads of this process here:
see the bench's notes). Runs in Daft's own venv (Daft 0.7 needs pyarrow < 26):
``make bench-peers`` makes it.

``python -m bench.peer_daft SOURCE MODEL OUT BATCH`` (the protocol: :mod:`bench.peer_runner`)."""

from __future__ import annotations

import os
import sys

import numpy as np

from bench.peer_runner import ACTORS, compiled, is_text, serve


def main(source: str, model_path: str, out: str, batch_size: str) -> None:
    import daft
    from daft import DataType

    @daft.cls(max_concurrency=ACTORS)
    class Predict:
        """One instance: the model, called on each batch of decoded images or strings."""

        def __init__(self, path: str) -> None:
            self.call = compiled(path)

        @daft.method.batch(return_dtype=DataType.tensor(DataType.float32()), batch_size=int(batch_size))
        def __call__(self, values: daft.Series) -> np.ndarray:
            return self.call(values.to_pylist())

    predict = Predict(model_path)

    def run() -> tuple[list[str], np.ndarray]:
        if is_text(source):
            df, column, key = daft.read_parquet(source), "text", "id"
        else:
            df, column, key = daft.from_glob_path(os.path.join(source, "*.png")), "image", "path"
            df = df.with_column("image", df["path"].download().decode_image(mode="RGB"))
        got = df.select(df[key], predict(df[column]).alias("prediction")).to_pydict()
        return [os.path.basename(str(n)) for n in got[key]], np.stack(got["prediction"])

    serve(f"Daft {daft.__version__}", run, out)


if __name__ == "__main__":
    main(*sys.argv[1:5])
