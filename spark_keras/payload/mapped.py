"""Weights that are views of a memory-mapped payload file, shared by every process
mapping it (Keras 3 with the TensorFlow backend).

A payload file is mapped copy-on-write (``MAP_PRIVATE``): its pages stay the page
cache's, one copy per host whatever the number of processes, and a write by one process
(training, ``assign_add``) copies the pages it touches into that process alone, never
into the file or another process. Tensor sections start at multiples of 64 bytes, so a
section can become a TensorFlow tensor through DLPack without a copy; Keras variables
then hold those tensors (TensorFlow's assign op adopts an input buffer it is handed).

TensorFlow aborts the whole process (a failed check no ``except`` catches) on data that
is not 64-byte aligned, so every condition is checked before a tensor is made; anything
that does not qualify is copied, as without sharing.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from spark_keras.errors import PayloadError

ALIGNMENT = 64  # TensorFlow's EIGEN_MAX_ALIGN_BYTES on x86-64 and aarch64


def stamp(st: os.stat_result) -> tuple[int, ...]:
    """A file's identity and state: (device, inode, size, mtime, ctime); a file replaced
    or written since (other than through a shared mapping) has another."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def map_file(path: str | os.PathLike, *, copy_on_write: bool = True,
             expect: tuple[int, ...] | None = None) -> memoryview:
    """``path`` memory-mapped: copy-on-write and writable (numpy exports writable arrays
    only through DLPack), or read-only. Nothing is read until used. Given ``expect`` (the
    :func:`stamp` of the file a check passed), the file opened must still be that one:
    a file replaced or written between its check and its mapping is refused."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if expect is not None and stamp(st) != expect:
                raise PayloadError(f"payload file {os.fspath(path)!r} changed between its "
                                   f"digest check and its mapping; not mapped")
            if st.st_size == 0:
                raise PayloadError(f"payload file {os.fspath(path)!r} is empty")
            access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
            return memoryview(mmap.mmap(f.fileno(), 0, access=access))
    except OSError as exc:
        raise PayloadError(f"cannot read payload file {os.fspath(path)!r}: {exc}") from exc


def close(view: memoryview) -> None:
    """Unmap a :func:`map_file` mapping now, unless arrays still view it (then the
    garbage collector unmaps it when they are gone)."""
    mapping: Any = view.obj  # the mmap.mmap map_file made the view of
    try:
        view.release()
        mapping.close()
    except BufferError:
        pass


def shared_tensor(value: Any, dtype: Any) -> Any:
    """``value`` as a TensorFlow tensor on the same memory, or None if it cannot be one
    safely (not a writable, C-contiguous, 64-byte-aligned, non-empty array of ``dtype``)."""
    if not (isinstance(value, np.ndarray) and value.size and value.flags.c_contiguous
            and value.flags.writeable and value.ctypes.data % ALIGNMENT == 0):
        return None
    try:
        if np.dtype(value.dtype).name != np.dtype(dtype).name:
            return None
    except TypeError:  # a dtype numpy does not know by that name
        return None
    import tensorflow as tf

    try:
        return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
    except (BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
        return None  # dtypes DLPack cannot carry (bfloat16, ...)


@dataclass(frozen=True)
class WeightMemory:
    """Where a model's weights live: bytes on the shared mapping, bytes private."""

    shared_bytes: int
    private_bytes: int

    @property
    def shared(self) -> bool:
        return self.shared_bytes > 0

    def as_dict(self) -> dict[str, Any]:
        return {"shared": self.shared, "shared_bytes": self.shared_bytes,
                "private_bytes": self.private_bytes}


def weight_memory(model: Any, region: memoryview | None) -> WeightMemory:
    """Measure, variable by variable, whether its buffer lies in ``region`` (the mapped
    payload) or in the process's own memory."""
    start = end = 0
    if region is not None and region.nbytes:
        start = np.frombuffer(region, dtype=np.uint8).ctypes.data
        end = start + region.nbytes
    shared = private = 0
    for variable in model.variables:
        address, nbytes = _buffer(variable)
        if start <= address < end:
            shared += nbytes
        else:
            private += nbytes
    return WeightMemory(shared, private)


def _buffer(variable: Any) -> tuple[int, int]:
    """(address, size) of a Keras variable's current buffer (0 if not observable)."""
    tensor = variable.value
    if callable(tensor):  # tf-keras: a tf.Variable, whose .value() reads it
        tensor = tensor()
    try:
        import tensorflow as tf

        if isinstance(tensor, tf.Variable):
            tensor = tensor.value()
        array = np.asarray(tensor)
    except Exception:  # another backend, or a dtype numpy cannot view
        return 0, int(np.prod(variable.shape, dtype=np.int64)) * np.dtype(variable.dtype).itemsize
    return array.ctypes.data, array.nbytes
