"""Store backends: one small class per kind of storage, chosen once from the URL's protocol.

:class:`~.base.Backend` holds the operations that differ per backend, with fsspec's
generic behaviour as the defaults; :mod:`.local` and :mod:`.s3` override what they do
better; any other fsspec protocol gets :class:`~.base.FsspecBackend`. Adding a backend is
a module here and its line in :data:`BACKENDS`.
"""

from __future__ import annotations

from typing import Any

from prefect_dask_profiling.store.backends.base import Backend, FsspecBackend
from prefect_dask_profiling.store.backends.local import LocalBackend
from prefect_dask_profiling.store.backends.s3 import S3Backend
from prefect_dask_profiling.store.url import LOCAL_PROTOCOLS, S3_PROTOCOLS, protocol_of

# protocol (lower case; None: a plain path) -> its backend; any other: FsspecBackend
BACKENDS: dict[str | None, type[Backend]] = {
    **dict.fromkeys(LOCAL_PROTOCOLS, LocalBackend),
    **dict.fromkeys(S3_PROTOCOLS, S3Backend),
}


def open_backend(url: str, storage_options: dict[str, Any], timeout: float) -> Backend:
    """The backend of ``url`` (a checked store URL), its filesystem built.

    Parameters
    ----------
    url
        The store URL, checked by ``check_store_url``.
    storage_options
        Filesystem options; never written anywhere.
    timeout
        Upper bound in seconds for any one storage call.
    """
    return BACKENDS.get(protocol_of(url), FsspecBackend)(url, storage_options, timeout)


__all__ = ["BACKENDS", "Backend", "FsspecBackend", "LocalBackend", "S3Backend", "open_backend"]
