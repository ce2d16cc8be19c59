"""File access for the run store: one filesystem under one root, bounded calls, the breaker.

:class:`StoreAccess` is the base of every part of
:class:`~prefect_dask_profiling.store.runs.RunStore`: its backend
(:mod:`~prefect_dask_profiling.store.backends`) resolves the URL; it does the store's few
primitive calls within the store's timeout, and every failure becomes one credential-free
:class:`~prefect_dask_profiling.errors.StoreError` leaf. The :class:`Breaker` treats a store
that did not answer as down for :data:`STORE_DOWN_S` seconds."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.store import compression, layout, s3
from prefect_dask_profiling.store import url as store_url
from prefect_dask_profiling.store.backends import open_backend
from prefect_dask_profiling.store.backends.base import Backend, FileInfo
from prefect_dask_profiling.store.errors import (
    DamagedRecord,
    StoreAccessDenied,
    StoreConflict,
    StoreError,
    StoreNotFound,
    StoreUnreachable,
)
from prefect_dask_profiling.store.manifest import is_provisional
from prefect_dask_profiling.store.memory import ReadMemory
from prefect_dask_profiling.store.spool import Spool, default_spool_dir
from prefect_dask_profiling.store.tables import first_line

logger = logging.getLogger(__name__)

STORE_DOWN_S = 30.0  # after a failure, spool directly for this long instead of waiting again
_UNREACHABLE = {"ConnectionError", "ReadTimeoutError", "ConnectionClosedError",
                "ClientConnectorError", "ServerDisconnectedError", "EndpointConnectionError",
                "ConnectTimeoutError"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
_T = TypeVar("_T")


class Breaker:
    """Whether the store is known to be down: tripped by a failure, reset by a success."""

    def __init__(self, hold_s: float = STORE_DOWN_S) -> None:
        self.hold_s = hold_s
        self._until = 0.0

    def down(self) -> bool:
        """Whether the store failed less than ``hold_s`` seconds ago."""
        return time.monotonic() < self._until

    def trip(self) -> None:
        """The store failed: treat it as down for ``hold_s`` seconds."""
        self._until = time.monotonic() + self.hold_s

    def trip_if_unreachable(self, exc: BaseException) -> None:
        """Trip after a timeout or a refused connection (not after a refusal such as a 403)."""
        if unreachable(exc):
            self.trip()

    def reset(self) -> None:
        """The store answered again."""
        self._until = 0.0


class StoreAccess:
    """One filesystem under one root: paths, bounded primitive calls, their errors.

    Parameters
    ----------
    url
        Root URL: a local folder (plain path or ``file://``), ``s3://bucket[/prefix]`` or any
        fsspec URL. ``None`` reads ``$DASK_PROFILING_STORE``, else ``./.dask-profiling``.
    storage_options
        Filesystem options (``endpoint_url``, ``key``, ``secret``, ...). ``None`` reads JSON
        from ``$DASK_PROFILING_STORAGE_OPTIONS``. They are never written anywhere.
    spool_dir
        Where unwritable files wait for delivery (default: ``default_spool_dir()``).
    timeout
        Upper bound in seconds for any one storage call.
    """

    def __init__(self, url: str | None = None, storage_options: dict | None = None, *,
                 spool_dir: str | os.PathLike | None = None, timeout: float = 10.0) -> None:
        raw = store_url.check_store_url(store_url.resolve_url(url))
        if storage_options is None:
            storage_options = store_url.env_storage_options()
        if not isinstance(storage_options, dict):
            raise InvalidInput("storage_options must be a dict")
        if not (isinstance(timeout, int | float) and not isinstance(timeout, bool)
                and math.isfinite(timeout) and timeout > 0):
            raise InvalidInput(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._secrets = store_url.secret_values(storage_options)
        self.backend: Backend = open_backend(raw, storage_options, self.timeout)
        self.fs, self.root, self.url = self.backend.fs, self.backend.root, self.backend.url
        self._kw = self.backend.call_kw
        self.spool_dir = Path(spool_dir).expanduser() if spool_dir else default_spool_dir()
        self.spool = Spool(self.spool_dir, self.url,
                           store_url.location_options(storage_options,
                                                      store_url.protocol_of(raw)))
        self.breaker = Breaker()
        self.memory = ReadMemory()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def kind(self) -> str:
        """The backend's name: ``local``, ``s3`` or another fsspec protocol (read-only)."""
        return self.backend.name

    # ------------------------------------------------------------------ paths
    def location(self, rel: str) -> str:
        """The full location (URL or local path) of ``rel``, a path relative to the root."""
        return f"{self.url}/{rel}"

    def _path(self, rel: str) -> str:
        return self.backend.path(rel)

    def _relative(self, location: str) -> str:
        prefix = f"{self.url}/"
        rel = location[len(prefix):] if location.startswith(prefix) else location
        if "://" in rel or rel.startswith("/") or not rel:
            raise InvalidInput(f"location {location!r} is not inside store {self.url!r}")
        for part in rel.split("/"):
            validate_name(part, "location")
        return rel

    def exists(self, location: str) -> bool:
        """Whether ``location`` (inside this store) exists; ``StoreError`` if the store fails."""
        return self._exists(self._relative(location))

    def root_exists(self) -> bool:
        """Whether the store's root exists; ``StoreUnreachable``/``StoreAccessDenied`` (or
        another ``StoreError``) naming the store when it cannot be asked (``fs.exists``
        answers ``False`` for an endpoint that does not answer; ``fs.info`` raises)."""
        self._check_reachable()
        try:
            self.fs.info(self._path(""), **self._kw)
        except FileNotFoundError:
            return False
        except Exception as exc:
            raise self._failure(exc, f"could not reach {self.url}") from None
        return True

    # ------------------------------------------------------------------ errors
    def _check_reachable(self) -> None:
        """Fail at once while the store is known to be down, instead of waiting again."""
        if self.breaker.down():
            raise StoreUnreachable(f"could not reach {self.url}: it did not answer moments ago")

    def _failure(self, exc: BaseException, message: str) -> StoreError:
        """The error leaf for ``exc``, with ``message`` and the cause in one line; trips the
        breaker when the store did not answer."""
        text = f"{message}: {self._describe(exc)}"
        if unreachable(exc):
            self.breaker.trip()
            return StoreUnreachable(text)
        if isinstance(exc, PermissionError) or s3.error_code(exc) in _DENIED:
            return StoreAccessDenied(text)
        if isinstance(exc, FileNotFoundError):
            return StoreNotFound(text)
        return StoreError(text)

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):  # fsspec's FSTimeoutError has no message
            return f"{type(exc).__name__}: no answer within the {self.timeout:g} s timeout"
        return self._redact(f"{type(exc).__name__}: {first_line(exc)}")

    def _redact(self, text: str) -> str:
        return store_url.redact(text, self._secrets)

    # ------------------------------------------------------------------ writing
    def call_options(self, size: int = 0, timeout: float | None = None) -> dict[str, float]:
        """Keyword arguments that bound one filesystem call sending ``size`` bytes: fsspec's
        per-call ``timeout`` on an async filesystem (S3) — the store's timeout plus one
        second per MiB, so big payloads get time to travel — and nothing elsewhere."""
        if not self._kw:
            return {}
        return {"timeout": (timeout or self.timeout) + size / 2**20}

    def _put(self, rel: str, data: bytes, exclusive: bool,
             timeout: float | None = None) -> None:
        self.memory.forget()
        self.backend.put(rel, data, exclusive, self.call_options(len(data), timeout))

    def _put_checked(self, rel: str, data: bytes, exclusive: bool,
                     timeout: float | None = None) -> None:
        """:meth:`_put`; an exclusive create that finds the object already there succeeds when
        the stored bytes are the same (an earlier attempt's answer was lost), else raises
        :class:`~prefect_dask_profiling.errors.StoreConflict`. A provisional manifest may be
        replaced by the run's final one."""
        try:
            self._put(rel, data, exclusive, timeout)
        except Exception as exc:
            if not (exclusive and s3.is_exists_error(exc)):
                raise
            remote = self.fs.cat_file(self._path(rel), **self._kw)
            if same_content(rel, remote, data):
                logger.debug("%s was already stored byte-identical", self.location(rel))
                return
            if rel.endswith("/" + layout.MANIFEST) and is_provisional(remote):
                self._put(rel, data, False, timeout)
                return
            raise StoreConflict(f"{self.location(rel)} already exists with different "
                                "content") from None

    # ------------------------------------------------------------------ reading
    def _read(self, rel: str, what: str) -> bytes:
        self._check_reachable()
        try:
            return self.fs.cat_file(self._path(rel), **self._kw)
        except Exception as exc:
            raise self._read_error(rel, what, exc) from None

    def _read_error(self, rel: str, what: str, exc: BaseException) -> StoreError:
        if isinstance(exc, FileNotFoundError):
            return StoreNotFound(f"{what} not found: no {self.location(rel)}")
        return self._failure(exc, f"could not read {self.location(rel)}")

    def _read_many(self, items: dict[str, str]) -> dict[str, bytes | StoreError]:
        """Read ``{path: what it is}`` at once: each path's bytes, or the ``StoreError`` of
        :meth:`_read`. Concurrent on an async filesystem (S3), one by one elsewhere."""
        from fsspec.asyn import AsyncFileSystem

        paths = {self.fs._strip_protocol(self._path(rel)): rel for rel in items}
        globbed = any(c in path for path in paths for c in "*?[")  # fs.cat() would expand them
        if len(items) < 2 or not isinstance(self.fs, AsyncFileSystem) or globbed:
            out: dict[str, bytes | StoreError] = {}
            for rel, what in items.items():
                try:
                    out[rel] = self._read(rel, what)
                except StoreError as exc:
                    out[rel] = exc
            return out
        try:
            self._check_reachable()
            # aiobotocore's pool sends at most 10 at a time: a timeout per 32 files
            timeout = self.timeout * math.ceil(len(paths) / 32)
            found = self.fs.cat(list(paths), on_error="return", timeout=timeout)
        except StoreError as exc:
            return dict.fromkeys(items, exc)
        except Exception as exc:
            error = self._failure(exc, f"could not read {len(items)} files under {self.url}")
            return dict.fromkeys(items, error)
        out = {}
        for path, rel in paths.items():
            data = found.get(path, FileNotFoundError(path))
            out[rel] = (self._read_error(rel, items[rel], data)
                        if isinstance(data, BaseException) else data)
        return out

    def _exists(self, rel: str) -> bool:
        self._check_reachable()
        try:
            return bool(self.fs.exists(self._path(rel), **self._kw))
        except Exception as exc:
            raise self._failure(exc, f"could not reach {self.url}") from None

    def _children(self, rel: str) -> list[str]:
        """Names directly below folder ``rel`` (one listing; ``[]`` when there is none)."""
        return self._listed(rel, self.backend.children)

    def _listing(self, rel: str) -> dict[str, FileInfo]:
        """Entries directly below folder ``rel`` with their info (``type`` is ``directory``
        or ``file``); ``{}`` when there is none."""
        return self._listed(rel, self.backend.listing)

    def _find(self, rel: str) -> dict[str, FileInfo]:
        """Files below ``rel`` as ``{path relative to the root: info}``."""
        return self._listed(rel, self.backend.find)

    def _listed(self, rel: str, listing: Callable[[str], _T]) -> _T:
        """``listing(rel)``, one of the backend's listings of folder ``rel``, after the
        breaker's check; its failure as the store's error leaf."""
        self._check_reachable()
        try:
            return listing(rel)
        except Exception as exc:
            raise self._failure(exc, f"could not list {self.location(rel)}") from None


def same_content(rel: str, stored: bytes, data: bytes) -> bool:
    """Whether ``stored``, the bytes the store holds at ``rel``, are what writing ``data``
    there stored: the same bytes, or for a page (kept gzip-compressed on S3) the same page
    once decompressed. A damaged stored page is not the same."""
    if stored == data:
        return True
    if not compression.is_page(rel):
        return False
    try:
        return compression.page_bytes(stored) == compression.page_bytes(data)
    except DamagedRecord:
        return False


def unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or its cause) says the endpoint did not answer, not that it refused."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, TimeoutError | ConnectionError) or any(
                cls.__name__ in _UNREACHABLE for cls in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
