"""What runs in a Spark Python worker: daemon, resources, the executors' Python."""
