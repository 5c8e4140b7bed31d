"""The score job's Spark session: classic (its settings for the executors) or Spark
Connect (a local server started here takes this process's environment)."""

from __future__ import annotations

import os
from typing import Any

from spark_keras._deps import require

__all__ = ["APP_NAME", "DAEMON_MODULE", "classic_session", "connect_session"]

APP_NAME = "spark-keras-score"
DAEMON_MODULE = "spark_keras.spark.daemon"
LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"


def classic_session(master: str | None) -> Any:
    """A classic session on ``master`` (default: spark-submit's, else ``local[*]``). What
    spark-submit's configuration leaves unset is set for the executors: the preloading
    daemon, the driver's Keras flavour and TensorFlow log level."""
    require("pyspark", "the score job")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(APP_NAME)
    SparkContext._ensure_initialized()  # the JVM, so SparkConf() sees spark-submit's settings
    conf = SparkConf()
    if master or not conf.get("spark.master", None):  # spark-submit --master wins
        builder = builder.master(master or "local[*]")
    if conf.get("spark.python.daemon.module", None) is None:
        # workers fork from a daemon that imported TensorFlow and Keras once
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
    if conf.get("spark.executorEnv.TF_USE_LEGACY_KERAS", None) is None:
        # executors must run the driver's Keras flavour (Keras 3 or legacy tf-keras)
        legacy = os.environ.get("TF_USE_LEGACY_KERAS", "0")
        builder = builder.config("spark.executorEnv.TF_USE_LEGACY_KERAS", legacy)
    if conf.get("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", None) is None:
        # executors log TensorFlow's native lines as the driver does
        builder = builder.config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL",
                                 os.environ.get(LOG_LEVEL_ENV, "2"))
    return builder.getOrCreate()


def is_local(remote: str) -> bool:
    """``local``, ``local[N]``...: pyspark starts the Connect server in this process."""
    return remote.startswith("local")


def connect_session(remote: str) -> Any:
    """A Spark Connect session. Connect ignores ``spark.executorEnv.*``: a local server's
    Python workers get the environment this process has when the server starts."""
    require("pyspark.sql.connect.session", "the score job on Spark Connect", "connect")
    from pyspark.sql import SparkSession

    if is_local(remote):
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")  # the driver's Keras flavour
    builder = SparkSession.builder.remote(remote).appName(APP_NAME)
    if is_local(remote):  # a server started here takes our settings; a remote one has its own
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
    return builder.getOrCreate()
