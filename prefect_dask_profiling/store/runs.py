"""The run store: run summaries, per-stage reports and an index under one fsspec URL.

:class:`RunStore` is the one class every caller uses, made of one mixin per concern over
one :class:`~prefect_dask_profiling.store.access.StoreAccess` (access, writing, delivery,
retention, reads, live): one filesystem, one breaker, one read memory. A run is complete
only when its manifest exists; writes never raise for storage failures (what could not be
written is spooled and delivered later), and readers skip damaged runs with a warning."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime

from prefect_dask_profiling.store.access import STORE_DOWN_S
from prefect_dask_profiling.store.delivery import Delivery, DeliveryReport
from prefect_dask_profiling.store.errors import StoreError
from prefect_dask_profiling.store.live import Live
from prefect_dask_profiling.store.manifest import (
    INDEX_FIELDS,
    MANIFEST_REQUIRED,
    SCHEMA_VERSION,
    STATUSES,
)
from prefect_dask_profiling.store.reads import Reading
from prefect_dask_profiling.store.retention import Retention
from prefect_dask_profiling.store.spool import UploadResult, default_spool_dir
from prefect_dask_profiling.store.tables import NAME_COLUMNS, TASKS_COLUMNS
from prefect_dask_profiling.store.url import DEFAULT_URL, public_url
from prefect_dask_profiling.store.writing import WriteResult, Writing

# Re-exported: many modules and tests import these names from here.
__all__ = ["DEFAULT_URL", "INDEX_FIELDS", "MANIFEST_REQUIRED", "NAME_COLUMNS", "SCHEMA_VERSION",
           "STATUSES", "STORE_DOWN_S", "TASKS_COLUMNS", "DeliveryReport", "RunStore",
           "StoreError", "UploadResult", "WriteResult", "default_spool_dir", "new_run_id",
           "public_url"]


def new_run_id(now: datetime | None = None) -> str:
    """A unique, lexicographically sortable run id such as ``20261129T180512Z-3f9a1c``."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class RunStore(Writing, Delivery, Retention, Reading, Live):
    """Run summaries, reports and the run index under one URL.

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
