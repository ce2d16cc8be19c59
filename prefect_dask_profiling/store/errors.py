"""The store's errors: re-exported from :mod:`prefect_dask_profiling.errors`, their one home."""

from __future__ import annotations

from prefect_dask_profiling.errors import (
    DamagedRecord,
    StoreAccessDenied,
    StoreConflict,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
    StoreUnreachable,
)

__all__ = ["DamagedRecord", "StoreAccessDenied", "StoreConflict", "StoreError",
           "StoreNotFound", "StoreUnavailable", "StoreUnreachable"]
