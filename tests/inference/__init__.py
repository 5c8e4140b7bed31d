"""The engine: readers, model calls, bad rows, out-of-memory backoff (no Spark)."""
