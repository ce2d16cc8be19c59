"""The local backend: a folder on this machine (a plain path, ``file://`` or ``local://``).

Different from fsspec's defaults where the operating system does better: an exclusive
write is an atomic ``O_EXCL`` create, a file written whole is written aside and renamed,
and run folders are listed by name only (no ``stat`` per folder).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from prefect_dask_profiling.store.backends.base import Backend, Folders


class LocalBackend(Backend):
    """A folder on this machine, through fsspec's ``LocalFileSystem``."""

    name = "local"

    def connect(self, url: str, storage_options: dict[str, Any]) -> tuple[Any, str, str]:
        """``LocalFileSystem`` (folders made on write) and the absolute folder, as root and
        URL; ``storage_options`` are not used."""
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        root = os.path.abspath(os.path.expanduser(fsspec.core.split_protocol(url)[1]))
        return LocalFileSystem(auto_mkdir=True), root, root

    def put(self, rel: str, data: bytes, exclusive: bool, options: dict[str, Any]) -> None:
        """As :meth:`Backend.put`; an exclusive write is an atomic ``O_EXCL`` create."""
        if not exclusive:
            super().put(rel, data, exclusive, options)
            return
        with self.fs.open(self.path(rel), "xb") as f:
            f.write(data)

    def put_whole(self, rel: str, data: bytes, options: dict[str, Any]) -> None:
        """Write aside (``.<name>.<random>.tmp`` in the same folder), then rename: readers
        never see a half-written file."""
        path = self.path(rel)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        stem = os.path.splitext(os.path.basename(path))[0]
        tmp = f"{folder}/.{stem}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def folders(self, rel: str, start_after: str, stop: str | None) -> Folders:
        """Every name below ``rel`` by ``os.listdir``: names only, no ``stat``, no path
        handling per folder (100,000 run folders stay cheap); not bounded."""
        try:
            return Folders(os.listdir(self.path(rel)), bounded=False)
        except (FileNotFoundError, NotADirectoryError):
            return Folders([], bounded=False)
