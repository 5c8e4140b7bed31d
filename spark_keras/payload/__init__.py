"""The model payload: a Keras model's config and raw state, versioned and checksummed."""

from spark_keras.payload.codec import dumps, is_payload, load, loads, save
from spark_keras.payload.pickling import make_picklable

__all__ = ["dumps", "loads", "save", "load", "is_payload", "make_picklable"]
