"""Modules that Spark daemons and Dask workers preload in tests (SPARK_KERAS_PRELOAD)."""
