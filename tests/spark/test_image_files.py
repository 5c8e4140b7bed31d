"""Image files' bytes (a binary column: ``binaryFile``'s ``content``) fed to an image input
are decoded in the worker as ``keras.utils.load_img`` + ``img_to_array`` decode the same
files (:mod:`spark_keras.inference.image_files`): every channel count converted to the
input's, every size resized with ``resize=``; a file that cannot be decoded, or of
another size without ``resize``, is an invalid row saying why. On the engine (no Spark)
and through the workers."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import spark_keras as sk
from spark_keras.inference.columns import from_arrow
from spark_keras.inference.engine import model_inputs
from tests.spark.test_images import SHAPE, _keras, _signature, echoed_as_load_img, pngs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(600)


def _files(data: dict[str, bytes]) -> tuple[list[str], pa.Array]:
    names = sorted(data)
    return names, pa.array([data[n] for n in names], pa.binary())


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("size, resize", [(SHAPE, None), ((7, 9), "bilinear"), ((3, 2), "bicubic")])
def test_files_decoded_as_load_img(pngs, channels, size, resize):  # noqa: F811
    _, data = pngs
    names, column = _files(data)
    (x,), invalid = model_inputs(from_arrow(["content"], [column]), _signature((*size, channels)),
                                 "null", resize=resize)
    assert invalid is None and x.shape == (3, *size, channels) and x.dtype == np.float32
    for got, name in zip(x, names):
        want = _keras(data[name], channels, size if resize else None, resize or "nearest")
        np.testing.assert_array_equal(got, want, err_msg=f"{name} as {channels} channel(s)")


def test_bad_files_are_invalid_rows_saying_why(pngs):  # noqa: F811
    _, data = pngs
    good = data["color.png"]
    column = pa.array([good, None, b"not an image", good[:60], good], pa.binary())
    (x,), invalid = model_inputs(from_arrow(["content"], [column]), _signature((*SHAPE, 3)), "null")
    assert invalid.tolist() == [False, True, True, True, False] and len(x) == 2
    np.testing.assert_array_equal(x[1], _keras(good, 3))
    for first, shape, reason in (
            (None, SHAPE, r"null image file at row 0 of this batch"),
            (b"junk", SHAPE, r"the bytes at row 0 of this batch are not an image file PIL can decode "
                             r"\(of no format PIL reads\)"),
            (good[:60], SHAPE, r"not an image file PIL can decode \((OSError|SyntaxError)"),
            (good, (8, 8), r"is 4 x 5 x 3; the model input takes 8 x 8 x 3 \(resize='bilinear'")):
        with pytest.raises(sk.ModelInputError, match=reason):
            model_inputs(from_arrow(["content"], [pa.array([first, good], pa.binary())]),
                         _signature((*shape, 3)))


def test_files_decoded_in_the_workers(spark, pngs):  # noqa: F811
    folder, data = pngs
    echoed_as_load_img(spark, spark.read.format("binaryFile").load(str(folder)), "content", "path", data)


def test_a_binary_column_for_a_flat_input_is_still_a_column_error():
    with pytest.raises(sk.ModelInputError, match=r"column 'content' has type binary; the model input "
                                                 r"'img' expects numbers"):
        model_inputs(from_arrow(["content"], [pa.array([b"x"], pa.binary())]), _signature((3,)))



def _png_of_zeros(width: int, height: int, broken: bool = False) -> bytes:
    """A grayscale PNG of ``width`` x ``height`` zeros, as small as zlib makes it: 10,000 x
    10,000 is about 100 KB (``broken``: its pixel data is no zlib stream)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z, row = zlib.compressobj(9), b"\0" * (1 + width)
    body = b"no zlib" if broken else b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


@pytest.mark.parametrize("resize", [None, "bilinear"])
def test_a_decompression_bomb_is_an_invalid_row_never_decoded(pngs, resize):  # noqa: F811
    """10,000 x 10,000 pixels is over PIL's MAX_IMAGE_PIXELS (89 M) but under the twice of it
    at which PIL itself refuses (it only warns): decoded, the 100 KB file cost the worker
    about 1 GB and, resized, was scored as a valid row."""
    good = pngs[1]["color.png"]
    column = pa.array([good, _png_of_zeros(10_000, 10_000), good], pa.binary())
    with pytest.raises(sk.ModelInputError, match=r"row 1 of this batch are not an image file PIL can "
                                                 r"decode \(DecompressionBombError: 10000 x 10000 pixels, "
                                                 r"over PIL's Image.MAX_IMAGE_PIXELS \(89478485\)"):
        model_inputs(from_arrow(["content"], [column]), _signature((*SHAPE, 3)), resize=resize)
    (x,), invalid = model_inputs(from_arrow(["content"], [column]), _signature((*SHAPE, 3)), "null",
                                 resize=resize)
    assert invalid.tolist() == [False, True, False] and len(x) == 2


def test_a_file_of_another_size_is_refused_from_its_header(pngs):  # noqa: F811
    """Without resize, an image of another size is refused by the size its header declares, its
    pixels never decoded: a file whose pixel data is broken is refused for its size, not for
    its data."""
    good = pngs[1]["color.png"]
    column = pa.array([_png_of_zeros(4000, 3000, broken=True), good], pa.binary())
    with pytest.raises(sk.ModelInputError, match=r"the image at row 0 of this batch is 3000 x 4000 x 3; "
                                                 r"the model input takes 4 x 5 x 3"):
        model_inputs(from_arrow(["content"], [column]), _signature((*SHAPE, 3)))


@pytest.mark.parametrize("resize", [None, "bilinear"])
def test_a_16_bit_grayscale_file_keeps_its_values_as_load_img_does(pngs, resize):  # noqa: F811
    """load_img(color_mode="grayscale") keeps a 16-bit PNG's values (to 65535); converted to
    8 bits, every value over 255 read as 255."""
    import io

    from PIL import Image

    deep = io.BytesIO()
    Image.fromarray((np.arange(20, dtype=np.uint16).reshape(SHAPE) * 3000)).save(deep, "PNG")
    files = [pngs[1]["color.png"], deep.getvalue()]
    (x,), invalid = model_inputs(from_arrow(["content"], [pa.array(files, pa.binary())]),
                                 _signature((*SHAPE, 1)), "null", resize=resize)
    assert invalid is None and x.max() == 57_000
    for got, data in zip(x, files):
        np.testing.assert_array_equal(got, _keras(data, 1, SHAPE if resize else None, resize or "nearest"))
