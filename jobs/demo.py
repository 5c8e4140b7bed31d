"""`make demo`: train a small model on real data, score it with Spark, report accuracy.

1. Trains a Keras MLP on scikit-learn's bundled handwritten digits (1,797 8x8 images).
2. Saves it as a .keras file and writes the held-out digits as parquet (one array column,
   plus the label), replicated to make scoring measurable.
3. Runs jobs/score.py through spark-submit on local Spark with conf/spark-defaults.conf.
4. Reads the scored parquet, prints accuracy and throughput.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "demo-out")
REPLICATE = 40  # 360 test images x 40 = 14,400 rows


def train(model_path: str, data_path: str) -> float:
    from spark_keras.quiet import quiet_tensorflow_startup

    with quiet_tensorflow_startup():  # TensorFlow's start-up lines that the log level hides
        import keras
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2,
                                                        random_state=0, stratify=digits.target)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], name="digits_mlp")
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=40, batch_size=64, verbose=0)
    _, local_acc = model.evaluate(x_test, y_test, verbose=0)
    model.save(model_path)
    rows = pd.DataFrame({
        "id": np.arange(len(x_test) * REPLICATE),
        "pixels": list(np.tile(x_test, (REPLICATE, 1))),
        "label": np.tile(y_test, REPLICATE),
    })
    rows.to_parquet(data_path, index=False)
    print(f"trained digits_mlp on {len(x_train)} images; held-out accuracy in Keras: {local_acc:.4f}")
    return float(local_acc)


def main() -> int:
    # TensorFlow's native INFO and WARNING lines off, here and (inherited through
    # spark-submit, and spark.executorEnv in conf/spark-defaults.conf) in the job
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    model_path = os.path.join(OUT, "digits.keras")
    data_path = os.path.join(OUT, "digits.parquet")
    scored_path = os.path.join(OUT, "scored.parquet")
    train(model_path, data_path)

    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [spark_submit, "--master", "local[2]",
           "--properties-file", os.path.join(ROOT, "conf", "spark-defaults.conf"),
           os.path.join(ROOT, "jobs", "score.py"),
           "--model", model_path, "--input", data_path, "--output", scored_path,
           "--features", "pixels", "--batch-size", "1024"]
    print("running:", " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd))
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    summary = [line for line in proc.stdout.splitlines() if line.startswith("SCORED")]
    if proc.returncode != 0 or not summary:
        sys.stderr.write(proc.stderr[-4000:])
        print(f"demo failed: spark-submit exited {proc.returncode}", file=sys.stderr)
        return 1
    print(summary[0])

    import numpy as np
    import pandas as pd

    scored = pd.read_parquet(scored_path)
    predicted = np.stack(scored["prediction"].to_numpy()).argmax(axis=1)
    accuracy = float((predicted == scored["label"].to_numpy()).mean())
    print(f"Spark scored {len(scored):,} rows; accuracy {accuracy:.4f}; "
          f"spark-submit wall time {wall:.1f}s "
          "(includes JVM start, and TensorFlow imported once by the workers' daemon)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
