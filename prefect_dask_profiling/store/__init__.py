"""Object storage for runs: layout, URL validation, manifests, writing, spool, lifecycle.

The public names, in one place::

    from prefect_dask_profiling.store import RunStore, StoreError, new_run_id

They are imported on first use: the runner imports :mod:`.url` inside every Dask worker task,
which must not pay for pandas and fsspec's S3 code there.
"""

from __future__ import annotations

from prefect_dask_profiling._util import lazy_exports

_PUBLIC = {
    "StoreError": ".errors", "StoreNotFound": ".errors", "DamagedRecord": ".errors",
    "StoreConflict": ".errors", "StoreUnavailable": ".errors", "StoreUnreachable": ".errors",
    "StoreAccessDenied": ".errors",
    "SCHEMA_VERSION": ".manifest", "STATUSES": ".manifest", "Manifest": ".manifest",
    "RunContext": ".manifest", "StageInfo": ".manifest", "build_manifest": ".manifest",
    "DeliveryReport": ".manifest", "RunStore": ".runs", "WriteResult": ".writing",
    "new_run_id": ".runs",
    "UploadResult": ".spool", "default_spool_dir": ".spool",
    "TASKS_COLUMNS": ".tables",
    "DEFAULT_URL": ".url", "check_store_url": ".url", "public_url": ".url",
}

__all__ = sorted(_PUBLIC)
__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC)
