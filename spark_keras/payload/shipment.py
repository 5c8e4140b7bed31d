"""A model on its way to other processes: payload plus the custom objects to rebuild it.

The payload itself stays pickle-free; the custom classes and functions travel beside it,
cloudpickled (classes defined in the driver's ``__main__`` travel by value, importable
ones by reference). Spark broadcasts, Dask worker plugins and multiprocessing pools all
carry a :class:`Shipment`.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Callable, Mapping

from spark_keras import flavour
from spark_keras.errors import PayloadError
from spark_keras.payload import host_file
from spark_keras.payload.codec import dumps, load_mapped, loads
from spark_keras.payload.digest import verifies
from spark_keras.payload.mapped import weight_memory
from spark_keras.payload.pickling import referenced_objects

logger = logging.getLogger("spark_keras")

# Keys of the models this process built without the shared file it could not write
# (warned about once each)
_warned: set[str] = set()
_warned_lock = threading.Lock()


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
        recipe = cls.recipe_of(model, custom_objects=custom_objects, safe_mode=safe_mode)
        if payload is None:
            payload = dumps(model, custom_objects=custom_objects)
        return replace(recipe, payload=payload)

    @classmethod
    def recipe_of(cls, model: Any, *, custom_objects: Mapping[str, Any] | None = None,
                  safe_mode: bool = True) -> "Shipment":
        """:meth:`of` without the payload (which travels another way)."""
        import cloudpickle

        objects = dict(referenced_objects(model))
        objects.update(custom_objects or {})
        return cls(b"", cloudpickle.dumps(objects) if objects else b"", safe_mode)

    def without_payload(self) -> "Shipment":
        """This shipment minus the payload bytes (which travel another way)."""
        return replace(self, payload=b"")

    def custom_objects(self) -> dict[str, Any] | None:
        """The custom classes and functions shipped with the model (unpickled here)."""
        import pickle

        if not self.objects:
            return None
        flavour.current()  # Keras first, quietly: the classes' modules import it
        return pickle.loads(self.objects)

    def build(self) -> tuple[Any, int, dict[str, Any]]:
        """``(model, payload size, weight memory)``, as :meth:`ModelCache.get_or_build`
        wants it; the weights are copied into this process."""
        model = loads(self.payload, custom_objects=self.custom_objects(), safe_mode=self.safe_mode)
        return model, len(self.payload), weight_memory(model, None).as_dict()

    def build_shared(self, folder: str, key: str, nbytes: int,
                     fetch: Callable[[], Any] | None = None, *,
                     write: Callable[[BinaryIO], Any] | None = None,
                     share_weights: bool = True,
                     fallback: Callable[[], Any] | None = None,
                     verify: Callable[[str], Any] | None = None,
                     rewrite: Callable[[BinaryIO], Any] | None = None
                     ) -> tuple[Any, int, dict[str, Any]]:
        """Like :meth:`build`, on weights shared by every process of this host: the
        payload lands once in ``folder`` (:mod:`.host_file`; from ``fetch()`` or
        ``write(file)``, by default this shipment's payload) and the model's variables
        are views of that file, mapped copy-on-write (copies if not ``share_weights``).
        A damaged file is rewritten once (with ``rewrite(file)`` if given: another source
        than the one that gave it, say); a file another process replaced while this one
        loaded it is loaded again.

        If ``folder`` cannot be written (disk full, read-only, denied), the model is
        built from the payload in memory (``fetch()``, else ``fallback()``) on weights
        of its own, with one warning per model and process; the memory report says
        why (``shared_fallback``). Without either, the :class:`.host_file.LocalWriteError`
        naming the folder is raised. ``verify``: see :func:`.host_file.land`."""
        own = fetch is None and write is None
        if own:
            fetch = self._payload_to_write
        try:
            return self._build_landed(folder, key, nbytes, fetch, write, share_weights, verify,
                                      rewrite)
        except host_file.LocalWriteError as exc:
            in_memory = fetch if fetch is not None else fallback
            if in_memory is None or (own and not self.payload):
                raise
            return self._build_private(key, in_memory, exc)

    def _build_landed(self, folder: str, key: str, nbytes: int, fetch: Callable[[], Any] | None,
                      write: Callable[[BinaryIO], Any] | None, share_weights: bool,
                      verify: Callable[[str], Any] | None = None,
                      rewrite: Callable[[BinaryIO], Any] | None = None
                      ) -> tuple[Any, int, dict[str, Any]]:
        path = host_file.land(folder, key, nbytes, fetch, write=write, verify=verify)
        # the file mapped must be the one verify passed (one replaced since is refused),
        # and a file another process replaces while this one loads it is loaded again
        checked = host_file.checked_stamp(path) if verify is not None else None
        loaded = (checked[0], checked[1]) if checked else host_file.identity(path)
        try:
            return self.build_from_file(path, share_weights=share_weights, expect=checked)
        except PayloadError:
            if host_file.identity(path) == loaded:  # the file this process loaded
                if loaded is None or verifies(path):
                    raise  # the file is sound: the payload itself cannot be loaded here
                logger.warning("payload file %s is damaged; rewriting it", path)
            # rewritten here, unless another process already replaced it: then that file
            path = host_file.land(folder, key, nbytes, fetch, write=rewrite or write,
                                  damaged=loaded, verify=verify)
            checked = host_file.checked_stamp(path) if verify is not None else None
            return self.build_from_file(path, share_weights=share_weights, expect=checked)

    def _build_private(self, key: str, payload: Callable[[], Any], reason: Exception
                       ) -> tuple[Any, int, dict[str, Any]]:
        """:meth:`build` from ``payload()``, after the shared file could not be written
        (``reason``): warned once per model and process, and recorded in the memory report."""
        with _warned_lock:
            first = key not in _warned
            _warned.add(key)
        if first:
            logger.warning("model %s is built with its own copy of the weights in this process "
                           "(pid %d), not shared: %s", key, os.getpid(), reason)
        model, nbytes, memory = replace(self, payload=payload()).build()
        memory["shared_fallback"] = str(reason)
        return model, nbytes, memory

    def _payload_to_write(self) -> bytes:
        if not self.payload:
            raise PayloadError("the payload file is missing or damaged, and this process "
                               "holds no copy of the payload to write it from: ship the "
                               "model again")
        return self.payload

    def build_from_file(self, path: str, *, share_weights: bool = True,
                        expect: tuple[int, ...] | None = None
                        ) -> tuple[Any, int, dict[str, Any]]:
        """Like :meth:`build`, from a payload file (this shipment's payload left aside);
        with ``share_weights``, on weights mapped from it; ``expect``: the stamp of the
        file a check passed (:func:`.mapped.map_file`)."""
        model, memory = load_mapped(path, custom_objects=self.custom_objects(),
                                    safe_mode=self.safe_mode, share_weights=share_weights,
                                    expect=expect)
        return model, os.path.getsize(path), memory.as_dict()

    def __repr__(self) -> str:
        return f"Shipment({len(self.payload) / 2**20:.1f} MB payload)"

