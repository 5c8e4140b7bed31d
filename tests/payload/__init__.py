"""The payload component: format, codec, model files, one file per host."""
