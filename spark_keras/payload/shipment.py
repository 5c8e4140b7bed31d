"""A model on its way to other processes: payload plus the custom objects to rebuild it.

The payload itself stays pickle-free; the custom classes and functions travel beside it,
cloudpickled (classes defined in the driver's ``__main__`` travel by value, importable
ones by reference). Spark broadcasts, Dask worker plugins and multiprocessing pools all
carry a :class:`Shipment`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .codec import dumps, loads
from .pickling import referenced_objects


@dataclass(frozen=True, repr=False)
class Shipment:
    """A model on its way to other processes: its payload, the custom classes and
    functions it needs (cloudpickled: ``__main__`` classes travel by value) and the
    ``safe_mode`` to rebuild it with. Pickles as plain bytes; :meth:`build` rebuilds."""

    payload: bytes
    objects: bytes
    safe_mode: bool = True

    @classmethod
    def of(cls, model: Any, *, custom_objects: Mapping[str, Any] | None = None,
           safe_mode: bool = True, payload: bytes | None = None) -> "Shipment":
        """Pack ``model`` (its custom objects found in it, plus ``custom_objects``);
        ``payload`` if the model's payload is already at hand."""
        import cloudpickle

        objects = dict(referenced_objects(model))
        objects.update(custom_objects or {})
        if payload is None:
            payload = dumps(model, custom_objects=custom_objects)
        return cls(payload, cloudpickle.dumps(objects) if objects else b"", safe_mode)

    def build(self) -> tuple[Any, int]:
        """``(model, payload size)``: the signature :meth:`ModelCache.get_or_build` wants."""
        import pickle

        objects = pickle.loads(self.objects) if self.objects else None
        return loads(self.payload, custom_objects=objects, safe_mode=self.safe_mode), \
            len(self.payload)

    def __repr__(self) -> str:
        return f"Shipment({len(self.payload) / 2**20:.1f} MB payload)"
