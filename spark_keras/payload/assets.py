"""Asset files (adapted vocabularies, ...) as a dict: read from and written to a folder."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any, Iterator

from spark_keras.errors import PayloadError

Assets = dict[str, bytes]  # relative file path -> contents


def read_tree(root: str) -> Assets:
    out: Assets = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            full = os.path.join(folder, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root).replace(os.sep, "/")] = f.read()
    return out


def write_tree(root: str, assets: Assets) -> None:
    real_root = os.path.realpath(root)
    for rel, data in assets.items():
        full = os.path.realpath(os.path.join(root, rel))
        if not full.startswith(real_root + os.sep):
            raise PayloadError(f"payload corrupted: asset path {rel!r} escapes the asset folder")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)


@contextlib.contextmanager
def asset_folder(assets: Assets) -> Iterator[str | None]:
    """A temporary folder holding ``assets`` for Keras to load from (None if none)."""
    if not assets:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="spark_keras_assets_") as tmp:
        write_tree(tmp, assets)
        yield tmp


@contextlib.contextmanager
def asset_store(assets: Assets, saving_lib: Any) -> Iterator[Any]:
    """A Keras (``saving_lib`` of Keras 3 or tf-keras) reader of ``assets`` for
    ``_load_state``, or None if there are none."""
    with asset_folder(assets) as folder:
        yield saving_lib.DiskIOStore(folder, mode="r") if folder else None
