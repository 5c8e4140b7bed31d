"""``python -m spark_keras.jobs.score``: the score job (:mod:`.main`)."""

import sys

from spark_keras.jobs.score.main import main

sys.exit(main())
