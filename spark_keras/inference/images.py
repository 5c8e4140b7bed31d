"""Rows of Spark's image data source (``spark.read.format("image")``) as model inputs.

Each row is a struct ``(origin, height, width, nChannels, mode, data)`` whose ``data``
holds ``height x width x nChannels`` bytes in OpenCV order (BGR, BGRA). A row becomes
an ``H x W x C`` array in RGB (RGBA) order, cast to the input's dtype: what
``keras.utils.load_img`` and ``keras.utils.img_to_array`` give for the same PNG file.

* Channels: an image of another channel count than the input's ``C`` (1, 3 or 4) is
  converted as ``load_img(color_mode="grayscale" | "rgb" | "rgba")`` converts it (PIL's
  rules, done in numpy: gray repeated, alpha dropped or set to 255, luma
  ``(19595 R + 38470 G + 7471 B + 2**15) >> 16``).
* Size: with ``resize`` (an interpolation name of ``load_img``: "bilinear", "nearest"...)
  an image of another height and width is resized to the input's as
  ``load_img(target_size=..., interpolation=...)`` resizes it (with PIL, after the channel
  conversion); without it such a row is invalid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from spark_keras.errors import ModelInputError
from spark_keras.inference.column_read import (
    IMAGE_DATA,
    IMAGE_MODE,
    IMAGE_SIZE,
    NULL,
    ColumnRead,
    Problem,
    nulls,
    runs,
)
from spark_keras.inference.specs import TensorSpec

# OpenCV types Spark's reader produces for 8-bit images: CV_8UC1, CV_8UC3, CV_8UC4
_EIGHT_BIT_MODES = {0: 1, 16: 3, 24: 4}
# BGR(A) -> RGB(A), by channel count
_TO_RGB = {1: [0], 3: [2, 1, 0], 4: [2, 1, 0, 3]}
_PIL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def read_images(name: str, arr: pa.StructArray, spec: TensorSpec,
                resize: str | None = None) -> ColumnRead:
    """The images as rows of ``spec``: their bytes in RGB order, converted to the input's
    channels and (with ``resize``) size, each row's ``(H, W, C)``, and the rows that cannot
    be scored (null, not 8-bit, damaged, or of a size the input does not take)."""
    if len(spec.shape) != 3 or spec.dtype == "string":
        raise ModelInputError(
            f"column {name!r} holds images (Spark's image data source); the model input "
            f"{spec.name!r} expects {spec.describe()} per row, not an image of shape "
            f"(height, width, channels)")
    want_h, want_w, want_c = spec.shape
    check_resize(name, spec, resize)
    n = len(arr)
    fields = dict(zip((f.name for f in arr.type), arr.flatten()))
    missing = nulls(arr) | nulls(fields["data"])
    for key in ("height", "width", "nChannels", "mode"):
        missing |= nulls(fields[key])
    height, width, channels, mode = (fields[k].fill_null(0).to_numpy(zero_copy_only=False)
                                     .astype(np.int64) for k in ("height", "width", "nChannels", "mode"))
    data = fields["data"]
    offsets, raw = binary_buffers(data)
    lengths = np.diff(offsets)
    problems = []
    if missing.any():
        problems.append(Problem(missing, lambda r, at: f"null image or image field at {at}",
                                NULL))
    unsupported = ~missing & np.array([_EIGHT_BIT_MODES.get(int(m)) != int(c)
                                       for m, c in zip(mode, channels)], dtype=bool)
    if unsupported.any():
        problems.append(Problem(unsupported, lambda r, at: (
            f"the image at {at} has mode {int(mode[r])} with {int(channels[r])} channel(s); "
            f"only 8-bit images (modes 0, 16, 24: 1, 3 or 4 channels) are read"), IMAGE_MODE))
    damaged = ~missing & ~unsupported & (lengths != height * width * channels)
    if damaged.any():
        problems.append(Problem(damaged, lambda r, at: (
            f"the image at {at} has {int(lengths[r])} data bytes for {int(height[r])} x "
            f"{int(width[r])} x {int(channels[r])}"), IMAGE_DATA))
    # what each row becomes: the input's channels, and its size if resized
    out_c = channels if want_c is None or want_c not in _PIL_MODES else np.full(n, want_c)
    out_h = height if resize is None or want_h is None else np.full(n, want_h)
    out_w = width if resize is None or want_w is None else np.full(n, want_w)
    shapes = np.stack([out_h, out_w, out_c], axis=1)
    expected = np.array([-1 if d is None else d for d in spec.shape])
    misfit = ~missing & ((shapes != expected) & (expected >= 0)).any(axis=1)
    if misfit.any():
        origin = fields.get("origin")
        problems.append(Problem(misfit, lambda r, at: (
            f"the image at {at}{_origin(origin, r)} is {int(height[r])} x {int(width[r])} x "
            f"{int(channels[r])}; the model input takes "
            f"{' x '.join('any' if d is None else str(d) for d in spec.shape)}"
            + ("" if resize is not None else " (resize='bilinear' resizes images to it)")),
            IMAGE_SIZE))
    bad = missing | unsupported | damaged | misfit
    starts = offsets[:-1] - offsets[0]
    changed = ~bad & ((out_c != channels) | (out_h != height) | (out_w != width))
    if not changed.any() and not spec.variable:  # the common case: every image as the input takes it
        return ImagesRead(name, spec, n, raw, starts, [p for p in problems if p.rows.any()])
    if not changed.any():  # the bytes in place, channels reordered
        leaf = np.empty_like(raw)
        for r in np.flatnonzero(~bad):  # images are large: one slice each
            c = int(channels[r])
            s, e = int(starts[r]), int(starts[r] + lengths[r])
            leaf[s:e] = raw[s:e].reshape(-1, c)[:, _TO_RGB[c]].reshape(-1)
    else:
        out_sizes = np.where(bad, 0, out_h * out_w * out_c)
        starts = np.concatenate([[0], np.cumsum(out_sizes)[:-1]]).astype(np.int64)
        leaf = np.zeros(int(out_sizes.sum()), np.uint8)
        for r in np.flatnonzero(~bad):
            h, w, c = int(height[r]), int(width[r]), int(channels[r])
            s = int(offsets[r] - offsets[0])
            pixels = raw[s:s + h * w * c].reshape(h, w, c)[:, :, _TO_RGB[c]]
            pixels = convert_channels(pixels, int(out_c[r]))
            if (int(out_h[r]), int(out_w[r])) != (h, w):
                assert resize is not None
                pixels = resized(pixels, int(out_h[r]), int(out_w[r]), resize)
            leaf[int(starts[r]):int(starts[r]) + pixels.size] = pixels.reshape(-1)
    return ColumnRead(name, spec, n, leaf, starts, [p for p in problems if p.rows.any()],
                      shapes=shapes if spec.variable else None)


def check_resize(name: str, spec: TensorSpec, resize: str | None) -> None:
    """Refuse ``resize`` for an image input of unknown height or width (nothing to resize to)."""
    if resize is not None and (spec.shape[0] is None or spec.shape[1] is None):
        raise ModelInputError(
            f"column {name!r}: resize={resize!r} resizes images to the model input's height "
            f"and width, and {spec.name!r} takes any ({spec.describe()})")


@dataclass
class ImagesRead(ColumnRead):
    """The read of images that all have the input's height, width and channels: ``leaf``
    holds their uint8 bytes, in BGR(A) order as Spark stores them (``bgr``) or already
    in RGB(A), and :meth:`values` gives :class:`ImageRows`."""

    bgr: bool = True

    def values(self, keep: np.ndarray | None = None) -> Any:  # an ImageRows, array-like
        assert self.starts is not None
        starts = self.starts if keep is None else self.starts[keep]
        return ImageRows(self.leaf, starts, self.spec.known_shape, self.spec.dtype, bgr=self.bgr)


class ImageRows:
    """Images as the model input's ``(rows, H, W, C)`` array, made when sliced: each slice
    (a model call's rows) converted then, from the Arrow buffer's BGR(A) bytes (or RGB(A)
    bytes, ``bgr=False``) to RGB(A) in the input's dtype, in one pass. A batch so never
    holds more converted rows than its calls take (an Arrow batch of 64 MiB of pixels
    would be 256 MiB of float32), and a call's rows can be made while the model computes
    the previous call's (:mod:`.ahead`). ``numpy.asarray`` gives every row."""

    rows_on_demand = True

    def __init__(self, raw: np.ndarray, starts: np.ndarray, shape: tuple[int, ...],
                 dtype: str, bgr: bool = True) -> None:
        self._raw, self._starts, self._bgr = raw, np.asarray(starts, dtype=np.int64), bgr
        self._shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self._starts), *self._shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self._shape)

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            return self._made(self._starts[index])
        picked = np.asarray(index)
        if picked.ndim == 0 and np.issubdtype(picked.dtype, np.integer):  # one image
            return self._made(self._starts[[int(picked)]])[0]
        if picked.dtype == bool or np.issubdtype(picked.dtype, np.integer):
            return self._made(self._starts[picked])
        return np.asarray(self)[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._made(self._starts)
        return out if dtype is None else out.astype(dtype, copy=False)

    def _made(self, starts: np.ndarray) -> np.ndarray:
        """The images starting at ``starts``, converted: rows that follow each other in
        the buffer copied as one run (:func:`.column_read.runs`)."""
        h, w, c = self._shape
        size = h * w * c
        out = np.empty((len(starts), h, w, c), dtype=self.dtype)
        for a, b, first in runs(starts, size):
            stored = self._raw[first:first + (b - a) * size].reshape(b - a, h, w, c)
            if c == 1 or not self._bgr:
                out[a:b] = stored
            else:  # BGR(A) -> RGB(A), cast as it is copied
                out[a:b, ..., :3] = stored[..., 2::-1]
                if c == 4:
                    out[a:b, ..., 3] = stored[..., 3]
        return out


def convert_channels(pixels: np.ndarray, channels: int) -> np.ndarray:
    """``(H, W, C)`` uint8 gray, RGB or RGBA as ``channels`` (1, 3, 4) the way PIL's
    ``Image.convert`` (and so ``keras.utils.load_img(color_mode=...)``) converts it."""
    have = pixels.shape[-1]
    if have == channels:
        return pixels
    if channels == 1:  # PIL's L: ITU-R 601-2 luma, in 16.16 fixed point, alpha ignored
        rgb = pixels[..., :3].astype(np.uint32)
        luma = (rgb[..., 0] * 19595 + rgb[..., 1] * 38470 + rgb[..., 2] * 7471 + 0x8000) >> 16
        return luma.astype(np.uint8)[..., None]
    rgb = np.repeat(pixels, 3, axis=-1) if have == 1 else pixels[..., :3]
    if channels == 3:
        return np.ascontiguousarray(rgb)
    alpha = np.full((*rgb.shape[:2], 1), 255, np.uint8)
    return np.concatenate([rgb, alpha], axis=-1)


def resized(pixels: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    """``(H, W, C)`` uint8 pixels resized by PIL as ``load_img(target_size=(height,
    width), interpolation=...)`` resizes them."""
    from spark_keras._deps import require

    require("PIL", "resize= on image columns", "images")
    from PIL import Image

    c = pixels.shape[-1]
    image = Image.fromarray(pixels[..., 0] if c == 1 else pixels, _PIL_MODES[c])
    # load_img's interpolation names are PIL's filters, lower case (options.RESIZE)
    out = np.asarray(image.resize((width, height), Image.Resampling[interpolation.upper()]))
    return out.reshape(height, width, c)


def binary_buffers(data: pa.Array) -> tuple[np.ndarray, np.ndarray]:
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
