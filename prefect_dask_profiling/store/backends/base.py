"""What differs between store backends: the :class:`Backend` base class, with fsspec's generic
calls as defaults (right for any fsspec protocol: :class:`FsspecBackend`); :mod:`.local` and
:mod:`.s3` override what they do better. A backend raises its filesystem's exceptions as
they are: the store turns them into its error leaves and trips its breaker."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Required, TypedDict

from prefect_dask_profiling.store.url import protocol_of, public_url


class FileInfo(TypedDict, total=False):
    """One entry of a store listing: fsspec's ``info`` of a local file, or an S3
    ``ListObjectsV2`` item with fsspec's ``name``, ``size`` and ``type`` added; which time
    keys it has depends on the filesystem (``retention.mtime`` reads the first present)."""

    name: str
    size: int
    type: Required[str]
    LastModified: datetime
    last_modified: datetime | float
    mtime: datetime | float
    modified: datetime | float
    created: datetime | float


class Folders(NamedTuple):
    """Folder names below a folder, and whether the listing started part-way (``bounded``:
    only names after the ``start_after`` asked for, maybe stopped past ``stop``) or is
    the whole listing."""

    names: list[str]
    bounded: bool


@dataclass(frozen=True)
class LifecyclePlan:
    """The lifecycle rules a backend keeps on its storage: where they go (``container``,
    an S3 bucket), the prefix that expires, the rules, and the permissions they need."""

    container: str
    expiring: str
    rules: list[Any]
    permissions: str


class Backend:
    """One kind of storage under one root: its filesystem and the operations that differ.

    Parameters
    ----------
    url
        The checked store URL (``check_store_url``), credentials possibly in it.
    storage_options
        Filesystem options (``endpoint_url``, ``key``, ...); never written anywhere.
    timeout
        Upper bound in seconds for any one storage call.

    Attributes
    ----------
    fs
        The fsspec filesystem.
    root
        The root as the filesystem spells paths (``bucket/prefix``, ``/abs/folder``).
    url
        The root as shown and stored (no credentials): locations are ``<url>/<rel>``.
    call_kw
        Keyword arguments bounding one call: fsspec's ``timeout`` on an async filesystem.
    """

    name = "fsspec"  # what ``RunStore.kind`` says

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        from fsspec.asyn import AsyncFileSystem

        self.timeout = timeout
        self.fs, self.root, self.url = self.connect(url, storage_options)
        self.call_kw: dict[str, float] = (
            {"timeout": timeout} if isinstance(self.fs, AsyncFileSystem) else {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def connect(self, url: str, storage_options: dict[str, Any]) -> tuple[Any, str, str]:
        """The filesystem, root and public URL of ``url``: fsspec's ``url_to_fs``."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(url, **storage_options)
        return fs, root.rstrip("/"), public_url(url)

    # ------------------------------------------------------------------ paths
    def path(self, rel: str) -> str:
        """The filesystem path of ``rel``, a path relative to the root (``""``: the root)."""
        return f"{self.root}/{rel}" if rel else self.root

    def _below(self, rel: str) -> str:
        """The filesystem path of folder ``rel`` without protocol, ending in ``/``."""
        return self.fs._strip_protocol(self.path(rel)).rstrip("/") + "/"

    # ------------------------------------------------------------------ writing
    def put(self, rel: str, data: bytes, exclusive: bool, options: dict[str, Any]) -> None:
        """Write ``data`` to ``rel``; ``exclusive``: fail when it exists (fsspec's
        ``mode="create"``). ``options`` bound the call (``StoreAccess.call_options``)."""
        self.fs.pipe_file(self.path(rel), data, mode="create" if exclusive else "overwrite",
                          **options)

    def put_whole(self, rel: str, data: bytes, options: dict[str, Any]) -> None:
        """Write ``data`` to ``rel`` so that no reader sees half of it: one PUT (objects
        appear whole)."""
        self.fs.pipe_file(self.path(rel), data, **options)

    # ------------------------------------------------------------------ listing
    def children(self, rel: str) -> list[str]:
        """Names directly below folder ``rel`` (one listing; ``[]`` when there is none)."""
        base = self._below(rel)
        try:
            found = self.fs.ls(self.path(rel), detail=False, **self.call_kw)
        except (FileNotFoundError, NotADirectoryError):
            return []
        names = []
        for path in found:
            path = self.fs._strip_protocol(path).rstrip("/")
            if path.startswith(base):
                names.append(path[len(base):])
        return [n for n in names if n and "/" not in n]

    def listing(self, rel: str) -> dict[str, FileInfo]:
        """Entries directly below folder ``rel`` with their info (``type`` is ``directory``
        or ``file``); ``{}`` when there is none."""
        base = self._below(rel)
        try:
            found = self.fs.ls(self.path(rel), detail=True, **self.call_kw)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        out = {}
        for info in found:
            path = self.fs._strip_protocol(info["name"]).rstrip("/")
            name = path[len(base):] if path.startswith(base) else ""
            if name and "/" not in name:
                out[name] = info
        return out

    def find(self, rel: str) -> dict[str, FileInfo]:
        """Files below ``rel`` as ``{path relative to the root: info}``."""
        try:
            found = self.fs.find(self.path(rel), detail=True, **self.call_kw)
        except FileNotFoundError:
            return {}
        root, below = self._below(""), self._below(rel)
        out = {}
        for path, info in found.items():
            path = self.fs._strip_protocol(path)
            if path.startswith(below) and info.get("type", "file") == "file":
                out[path[len(root):]] = info
        return out

    def folders(self, rel: str, start_after: str, stop: str | None) -> Folders:
        """Folder names below ``rel``, from ``start_after`` on where the backend can start a
        listing part-way (then stopped past ``stop``). Here: every name, not bounded."""
        return Folders(self.children(rel), bounded=False)

    # ------------------------------------------------------------------ retention, links
    def lifecycle(self, retention_days: int) -> LifecyclePlan | None:
        """The rules that expire ``reports/`` after ``retention_days``; ``None``: this
        storage has no lifecycle rules (old reports go by ``sweep``)."""
        return None

    def put_lifecycle(self, plan: LifecyclePlan) -> None:
        """Put ``plan``'s rules in place (merged with the rules already there)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no lifecycle rules")

    def link_expiry(self, expires_s: int) -> int | None:
        """How long a signed link asked for ``expires_s`` seconds is valid; ``None``: this
        storage signs no links."""
        return None

    def presign(self, rel: str, expires_s: int) -> str | None:
        """A signed GET link to ``rel``, or ``None`` (here: no links are signed)."""
        return None


class FsspecBackend(Backend):
    """Any other fsspec protocol (``memory://``, ``gcs://``, ...): the defaults, named by
    the protocol."""

    def __init__(self, url: str, storage_options: dict[str, Any], timeout: float) -> None:
        super().__init__(url, storage_options, timeout)
        self.name = protocol_of(url) or self.name
