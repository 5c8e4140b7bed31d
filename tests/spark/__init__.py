"""The Spark front-ends: BroadcastModel, transform, UDF, partitions, KeyedModels, versions."""
