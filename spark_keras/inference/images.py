"""Rows of Spark's image data source (``spark.read.format("image")``) as model inputs.

Each row is a struct ``(origin, height, width, nChannels, mode, data)`` whose ``data``
holds ``height x width x nChannels`` bytes in OpenCV order (BGR, BGRA). A row becomes
an ``H x W x C`` array in RGB (RGBA) order, cast to the input's dtype: what
``keras.utils.load_img`` (``color_mode`` "grayscale", "rgb" or "rgba" by ``nChannels``)
and ``keras.utils.img_to_array`` give for the same file.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..errors import ModelInputError
from .column_read import ColumnRead, Problem, nulls
from .specs import TensorSpec

# OpenCV types Spark's reader produces for 8-bit images: CV_8UC1, CV_8UC3, CV_8UC4
_EIGHT_BIT_MODES = {0: 1, 16: 3, 24: 4}
# BGR(A) -> RGB(A), by channel count
_TO_RGB = {1: [0], 3: [2, 1, 0], 4: [2, 1, 0, 3]}


def read_images(name: str, arr: pa.StructArray, spec: TensorSpec) -> ColumnRead:
    """The images as rows of ``spec``: their bytes in RGB order (cast to the input's
    dtype when the model is called), each row's ``(H, W, C)``, and the rows that cannot
    be scored (null, not 8-bit, damaged, or of a size the input does not take)."""
    if len(spec.shape) != 3 or spec.dtype == "string":
        raise ModelInputError(
            f"column {name!r} holds images (Spark's image data source); the model input "
            f"{spec.name!r} expects {spec.describe()} per row, not an image of shape "
            f"(height, width, channels)")
    n = len(arr)
    fields = dict(zip((f.name for f in arr.type), arr.flatten()))
    missing = nulls(arr) | nulls(fields["data"])
    for key in ("height", "width", "nChannels", "mode"):
        missing |= nulls(fields[key])
    height, width, channels, mode = (fields[k].fill_null(0).to_numpy(zero_copy_only=False)
                                     .astype(np.int64) for k in ("height", "width", "nChannels", "mode"))
    data = fields["data"]
    offsets, raw = _binary_buffers(data)
    lengths = np.diff(offsets)
    problems = []
    if missing.any():
        problems.append(Problem(missing, lambda r, at: f"null image or image field at {at}"))
    unsupported = ~missing & np.array([_EIGHT_BIT_MODES.get(int(m)) != int(c)
                                       for m, c in zip(mode, channels)], dtype=bool)
    if unsupported.any():
        problems.append(Problem(unsupported, lambda r, at: (
            f"the image at {at} has mode {int(mode[r])} with {int(channels[r])} channel(s); "
            f"only 8-bit images (modes 0, 16, 24: 1, 3 or 4 channels) are read")))
    damaged = ~missing & ~unsupported & (lengths != height * width * channels)
    if damaged.any():
        problems.append(Problem(damaged, lambda r, at: (
            f"the image at {at} has {int(lengths[r])} data bytes for {int(height[r])} x "
            f"{int(width[r])} x {int(channels[r])}")))
    shapes = np.stack([height, width, channels], axis=1)
    expected = np.array([-1 if d is None else d for d in spec.shape])
    misfit = ~missing & ((shapes != expected) & (expected >= 0)).any(axis=1)
    if misfit.any():
        origin = fields.get("origin")
        problems.append(Problem(misfit, lambda r, at: (
            f"the image at {at}{_origin(origin, r)} is {int(height[r])} x {int(width[r])} x "
            f"{int(channels[r])}; the model input takes "
            f"{' x '.join('any' if d is None else str(d) for d in spec.shape)}")))
    bad = missing | unsupported | damaged | misfit
    leaf = np.empty_like(raw)
    starts = offsets[:-1] - offsets[0]
    for r in np.flatnonzero(~bad):  # images are large: one slice each
        c = int(channels[r])
        s, e = int(starts[r]), int(starts[r] + lengths[r])
        leaf[s:e] = raw[s:e].reshape(-1, c)[:, _TO_RGB[c]].reshape(-1)
    return ColumnRead(name, spec, n, leaf, starts, [p for p in problems if p.rows.any()],
                      shapes=shapes if spec.variable else None)


def _binary_buffers(data: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A binary column's offsets (``len + 1``, int64) and its bytes from the first row's
    start to the last row's end (a view of the Arrow buffer)."""
    width: type[np.signedinteger]
    if pa.types.is_large_binary(data.type):
        width = np.int64
    else:
        data = data.cast(pa.binary())
        width = np.int32
    buffers = data.buffers()
    if not len(data) or buffers[1] is None:
        return np.zeros(len(data) + 1, np.int64), np.zeros(0, np.uint8)
    offsets = np.frombuffer(buffers[1], dtype=width)[data.offset:data.offset + len(data) + 1]
    offsets = offsets.astype(np.int64)
    raw = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, raw[int(offsets[0]):int(offsets[-1])]


def _origin(origin: pa.Array | None, row: int) -> str:
    value = origin[row].as_py() if origin is not None else None
    return f" ({value})" if value else ""
