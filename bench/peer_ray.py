"""Ray Data's idiomatic scoring for :mod:`bench.peers_bench` and :mod:`bench.peers_text`:
``read_images`` (PIL decode in Ray tasks) or ``read_parquet`` (a string column) +
``map_batches`` with a class (an actor pool of :data:`bench.peer_runner.ACTORS` actors of
``num_cpus=0.5``: on 2 CPUs, two actors of one CPU leave none for the read tasks and the
run stalls, ray#44687), calls of the bench's batch size. Each run is a new execution: Ray
Data starts its actor pool, and each actor loads the model, in every run (as a user's job
does).

``python -m bench.peer_ray SOURCE MODEL OUT BATCH`` (the protocol: :mod:`bench.peer_runner`)."""

from __future__ import annotations

import os
import sys

import numpy as np

from bench.peer_runner import ACTORS, THREADS, compiled, is_text, serve


class Predict:
    """One actor: the model, called on each batch's ``column`` (decoded images or strings),
    the rows named by their ``key``."""

    def __init__(self, model_path: str, column: str, key: str) -> None:
        self.call, self.column, self.key = compiled(model_path), column, key

    def __call__(self, batch: dict) -> dict:
        return {"name": batch[self.key], "prediction": self.call(batch[self.column])}


def main(source: str, model_path: str, out: str, batch_size: str) -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": dict(THREADS)})
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False

    def run() -> tuple[list[str], np.ndarray]:
        if is_text(source):
            ds, column, key = ray.data.read_parquet(source), "text", "id"
        else:
            ds, column, key = ray.data.read_images(source, mode="RGB", include_paths=True), "image", "path"
        ds = ds.map_batches(Predict, fn_constructor_args=(model_path, column, key), batch_size=int(batch_size),
                            compute=ray.data.ActorPoolStrategy(size=ACTORS), num_cpus=0.5)
        names, predictions = [], []
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            names += [os.path.basename(str(n)) for n in batch["name"]]
            predictions.append(batch["prediction"])
        return names, np.concatenate(predictions)

    serve(f"Ray {ray.__version__}", run, out)
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:5])
