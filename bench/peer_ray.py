"""Ray Data's idiomatic image scoring for :mod:`bench.peers_bench`: ``read_images`` (PIL
decode in Ray tasks) + ``map_batches`` with a class (an actor pool of
:data:`bench.peer_runner.ACTORS` actors of ``num_cpus=0.5``: on 2 CPUs, two actors of one
CPU leave none for the read tasks and the run stalls, ray#44687), calls of
:data:`bench.peer_runner.BATCH_SIZE` rows. Each run is a new execution: Ray Data starts its
actor pool, and each actor loads the model, in every run (as a user's job does).

``python -m bench.peer_ray FOLDER MODEL OUT`` (the protocol: :mod:`bench.peer_runner`)."""

from __future__ import annotations

import os
import sys

import numpy as np

from bench.peer_runner import ACTORS, BATCH_SIZE, THREADS, compiled, serve


class Predict:
    """One actor: the model, called on each batch of decoded images."""

    def __init__(self, model_path: str) -> None:
        self.call = compiled(model_path)

    def __call__(self, batch: dict) -> dict:
        return {"path": batch["path"], "prediction": self.call(np.asarray(batch["image"], np.float32))}


def main(folder: str, model_path: str, out: str) -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": dict(THREADS)})
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False

    def run() -> tuple[list[str], np.ndarray]:
        ds = (ray.data.read_images(folder, mode="RGB", include_paths=True)
              .map_batches(Predict, fn_constructor_args=(model_path,), batch_size=BATCH_SIZE,
                           compute=ray.data.ActorPoolStrategy(size=ACTORS), num_cpus=0.5))
        names, predictions = [], []
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            names += [os.path.basename(p) for p in batch["path"]]
            predictions.append(batch["prediction"])
        return names, np.concatenate(predictions)

    serve(f"Ray {ray.__version__}", run, out)
    ray.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
