"""Spark Connect's paths: :class:`ArrowPaths`, the score job's file operations
(:class:`~spark_keras.jobs.score.files.Paths`) with ``pyarrow.fs`` on the client, which has no
JVM to ask. Plain paths are local ones; a URI is opened by ``pyarrow.fs``.
"""

from __future__ import annotations

import os
from typing import Any

from spark_keras.errors import StorageError
from spark_keras.jobs.score.files import Entry, failing, local_place
from spark_keras.spark.paths import scheme

__all__ = ["ArrowPaths"]

_NO_DIRECTORY_MOVE = {"s3", "gcs"}  # object stores: pyarrow moves single objects only


def _is_url(path: str) -> bool:
    """``scheme:/...``: a URI with a path (``file:/x``, ``hdfs://nn/x``), not a plain path."""
    found = scheme(path)
    return found is not None and path[len(found) + 1:].startswith("/")


class ArrowPaths:
    """Spark Connect: ``pyarrow.fs`` on the client. Plain paths are local ones, made
    absolute (``file://``) so that the server and this client mean the same files."""

    def _fs(self, path: str) -> tuple[Any, str]:
        import pyarrow.fs as pafs

        if not _is_url(path):
            return pafs.LocalFileSystem(), os.path.abspath(path)
        try:
            return pafs.FileSystem.from_uri(path)
        except (ValueError, OSError) as exc:  # unknown scheme, no libhdfs, bad URI...
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise StorageError(f"path {path!r} cannot be opened on this Spark Connect client "
                               f"(pyarrow.fs: {reason})") from exc

    def qualify(self, path: str) -> str:
        return path if _is_url(path) else "file://" + os.path.abspath(path)

    def place(self, path: str) -> str:
        return local_place(path)

    def check_output(self, path: str) -> None:
        fs, _ = self._fs(path)
        if fs.type_name in _NO_DIRECTORY_MOVE:
            raise StorageError(f"output path {path!r}: {fs.type_name} cannot rename a folder, "
                               "so the output cannot be published atomically from a Spark "
                               "Connect client; write to a local or HDFS path")

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        fs, fs_path = self._fs(path)
        return fs.get_file_info(fs_path).type != pafs.FileType.NotFound

    def delete(self, path: str) -> None:
        import pyarrow.fs as pafs

        fs, fs_path = self._fs(path)
        kind = fs.get_file_info(fs_path).type
        if kind == pafs.FileType.Directory:
            fs.delete_dir(fs_path)
        elif kind != pafs.FileType.NotFound:
            fs.delete_file(fs_path)

    def move(self, src: str, dst: str) -> None:
        fs, dst_path = self._fs(dst)
        _, src_path = self._fs(src)
        try:
            fs.move(src_path, dst_path)
        except (OSError, NotImplementedError) as exc:
            raise StorageError(f"cannot move the output into {dst!r}: {exc}") from exc

    def make_folder(self, path: str) -> None:
        with failing("create", path):
            fs, fs_path = self._fs(path)
            fs.create_dir(fs_path, recursive=True)

    @staticmethod
    def _entry(info: Any) -> Entry:
        import pyarrow.fs as pafs

        directory = info.type == pafs.FileType.Directory
        mtime_ns = info.mtime_ns or 0
        return Entry(info.base_name, directory, 0 if directory else int(info.size or 0),
                     mtime_ns // 1_000_000)

    def status(self, path: str) -> Entry | None:
        import pyarrow.fs as pafs

        with failing("read", path):
            fs, fs_path = self._fs(path)
            info = fs.get_file_info(fs_path)
            return None if info.type == pafs.FileType.NotFound else self._entry(info)

    def children(self, path: str) -> list[Entry]:
        import pyarrow.fs as pafs

        with failing("list", path):
            fs, fs_path = self._fs(path)
            found = fs.get_file_info(pafs.FileSelector(fs_path, recursive=False))
            return sorted((self._entry(info) for info in found), key=lambda e: e.name)

    def read_bytes(self, path: str) -> bytes:
        with failing("read", path):
            fs, fs_path = self._fs(path)
            with fs.open_input_stream(fs_path) as stream:
                return bytes(stream.read())

    def create(self, path: str, data: bytes) -> None:
        import pyarrow.fs as pafs

        with failing("write", path):
            fs, fs_path = self._fs(path)
            if fs.get_file_info(fs_path).type != pafs.FileType.NotFound:
                raise FileExistsError(f"{path!r} exists")
            fs.create_dir(fs_path.rstrip("/").rpartition("/")[0] or "/", recursive=True)
            with fs.open_output_stream(fs_path) as out:
                out.write(data)
