"""In a Spark Python worker: a BroadcastModel's model for the running task. The handle of
the version the task scores with (:meth:`for_task`) builds its model from what its
transport delivered, on the task's device with TensorFlow's pools sized to its CPUs
(:mod:`.resources`), once per process and device; the cache (:mod:`spark_keras.cache`)
keeps it for later tasks."""

from __future__ import annotations

from typing import Any

from spark_keras.cache import model_cache
from spark_keras.executor import resources
from spark_keras.inference.predictor import predictor_for


def placed(handle: Any) -> tuple[Any, resources.Placement]:
    """The model of ``handle`` (unpickled in a worker) that the running task scores with,
    and where it is placed."""
    task = handle.for_task()
    if task is not handle:
        return placed(task)
    handle.check_usable()
    placement = resources.task_placement()  # sizes TensorFlow's pools first, once
    key = handle._key + placement.key_suffix
    entry = model_cache.get_or_build(key, lambda: handle.build_model(placement))
    return entry.value, placement


def predictor(handle: Any) -> Any:
    """The compiled inference function of :func:`placed`'s model, called on its device."""
    model, placement = placed(handle)
    function = predictor_for(model)
    return function if placement.device == resources.CPU else resources.OnDevice(function, placement)


def build(handle: Any, placement: resources.Placement | None) -> tuple:
    """``handle``'s model built from its transport's payload, on ``placement``'s device
    (default: the CPU): ``(model, nbytes, memory, placement record)`` for the cache."""
    placement = placement or resources.Placement()
    with placement.scope():
        model, nbytes, memory = handle._transport.build(handle._recipe, handle._key, handle._nbytes,
                                                        handle._share_weights)
    runtime = resources.prepare_runtime()
    return model, nbytes, memory, {**placement.describe(), "task_cpus": runtime.get("task_cpus"),
                                   "threads": runtime["threads"], **resources.thread_pools()}
