"""KerasTransformer in Spark ML pipelines, its persistence and Connect."""
