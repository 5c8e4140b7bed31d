"""Image files' bytes as the rows of an image input: a binary column
(``spark.read.format("binaryFile")``'s ``content``, a parquet column of PNG or JPEG
bytes...) fed to an input of shape ``(H, W, C)`` numbers, decoded in the worker.

Each row is decoded as ``keras.utils.load_img`` decodes the file (PIL: the formats PIL
reads), converted to the input's channels as ``load_img(color_mode="grayscale" | "rgb" |
"rgba")`` converts it (PIL's ``convert``; an input of any channel count keeps 1, 3 or 4,
other modes become RGB), and with ``resize`` resized to the input's height and width as
``load_img(target_size=..., interpolation=...)`` resizes it. A null, a file PIL cannot
decode, or (without ``resize``) an image of another size than the input's is an invalid
row saying which. The pixels stay uint8 (RGB order; a 16- or 32-bit grayscale file read
into one channel keeps its values, as ``load_img`` keeps them) until a model call takes its rows
(:class:`.images.ImageRows`): an Arrow batch is never held whole as float32.

Decoding here costs the worker about 1.4 ms of CPU for a 224 x 224 PNG (PIL and
TensorFlow's decoder alike, measured), where Spark's image data source decodes in the
JVM and hands over rows of raw pixels (docs/benchmarks.md, the peers section).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa

from spark_keras._deps import require
from spark_keras.inference.column_read import IMAGE_DATA, IMAGE_SIZE, NULL, ColumnRead, Problem, nulls
from spark_keras.inference.images import ImagesRead, binary_buffers, check_resize
from spark_keras.inference.specs import TensorSpec

# the input's channels -> PIL's mode (load_img's color_mode)
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
# the modes load_img(color_mode="grayscale") keeps as they are (16-bit PNG: values to 65535)
_GRAY = ("L", "I;16", "I")


def is_image_files(arr: pa.Array, spec: TensorSpec) -> bool:
    """Whether ``arr`` is a binary column fed to an image input (three dimensions of numbers)."""
    t = arr.type
    binary = pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
    return binary and spec.dtype != "string" and len(spec.shape) == 3


def read_image_files(name: str, arr: pa.Array, spec: TensorSpec, resize: str | None = None) -> ColumnRead:
    """The files in ``arr`` decoded as rows of ``spec`` (see the module's docstring)."""
    require("PIL", f"decoding the image files of column {name!r}", "images")
    from PIL import Image

    want_h, want_w, want_c = spec.shape
    check_resize(name, spec, resize)
    n = len(arr)
    missing = nulls(arr)
    offsets, raw = binary_buffers(arr.cast(pa.binary()) if pa.types.is_fixed_size_binary(arr.type) else arr)
    undecodable, misfit = np.zeros(n, bool), np.zeros(n, bool)
    why: dict[int, str] = {}
    found: dict[int, tuple[int, ...]] = {}
    pixels: list[np.ndarray] = []
    for r in np.flatnonzero(~missing):
        data = raw[int(offsets[r] - offsets[0]):int(offsets[r + 1] - offsets[0])]
        try:
            image = _decoded(Image, data, spec.shape, resize)
        except MemoryError:
            raise
        except Image.UnidentifiedImageError:
            undecodable[r], why[int(r)] = True, "of no format PIL reads"
            continue
        except Exception as e:  # noqa: BLE001 - whatever PIL raises on a file is the row's fault
            undecodable[r], why[int(r)] = True, f"{type(e).__name__}: {e}"
            continue
        shape = image if isinstance(image, tuple) else image.shape
        if any(w is not None and w != d for w, d in zip(spec.shape, shape)):
            misfit[r], found[int(r)] = True, shape
            continue
        assert isinstance(image, np.ndarray)  # a shape alone is of another size: a misfit
        pixels.append(image)
    problems = [
        Problem(missing, lambda r, at: f"null image file at {at}", NULL),
        Problem(undecodable, lambda r, at: f"the bytes at {at} are not an image file PIL can "
                f"decode ({why[r]})", IMAGE_DATA),
        Problem(misfit, lambda r, at: (
            f"the image at {at} is {' x '.join(map(str, found[r]))}; the model input takes "
            f"{' x '.join('any' if d is None else str(d) for d in spec.shape)}"
            + ("" if resize is not None else " (resize='bilinear' resizes images to it)")), IMAGE_SIZE)]
    problems = [p for p in problems if p.rows.any()]
    good = ~(missing | undecodable | misfit)
    sizes = np.zeros(n, np.int64)
    sizes[good] = [p.size for p in pixels]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    leaf = np.concatenate([p.reshape(-1) for p in pixels]) if pixels else np.zeros(0, np.uint8)
    if not spec.variable:
        return ImagesRead(name, spec, n, leaf, starts, problems, bgr=False)
    shapes = np.zeros((n, 3), np.int64)
    shapes[good] = [p.shape for p in pixels]
    return ColumnRead(name, spec, n, leaf, starts, problems, shapes=shapes)


def _decoded(Image: Any, data: np.ndarray, shape: tuple[int | None, ...],
             resize: str | None) -> np.ndarray | tuple[int, int, int]:
    """One file as ``(H, W, C)`` uint8, as ``load_img`` would give it; or, for a file of
    another size than the input's (without ``resize``), only the shape it would have: its
    pixels are never decoded. A file declaring more pixels than PIL's
    ``Image.MAX_IMAGE_PIXELS`` is refused before its pixels are decoded (PIL only warns up
    to twice that: a 100 KB PNG of 10,000 x 10,000 would cost the worker a GB)."""
    want_h, want_w, channels = shape
    with Image.open(io.BytesIO(data.data)) as image:
        w, h = image.size
        limit = Image.MAX_IMAGE_PIXELS
        if limit and w * h > limit:
            raise Image.DecompressionBombError(
                f"{w} x {h} pixels, over PIL's Image.MAX_IMAGE_PIXELS ({limit}): a decompression bomb?")
        mode = _MODES.get(channels or 0) or (image.mode if image.mode in _MODES.values() else "RGB")
        if mode == "L" and image.mode in _GRAY:  # load_img's grayscale keeps 16 and 32 bits
            mode = image.mode
        if resize is None and (want_h not in (None, h) or want_w not in (None, w)):
            return h, w, Image.getmodebands(mode)
        converted = image if image.mode == mode else image.convert(mode)
        if resize is not None and converted.size != (want_w, want_h):
            converted = converted.resize((want_w, want_h), Image.Resampling[str(resize).upper()])
        out = np.asarray(converted)
    return out.reshape(*out.shape[:2], -1)
