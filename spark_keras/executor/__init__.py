"""What runs in a Spark executor's Python worker, and how a payload gets there.

Owns the preloading daemon (:mod:`.daemon`), the check of where executors get the
package (:mod:`.environment`), the task's CPUs and GPUs (:mod:`.resources`), the version
a task scores with (:mod:`.task_version`), and how a payload arrives and becomes a file
every worker of the executor maps (:mod:`.transport`, :mod:`.driver_payload`,
:mod:`.shipped_objects`).

Trust: what arrives through Spark (closures, broadcasts) is as trusted as Spark's own
RPC; what arrives from the driver's channel or storage is checked against the payload's
SHA-256 before it is mapped; files kept on the host are in folders the worker's user
owns, not writable by others. Importing this package imports nothing heavy: the daemon
(``python -m spark_keras.executor.daemon``) must start with no other thread.
"""
