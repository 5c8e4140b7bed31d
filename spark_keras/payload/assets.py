"""Asset files (adapted vocabularies, ...) as a dict: read from and written to a folder."""

from __future__ import annotations

import os

from ..errors import PayloadError

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
