"""What Keras's ``safe_mode`` refuses to rebuild, found in a model's config without
rebuilding it: Python lambdas (a ``Lambda`` layer's function or output shape, stored as
bytecode). A model handed over in memory is checked where it is shipped
(:func:`check_rebuildable`), so a model its workers would refuse fails at once, not at
the first action."""

from __future__ import annotations

from typing import Any, Iterator

from spark_keras.errors import PayloadError

__all__ = ["unsafe_parts", "check_rebuildable"]


def unsafe_parts(config: Any, layer: str = "the model") -> Iterator[str]:
    """The names of the layers whose config holds Python code ``safe_mode`` refuses:
    Keras 3's ``{"class_name": "__lambda__"}`` and tf-keras's ``function_type``
    (or ``output_shape_type``) ``"lambda"``."""
    if isinstance(config, dict):
        inner = config.get("config")
        if isinstance(inner, dict) and isinstance(inner.get("name"), str):
            layer = inner["name"]
        if config.get("class_name") == "__lambda__" or "lambda" in (
                config.get("function_type"), config.get("output_shape_type")):
            yield layer
            return
        for value in config.values():
            yield from unsafe_parts(value, layer)
    elif isinstance(config, list):
        for value in config:
            yield from unsafe_parts(value, layer)


def check_rebuildable(model: Any, safe_mode: bool) -> None:
    """Raise :class:`PayloadError` if ``safe_mode`` would refuse to rebuild ``model``
    (a Keras model in memory): from its config, nothing rebuilt."""
    if not safe_mode:
        return
    from spark_keras.payload import state

    found = sorted(set(unsafe_parts(state.current().serialize_config(model))))
    if found:
        raise PayloadError(
            f"layer(s) {', '.join(map(repr, found))} of this model hold a Python lambda, which "
            f"Keras refuses to rebuild under safe_mode=True: every worker would fail building "
            f"it. Pass safe_mode=False if you trust this code, or use a named function "
            f"registered with @keras.saving.register_keras_serializable")
