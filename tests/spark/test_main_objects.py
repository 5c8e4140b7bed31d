"""Custom layers defined only in the driver's __main__ reach executors with the payload."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import run_script

DRIVER = textwrap.dedent('''
    import sys, numpy as np, keras
    from pyspark.sql import SparkSession
    import spark_keras as sk

    class Squash(keras.layers.Layer):            # only in __main__: not importable on workers
        def __init__(self, power=2.0, **kwargs):
            super().__init__(**kwargs)
            self.power = power
        def build(self, shape):
            self.scale = self.add_weight(shape=(shape[-1],), initializer="random_normal")
        def call(self, x):
            return keras.ops.tanh(x * self.scale) ** self.power
        def get_config(self):
            return {**super().get_config(), "power": self.power}

    model = keras.Sequential([keras.Input((4,)), Squash(3.0), keras.layers.Dense(2)])
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.pyspark.python", sys.executable).getOrCreate())
    x = np.random.default_rng(0).standard_normal((40, 4)).astype("float32")
    # one partition: one Python worker unpickles the classes (a second did the same, at
    # the cost of its TensorFlow import)
    df = spark.createDataFrame([(i, x[i].tolist()) for i in range(40)], "id long, f array<float>").coalesce(1)
    bm = sk.BroadcastModel(spark, model)      # no custom_objects: found in the model
    out = bm.transform(df, "f").toPandas().sort_values("id")
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)

    def parse(batch):                         # a preprocess function from __main__ too
        return np.stack([np.array(t.split(","), "float32") for t in batch["csv"]])

    text = spark.createDataFrame([(i, ",".join(map(str, x[i].tolist()))) for i in range(40)],
                                 "id long, csv string").coalesce(1)
    pre = sk.BroadcastModel(spark, model, preprocess=parse)
    out = pre.transform(text, "csv").toPandas().sort_values("id")
    np.testing.assert_allclose(np.stack(out["prediction"].to_numpy()), np.asarray(model(x)), atol=1e-5)
    print("MAIN-OBJECTS-OK")
    spark.stop()
''')


@pytest.mark.slow  # a whole job or driver of its own, or a cluster: 40-50 s
def test_custom_layer_from_main_works_on_executors(tmp_path):
    run_script(tmp_path, DRIVER, "MAIN-OBJECTS-OK")
