"""``make_picklable``: pickle a Keras model as a payload instead of a ``.keras`` zip."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from spark_keras import flavour
from spark_keras.payload.codec import dumps, loads

_OPTIONS_ATTR = "_spark_keras_pickle_options"


def make_picklable(model_or_class: Any, *, custom_objects: Mapping[str, Any] | None = None,
                   include_optimizer: bool = True, safe_mode: bool = True) -> Any:
    """Make ``pickle``/cloudpickle ship a model (or every instance of a class) as a payload.

    Unpickling returns a fresh, independent model. The pickle carries the model's class
    and the custom classes and functions its config names, as objects: pickled by
    reference when importable, by value under cloudpickle when defined in ``__main__``,
    so the receiving process needs no ``custom_objects``. Idempotent; returns its argument.

    Args:
        model_or_class: a Keras model instance, or a ``keras.Model`` subclass.
        custom_objects: extra objects the config refers to (added to what is found).
        include_optimizer: keep the compile config and optimizer state (like Keras's
            own pickling), so the copy can go on training.
        safe_mode: passed to ``loads`` on the receiving side.

    Returns:
        ``model_or_class`` itself, now pickled as a payload.
    """
    options = {"custom_objects": dict(custom_objects or {}),
               "include_optimizer": include_optimizer, "safe_mode": safe_mode}
    if isinstance(model_or_class, type):
        model_or_class.__reduce_ex__ = _reduce_ex  # type: ignore[method-assign]  # opting the class in
        setattr(model_or_class, _OPTIONS_ATTR, options)
    else:
        # Pickle looks __reduce_ex__ up on the instance, so one model can opt in alone.
        object.__setattr__(model_or_class, "__reduce_ex__", _BoundReduce(model_or_class))
        object.__setattr__(model_or_class, _OPTIONS_ATTR, options)
    return model_or_class


class _BoundReduce:
    __slots__ = ("model",)

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, protocol: int) -> tuple:
        return _reduce_ex(self.model, protocol)


def _reduce_ex(model: Any, protocol: int = 2) -> tuple:
    options = getattr(model, _OPTIONS_ATTR)
    data = dumps(model, custom_objects=options["custom_objects"],
                 include_optimizer=options["include_optimizer"])
    objects = dict(referenced_objects(model))
    objects.update(options["custom_objects"])
    return (_unpickle, (data, objects, options["safe_mode"], options["include_optimizer"]))


def _unpickle(data: bytes, objects: dict[str, Any], safe_mode: bool,
              include_optimizer: bool = True) -> Any:
    # The copy stays picklable the same way: a second hop (Dask's scheduler re-pickles
    # every task for its worker; a child returning the model) must not fall back to
    # Keras's own pickling, which is slower and loses classes defined in __main__.
    return make_picklable(loads(data, custom_objects=objects, safe_mode=safe_mode),
                          custom_objects=objects, include_optimizer=include_optimizer,
                          safe_mode=safe_mode)


def referenced_objects(model: Any) -> Iterator[tuple[str, Any]]:
    """Custom (non-Keras) classes and registered functions a model needs to be rebuilt."""
    saving = flavour.current().module.saving

    def custom(obj: Any) -> bool:
        module = getattr(obj, "__module__", "") or ""
        return not (module.startswith("keras.") or module.startswith("tf_keras.")
                    or module.startswith("tensorflow."))

    classes = [type(model)]
    classes += [type(layer) for layer in model._flatten_layers(include_self=False, recursive=True)]
    for cls in classes:
        if custom(cls):
            yield cls.__name__, cls
            yield saving.get_registered_name(cls), cls
    for registered in _registered_names(model.get_config() if _has_config(model) else {}):
        obj = saving.get_registered_object(registered)
        if obj is not None and custom(obj):
            yield registered, obj


def _has_config(model: Any) -> bool:
    try:
        model.get_config()
        return True
    except NotImplementedError:
        return False


def _registered_names(config: Any) -> Iterator[str]:
    if isinstance(config, dict):
        name = config.get("registered_name")
        if isinstance(name, str):
            yield name
        for value in config.values():
            yield from _registered_names(value)
    elif isinstance(config, (list, tuple)):
        for value in config:
            yield from _registered_names(value)
