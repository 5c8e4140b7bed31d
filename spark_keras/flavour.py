"""Which Keras this process runs, and everything that differs between them.

The flavour is fixed when Keras is first imported (``TF_USE_LEGACY_KERAS=1`` selects
tf-keras), so it is read once, by :func:`current`, and recorded in every payload
header. :func:`current` returns one runtime object, whose class owns all that differs;
no other module branches on the flavour:

* :class:`Keras3Runtime`: Keras 3 on any backend (JAX, PyTorch, ...); models are
  called eagerly.
* :class:`Keras3TensorFlowRuntime`: Keras 3 on TensorFlow; the predict function is a
  ``tf.function`` traced once, and variables can share a mapped payload's memory.
* :class:`TfKerasRuntime`: legacy tf-keras 2.x (always on TensorFlow).

Every runtime has ``name`` (``"keras3"`` or ``"tf_keras"``, as in payload headers),
``version``, ``backend`` and ``module`` (the imported ``keras`` or ``tf_keras``). The
payload layer picks its model state module by ``name`` (``spark_keras.payload.state``);
this module imports nothing of it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from spark_keras._deps import require

KERAS3 = "keras3"
TF_KERAS = "tf_keras"

CompiledCall = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


@dataclass(frozen=True)
class Runtime:
    """The Keras of this process; subclasses own what differs between flavours."""

    version: str
    backend: str
    module: ModuleType

    name: ClassVar[str]  # KERAS3 or TF_KERAS: what payload headers record
    display_name: ClassVar[str]  # for people: "Keras" or "tf-keras"
    legacy: ClassVar[bool] = False  # tf-keras 2.x
    shares_weights: ClassVar[bool] = False  # variables can adopt a mapped payload's memory
    how_to_use: ClassVar[str]  # a hint telling how to make a process use this flavour

    def flatten(self, structure: Any) -> list[Any]:
        """The leaves of a nested structure of tensors (dicts in sorted-key order)."""
        raise NotImplementedError

    def to_numpy(self, tensor: Any) -> np.ndarray:
        """A backend tensor (or array) as a numpy array."""
        raise NotImplementedError

    def output_spec(self, model: Any, shape: tuple, dtype: str) -> Any:
        """Symbolic outputs of a subclassed model called on a batch of ``shape``."""
        raise NotImplementedError

    def compile_call(self, fn: Callable[..., list[Any]], input_specs: Sequence[Any]
                     ) -> CompiledCall:
        """``fn(*inputs) -> output tensors`` as a function of numpy arrays returning
        numpy arrays; ``input_specs`` (``shape`` per row, ``dtype``) describe the inputs."""
        def eager(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
            return [self.to_numpy(t) for t in fn(*arrays)]
        return eager

    @staticmethod
    def dtype_name(dtype: Any) -> str:
        """``"float32"`` for a Keras 3 dtype string or a ``tf.DType`` alike."""
        return dtype if isinstance(dtype, str) else str(getattr(dtype, "name", dtype))

    def floatx(self) -> str:
        """The default float dtype (``"float32"`` unless configured)."""
        return self.module.backend.floatx()

    def load_model(self, path: str, *, custom_objects: Mapping[str, Any] | None,
                   safe_mode: bool) -> Any:
        """A ``.keras`` archive loaded by this Keras."""
        return self.module.saving.load_model(path, custom_objects=custom_objects,
                                             safe_mode=safe_mode)


class TracedCall:
    """``fn`` as a ``tf.function`` traced once, for any batch size (batch dimension None)
    and any length of the inputs' other unknown dimensions: its :attr:`traces` stay 1.

    Once traced (by the first call), a call goes straight to the traced concrete function,
    its inputs converted as the signature converts them: past ``tf.function``'s dispatch
    (arguments bound to the signature, trace cache looked up), which was about half of a
    small call's fixed cost (64 rows of a 64-256-256-1 MLP: 0.38 ms of the calling thread's
    CPU through the ``tf.function``, 0.14 ms so; ``python -m bench.call_cost``). The graph
    run is the same one: the outputs are the same bits. Inputs of another rank or shape
    than the signature's, and calls while ``tf.config.run_functions_eagerly`` is on, still
    go through the ``tf.function`` (its error, its eager run)."""

    def __init__(self, fn: Callable[..., list[Any]], input_specs: Sequence[Any]) -> None:
        import tensorflow as tf

        signature = [tf.TensorSpec((None, *s.shape), s.dtype) for s in input_specs]
        self.function = tf.function(fn, input_signature=signature, autograph=False)
        # TensorFlow counts traces by the Python code traced, across functions: every
        # model's call is the same code, so a worker building its sixth model (stream
        # updates, KeyedModels) would be warned of "frequent retracing" though each
        # function, its signature fixed, traces once per model (what :attr:`traces` says)
        self.function._omit_frequent_tracing_warning = True
        self._tf = tf
        self._inputs = [(spec.dtype, tuple(spec.shape.as_list())) for spec in signature]
        self._concrete: Any = None  # the traced function, once the first call traced it

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        concrete = self._concrete
        if concrete is not None and not self._tf.config.functions_run_eagerly():
            tensors = self._tensors(arrays)
            if tensors is not None:
                # (ConcreteFunction.__call__ would bind the arguments to the signature again)
                return [t.numpy() for t in concrete._call_flat(tensors, concrete.captured_inputs)]
        outputs = self.function(*arrays)
        if concrete is None:
            self._concrete = self.function.get_concrete_function()  # traced: no new trace
        return [t.numpy() for t in outputs]

    def _tensors(self, arrays: Sequence[np.ndarray]) -> list[Any] | None:
        """``arrays`` as the signature's tensors (``tf.convert_to_tensor`` to its dtypes,
        what binding them to it does), or None when one is not an array of its rank and
        known dimensions, or one conversion fails (the ``tf.function`` then says why)."""
        if len(arrays) != len(self._inputs):
            return None
        tensors = []
        for array, (dtype, dims) in zip(arrays, self._inputs):
            shape = getattr(array, "shape", None)
            if shape is None or len(shape) != len(dims) or \
                    any(d is not None and d != n for d, n in zip(dims, shape)):
                return None
            try:
                tensors.append(self._tf.convert_to_tensor(array, dtype))
            except Exception:  # noqa: BLE001 (the tf.function raises it as it always has)
                return None
        return tensors

    @property
    def traces(self) -> int:
        """How many times TensorFlow traced the function (each trace a concrete function)."""
        return self.function.experimental_get_tracing_count()


class Keras3Runtime(Runtime):
    """Keras 3 on any backend: models called eagerly."""

    name = KERAS3
    display_name = "Keras"
    how_to_use = ("unset TF_USE_LEGACY_KERAS (or set it to 0) so Keras 3 is used (on Spark: "
                  "spark.executorEnv.TF_USE_LEGACY_KERAS=0)")

    def flatten(self, structure: Any) -> list[Any]:
        return self.module.tree.flatten(structure)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        return np.asarray(self.module.ops.convert_to_numpy(tensor))

    def output_spec(self, model: Any, shape: tuple, dtype: str) -> Any:
        return model.compute_output_spec(self.module.KerasTensor(shape, dtype=dtype))


class Keras3TensorFlowRuntime(Keras3Runtime):
    """Keras 3 on TensorFlow: a traced predict function, and shared weights."""

    shares_weights = True

    def compile_call(self, fn: Callable[..., list[Any]], input_specs: Sequence[Any]
                     ) -> CompiledCall:
        return TracedCall(fn, input_specs)


class TfKerasRuntime(Runtime):
    """Legacy tf-keras 2.x, on TensorFlow."""

    name = TF_KERAS
    display_name = "tf-keras"
    legacy = True
    how_to_use = ("set TF_USE_LEGACY_KERAS=1 and install tf-keras in this process (on Spark: "
                  "spark.executorEnv.TF_USE_LEGACY_KERAS=1 and spark.yarn.appMasterEnv / "
                  "driver env)")

    def flatten(self, structure: Any) -> list[Any]:
        import tensorflow as tf

        return tf.nest.flatten(structure)

    def to_numpy(self, tensor: Any) -> np.ndarray:
        return np.asarray(tensor)

    def output_spec(self, model: Any, shape: tuple, dtype: str) -> Any:
        import tensorflow as tf

        return model.compute_output_signature(tf.TensorSpec(shape, dtype))

    def compile_call(self, fn: Callable[..., list[Any]], input_specs: Sequence[Any]
                     ) -> CompiledCall:
        return TracedCall(fn, input_specs)


_KERAS3_BY_BACKEND: dict[str, type[Keras3Runtime]] = {"tensorflow": Keras3TensorFlowRuntime}
_FLAVOURS: dict[str, type[Runtime]] = {KERAS3: Keras3Runtime, TF_KERAS: TfKerasRuntime}

def legacy_requested() -> bool:
    """True if ``TF_USE_LEGACY_KERAS`` asks for tf-keras."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")


@functools.lru_cache(maxsize=None)
def current() -> Runtime:
    """The Keras runtime of this process (imports Keras on first call, without the
    start-up lines ``TF_CPP_MIN_LOG_LEVEL`` hides: :mod:`spark_keras.quiet`)."""
    from spark_keras.quiet import quiet_tensorflow_startup

    with quiet_tensorflow_startup():
        if legacy_requested():
            tf_keras = require("tf_keras", "legacy tf-keras (TF_USE_LEGACY_KERAS=1)")

            return TfKerasRuntime(tf_keras.__version__, "tensorflow", tf_keras)
        keras = require("keras", "Keras")

    backend = keras.backend.backend()
    return _KERAS3_BY_BACKEND.get(backend, Keras3Runtime)(keras.__version__, backend, keras)


def how_to_match(flavour_name: str) -> str:
    """A one-line hint telling how to make this process use ``flavour_name`` (a
    payload's flavour, not necessarily this process's)."""
    return _FLAVOURS.get(flavour_name, Keras3Runtime).how_to_use

