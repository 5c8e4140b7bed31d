"""What the current Spark task may use: its CPUs (TensorFlow's thread pools) and its GPUs
(the device its model is built and called on).

**Threads.** Before TensorFlow's runtime starts in a Python worker (its first model
build), :func:`prepare_runtime` sizes TensorFlow's intra-op pool to the task's CPUs
(``TaskContext.cpus()``: ``spark.task.cpus``, or a stage's resource profile) and its
inter-op pool to ``min(2, cpus)``, through ``tf.config.threading`` (readable back with
``get_intra_op_parallelism_threads()``). Without it, every worker sizes its pools to all
the host's cores. An explicit setting wins: ``TF_NUM_INTRAOP_THREADS`` /
``TF_NUM_INTEROP_THREADS`` (``spark.executorEnv.*``), a ``tf.config.threading`` call made
before the first build, or ``SPARK_KERAS_TF_THREADS=off`` (TensorFlow's own defaults). A
process whose runtime already started keeps its pools (logged once at debug level). The
pools are sized once per process: Spark runs a stage with another resource profile in
other Python workers, so a worker's tasks share one budget.

**GPUs.** A task Spark assigned GPU addresses (``TaskContext.resources()["gpu"]``) builds
and calls its model on TensorFlow's device for the first of them; the device is part of
the model's cache key, so a reused worker that later runs a task assigned another GPU
builds a second model there instead of using the first one's. Spark's address is mapped
to TensorFlow's index (TensorFlow numbers the GPUs it sees from 0) by
:func:`tensorflow_gpu_index`: the address's position in ``CUDA_VISIBLE_DEVICES`` if that
lists it; else the address itself if TensorFlow sees that many GPUs; else, where the
worker sees exactly the task's GPUs (a container isolating them), the address's position
among the task's. Memory growth is turned on for every GPU before the runtime starts
(unless ``TF_FORCE_GPU_ALLOW_GROWTH`` is set), so several workers share one GPU. A task
assigned a GPU that TensorFlow does not see scores on the CPU, with one warning per
process. Only TensorFlow backends are placed and sized; others are left alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, ContextManager, Sequence

from spark_keras.errors import ArgumentError, ArgumentTypeError
from spark_keras.executor.daemon import tensorflow_runtime_started

logger = logging.getLogger("spark_keras")

THREADS_ENV = "SPARK_KERAS_TF_THREADS"
_OFF = ("off", "0", "false", "no")
_INTRA_ENV = "TF_NUM_INTRAOP_THREADS"
_INTER_ENV = "TF_NUM_INTEROP_THREADS"
_GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
CPU = "CPU:0"

_lock = threading.Lock()
_runtime: dict[str, Any] | None = None  # what prepare_runtime decided, once per process
_warned_no_gpu = False


def task_context() -> Any:
    """The running Spark task's ``TaskContext``; None outside a Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return None
    return TaskContext.get()


def task_cpus(ctx: Any = None) -> int | None:
    """The CPUs of the running task (None outside a Spark task)."""
    ctx = ctx or task_context()
    return (ctx.cpus() or None) if ctx is not None else None


def task_gpus(ctx: Any = None) -> list[str]:
    """The GPU addresses Spark assigned to the running task (none outside a task)."""
    ctx = ctx or task_context()
    gpu = ctx.resources().get("gpu") if ctx is not None else None
    return list(gpu.addresses) if gpu is not None else []


def _on_tensorflow() -> bool:
    from spark_keras import flavour

    return flavour.current().backend == "tensorflow"


