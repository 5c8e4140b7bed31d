"""Daft's idiomatic image scoring for :mod:`bench.peers_bench`: the files' bytes
downloaded and decoded by Daft (Rust) into an ``Image`` column, scored by a class UDF
(``@daft.cls``, :data:`bench.peer_runner.ACTORS` instances at most, a batch method of
:data:`bench.peer_runner.BATCH_SIZE` rows). Daft 0.7 picks where the instances run (it ran
them as threads of this process here: see the bench's notes). Runs in Daft's own venv
(Daft 0.7 needs pyarrow < 26): ``make bench-peers`` makes it.

``python -m bench.peer_daft FOLDER MODEL OUT`` (the protocol: :mod:`bench.peer_runner`)."""

from __future__ import annotations

import os
import sys

import numpy as np

from bench.peer_runner import ACTORS, BATCH_SIZE, compiled, serve


def main(folder: str, model_path: str, out: str) -> None:
    import daft
    from daft import DataType

    @daft.cls(max_concurrency=ACTORS)
    class Predict:
        """One instance: the model, called on each batch of decoded images."""

        def __init__(self, path: str) -> None:
            self.call = compiled(path)

        @daft.method.batch(return_dtype=DataType.tensor(DataType.float32()), batch_size=BATCH_SIZE)
        def __call__(self, images: daft.Series) -> np.ndarray:
            return self.call(np.stack(images.to_pylist()).astype(np.float32))

    predict = Predict(model_path)

    def run() -> tuple[list[str], np.ndarray]:
        df = daft.from_glob_path(os.path.join(folder, "*.png"))
        df = df.with_column("image", df["path"].download().decode_image(mode="RGB"))
        got = df.select(df["path"], predict(df["image"]).alias("prediction")).to_pydict()
        return [os.path.basename(p) for p in got["path"]], np.stack(got["prediction"])

    serve(f"Daft {daft.__version__}", run, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
