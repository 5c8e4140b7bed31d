"""The driver-side check that a subclassed model relying on auto-config comes back right.

Keras's automatic config records a subclassed model's constructor *defaults*, not the
arguments passed, so such a model can load without error and predict differently. A
payload of such a model is loaded back once on the driver and both are compared.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import numpy as np

from spark_keras import flavour
from spark_keras.errors import ModelError, PayloadError
from spark_keras.payload import state


def relies_on_auto_config(model: Any) -> bool:
    """A subclassed model using Keras's auto-config whose constructor takes arguments:
    its config may not bring it back (check it with :func:`verify`)."""
    return state.current().has_default_config(model) \
        and constructor_takes_arguments(type(model))


def constructor_takes_arguments(cls: type) -> bool:
    # the class's own constructor is the one wanted (mypy: unsound on an instance)
    params = inspect.signature(cls.__init__).parameters.values()  # type: ignore[misc]
    return any(p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)


def verify(model: Any, data: Any, custom_objects: Mapping[str, Any] | None,
           loads: Callable[..., Any]) -> None:
    """Raise :class:`PayloadError` unless ``loads(data)`` predicts like ``model``."""
    advice = (f"{type(model).__qualname__} has no get_config(), and Keras's automatic "
              f"config records its constructor's default arguments, not the ones you "
              f"passed. Implement get_config() (and from_config() if needed) returning "
              f"every constructor argument")
    objects = dict(custom_objects or {})
    objects.setdefault(type(model).__name__, type(model))
    try:
        twin = loads(data, custom_objects=objects, safe_mode=False)
        same = same_outputs(model, twin, sample_inputs(model))
    except Exception as exc:  # the twin could not even be built or called
        raise PayloadError(f"{advice}. (Rebuilding it from its config failed: {exc})") from exc
    if not same:
        raise PayloadError(f"{advice}. Rebuilt from its config, it predicts differently.")


def sample_inputs(model: Any) -> Any:
    """Random inputs shaped like the model's recorded build input shape."""
    build_config = model.get_build_config() or {}
    shape = build_config.get("input_shape")
    if shape is None:
        raise ModelError("the model records no input shape (was it built?)")
    rng = np.random.default_rng(0)
    floatx = flavour.current().floatx()

    def make(s):
        dims = [2 if d is None else int(d) for d in s]
        return rng.standard_normal(dims).astype(floatx)

    def is_shape(s):
        return isinstance(s, (list, tuple)) and all(d is None or isinstance(d, int) for d in s)

    if is_shape(shape):
        return make(shape)
    if isinstance(shape, dict):
        return {k: make(v) for k, v in shape.items()}
    return [make(s) for s in shape]


def same_outputs(a: Any, b: Any, x: Any) -> bool:
    rt = flavour.current()
    out_a = rt.flatten(a(x, training=False))
    out_b = rt.flatten(b(x, training=False))
    return len(out_a) == len(out_b) and all(
        np.shape(u) == np.shape(v)
        and np.allclose(rt.to_numpy(u), rt.to_numpy(v), atol=1e-6, equal_nan=True)
        for u, v in zip(out_a, out_b))