def prepare_runtime(cpus: int | None = None) -> dict[str, Any]:
    """Before TensorFlow's runtime starts in this process: size its thread pools to
    ``cpus`` (default: the running task's) and turn on memory growth for every GPU.
    Done once per process, by its first call; returns what was decided (``threads``
    says who chose, for the intra-op and inter-op pools: ``task``, ``environment``,
    ``user``, ``off``, ``runtime started`` or ``not a task``; ``task_cpus``; ``gpus``:
    how many GPUs TensorFlow sees)."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = _prepare(task_cpus() if cpus is None else cpus) if _on_tensorflow() \
                else {"threads": "not TensorFlow", "gpus": 0}
        return dict(_runtime)


def _prepare(cpus: int | None) -> dict[str, Any]:
    import tensorflow as tf

    threading_ = tf.config.threading
    decided: dict[str, Any] = {"task_cpus": cpus}
    if os.environ.get(THREADS_ENV, "").strip().lower() in _OFF:
        decided["threads"] = "off"
    elif tensorflow_runtime_started():
        logger.debug("TensorFlow's runtime started before spark_keras built a model in pid %d: "
                     "its thread pools stay as they are", os.getpid())
        decided["threads"] = "runtime started"
    elif cpus is None:
        decided["threads"] = "not a task"
    else:
        chosen = []
        for env, get, set_, value in (
                (_INTRA_ENV, threading_.get_intra_op_parallelism_threads,
                 threading_.set_intra_op_parallelism_threads, cpus),
                (_INTER_ENV, threading_.get_inter_op_parallelism_threads,
                 threading_.set_inter_op_parallelism_threads, min(2, cpus))):
            if os.environ.get(env):
                chosen.append("environment")
            elif get():
                chosen.append("user")
            else:
                set_(value)
                chosen.append("task")
        decided["threads"] = chosen[0] if chosen[0] == chosen[1] else "/".join(chosen)
    gpus = tf.config.list_physical_devices("GPU")  # enumerates devices, starts no runtime
    if gpus and not os.environ.get(_GROWTH_ENV) and not tensorflow_runtime_started():
        for gpu in gpus:
            try:
                tf.config.experimental.set_memory_growth(gpu, True)
            except (RuntimeError, ValueError) as exc:  # already initialized
                logger.debug("cannot turn on memory growth for %s: %s", gpu.name, exc)
    decided["gpus"] = len(gpus)
    return decided


def thread_pools() -> dict[str, int]:
    """The sizes of TensorFlow's thread pools in this process (``intra_op_threads``,
    ``inter_op_threads``): as configured, else as its environment variables say, else 0
    (TensorFlow's default: every core). Empty off TensorFlow."""
    if not _on_tensorflow():
        return {}
    import tensorflow as tf

    threading_ = tf.config.threading
    return {"intra_op_threads": _effective(_INTRA_ENV, threading_.get_intra_op_parallelism_threads()),
            "inter_op_threads": _effective(_INTER_ENV, threading_.get_inter_op_parallelism_threads())}


def _effective(env: str, configured: int) -> int:
    """The pool size TensorFlow uses: configured, else its environment variable, else 0
    (TensorFlow's default: every core)."""
    if configured:
        return int(configured)
    try:
        return int(os.environ.get(env, "0"))
    except ValueError:
        return 0


def tensorflow_gpu_index(address: str, visible: int, task_addresses: Sequence[str] = (),
                         cuda_visible_devices: str | None = None) -> int | None:
    """TensorFlow's index of the GPU Spark calls ``address`` (None if TensorFlow does not
    see it), given how many GPUs TensorFlow sees (``visible``), the task's addresses and
    ``CUDA_VISIBLE_DEVICES``."""
    if cuda_visible_devices is not None:
        listed = [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]
        if address in listed:
            index = listed.index(address)
            return index if index < visible else None
    if address.isdigit() and int(address) < visible:
        return int(address)
    if visible and visible == len(task_addresses) and address in task_addresses:
        return list(task_addresses).index(address)
    return None


@dataclass(frozen=True)
class Placement:
    """Where the running task's model lives: ``device`` (TensorFlow's, ``"CPU:0"`` or
    ``"GPU:<i>"``), the GPU the task asked for (``requested``, None without one: the
    model's cache key carries it) and Spark's ``address`` for it."""

    device: str = CPU
    requested: str | None = None
    address: str | None = None

    @property
    def key_suffix(self) -> str:
        """Appended to a model's cache key: one model per requested device and process."""
        return f"@{self.requested}" if self.requested else ""

    def scope(self) -> ContextManager[Any]:
        """A context placing TensorFlow ops on :attr:`device` (nothing for the CPU)."""
        if self.device == CPU:
            return contextlib.nullcontext()
        import tensorflow as tf

        return tf.device(f"/{self.device}")

    def describe(self) -> dict[str, Any]:
        """For ``cache_info()`` and the build log."""
        return {"device": self.device, "requested_device": self.requested, "gpu_address": self.address}


def task_placement() -> Placement:
    """The device of the running task's model (after :func:`prepare_runtime`)."""
    global _warned_no_gpu
    runtime = prepare_runtime()
    ctx = task_context()
    addresses = task_gpus(ctx)
    if not addresses or runtime.get("threads") == "not TensorFlow":
        return Placement()
    address = addresses[0]
    index = tensorflow_gpu_index(address, runtime["gpus"], addresses,
                                 os.environ.get("CUDA_VISIBLE_DEVICES"))
    if index is not None:
        return Placement(f"GPU:{index}", f"GPU:{index}", address)
    if not _warned_no_gpu:
        _warned_no_gpu = True
        logger.warning(
            "Spark assigned GPU %s to this task but TensorFlow sees %d GPU(s) here (pid %d; "
            "CUDA_VISIBLE_DEVICES=%s): models run on the CPU (CPU-only TensorFlow, or "
            "GPUs hidden from this worker?)", address, runtime["gpus"], os.getpid(),
            os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return Placement(CPU, f"GPU:{address}", address)


class OnDevice:
    """A predictor whose calls run inside a placement's device scope."""

    def __init__(self, predictor: Any, placement: Placement) -> None:
        self._predictor = predictor
        self._placement = placement

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._placement.scope():
            return self._predictor(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._predictor, name)


def check_profile(profile: Any, version: str | None = None) -> None:
    """Refuse, on the driver, a ``profile`` that ``mapInArrow`` cannot take: not a
    ``pyspark.resource.ResourceProfile``, or a PySpark older than 4.0 (``version``,
    default the installed one)."""
    if profile is None:
        return
    import pyspark
    from pyspark.resource import ResourceProfile

    if not isinstance(profile, ResourceProfile):
        raise ArgumentTypeError(f"profile must be a pyspark.resource.ResourceProfile, not "
                                f"{type(profile).__name__}")
    version = version or pyspark.__version__
    if not profile_supported(version):
        raise ArgumentError(f"transform(..., profile=...) needs PySpark 4.0 or later "
                            f"(mapInArrow takes a ResourceProfile since 4.0); this is {version}")


def profile_supported(version: str) -> bool:
    """True if PySpark ``version``'s ``mapInArrow`` takes a resource profile (>= 4.0)."""
    major = version.split(".", 1)[0]
    return major.isdigit() and int(major) >= 4
