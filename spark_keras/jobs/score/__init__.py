"""The score job: a parquet or CSV dataset scored by a Keras model on Spark.

:mod:`.main` parses the options and runs; :mod:`.session` starts Spark; :mod:`.checks`
refuses bad options and paths; :mod:`.run` plans and scores; :mod:`.outputs` writes; a
``--resume`` run's :mod:`.manifest` fixes its groups and :mod:`.commits` keeps its commit
log; :mod:`.lease` keeps other jobs out of an output; :mod:`.progress` reports;
:mod:`.errors` maps failures to exit codes.

Trust: folders the job reads back (the output, its commit log, staging folders, the
quarantine, leases) may have been made by another user of the host: they are checked
(owner, mode) before anything is read from them, and names read from them never lead
outside their root.
"""

from spark_keras.jobs.score.main import main

__all__ = ["main"]
