"""GPU placement on a real GPU cluster, for a maintainer who has one (never run here: the
development machine has no GPU).

    spark-submit --master <master> \\
      --conf spark.executor.resource.gpu.amount=<GPUs per executor> \\
      --conf spark.task.resource.gpu.amount=1 \\
      --conf spark.executor.resource.gpu.discoveryScript=$SPARK_HOME/examples/src/main/scripts/getGpusResources.sh \\
      bench/gpu_placement.py [--rows 200000] [--partitions 32]

(standalone workers also need ``spark.worker.resource.gpu.amount`` and
``spark.worker.resource.gpu.discoveryScript``). Every task scores its partition with
``BroadcastModel.predict_partition`` and reports the GPU Spark assigned it, the device its
model was built on (``cache_info()``), the device TensorFlow put the model's first weight
on, and its rows per second. The job fails if any task's model is not on the TensorFlow
device of its assigned GPU; it prints the throughput per (host, GPU).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections import defaultdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_placement.py")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--features", type=int, default=512)
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    from pyspark.sql import SparkSession

    import spark_keras as sk

    spark = SparkSession.builder.appName("spark-keras-gpu-placement").getOrCreate()
    features = args.features
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(2048, activation="relu"),
                              keras.layers.Dense(2048, activation="relu"), keras.layers.Dense(16)])
    bm = sk.BroadcastModel(spark, model)
    per_partition = max(1, args.rows // args.partitions)

    def task(index, _rows):
        from pyspark import TaskContext

        from spark_keras.executor import resources

        rng = np.random.default_rng(index)
        x = rng.standard_normal((per_partition, features)).astype("float32")
        started = time.perf_counter()
        n = sum(1 for _ in bm.predict_partition(x, batch_size=4096))
        seconds = time.perf_counter() - started
        placement = resources.task_placement()
        built = sk.cache_info()["placement_by_key"][bm.key + placement.key_suffix]
        weight_device = bm.value.weights[0].value.device
        gpus = TaskContext.get().resources().get("gpu")
        yield {"host": socket.gethostname(), "pid": os.getpid(),
               "address": gpus.addresses[0] if gpus else None, "built": built,
               "weight_device": weight_device, "rows": n, "seconds": seconds}

    reports = spark.sparkContext.parallelize(range(args.partitions), args.partitions) \
        .mapPartitionsWithIndex(task).collect()
    wrong = [r for r in reports if r["built"]["device"] == "CPU:0"
             or not r["weight_device"].endswith(r["built"]["device"])]
    by_gpu: dict[tuple, list[dict]] = defaultdict(list)
    for r in reports:
        by_gpu[(r["host"], r["address"], r["built"]["device"])].append(r)
    print(f"\n| {'host':<20} | {'Spark GPU':>9} | {'TF device':>9} | {'tasks':>5} | {'workers':>7} | {'rows/s':>10} |")
    print(f"|{'-' * 22}|{'-' * 10}:|{'-' * 10}:|{'-' * 6}:|{'-' * 8}:|{'-' * 11}:|")
    for (host, address, device), rs in sorted(by_gpu.items(), key=str):
        rate = sum(r["rows"] for r in rs) / sum(r["seconds"] for r in rs)
        print(f"| {host:<20} | {address!s:>9} | {device:>9} | {len(rs):>5} | "
              f"{len({r['pid'] for r in rs}):>7} | {rate:>10.0f} |")
    spark.stop()
    if wrong:
        print(f"\n{len(wrong)} task(s) with a model off their assigned GPU:", *wrong[:5], sep="\n")
        return 1
    print("\nevery task's model was on the TensorFlow device of its assigned GPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
