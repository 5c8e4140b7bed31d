"""Score a parquet or CSV dataset with a Keras model on Spark (classic or Spark Connect).

A wrapper of the installed job, :mod:`spark_keras.jobs.score` (its docstring and
``--help`` give the options; ``spark-keras score`` and ``python -m spark_keras score`` run
the same code):

    spark-submit --properties-file conf/spark-defaults.conf jobs/score.py \\
        --model model.keras --input data.parquet --output scored.parquet --features features

    python jobs/score.py --remote sc://host:15002 --model ... --input ... --output ...
"""

from __future__ import annotations

import sys

from spark_keras.jobs.score import main

if __name__ == "__main__":
    sys.exit(main())
