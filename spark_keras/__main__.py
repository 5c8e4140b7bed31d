"""``python -m spark_keras``: the ``spark-keras`` command (:mod:`spark_keras.cli`)."""

import sys

from spark_keras.cli import main

if __name__ == "__main__":
    sys.exit(main())
