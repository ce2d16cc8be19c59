"""The run store: run summaries, per-stage reports and an index under one fsspec URL.

:class:`RunStore` is the facade every caller uses; the parts live next to it —
:mod:`~prefect_dask_profiling.store.layout` (every path), :mod:`~prefect_dask_profiling.store.url`
(the URL, redaction), :mod:`~prefect_dask_profiling.store.manifest` (the manifest document),
:mod:`~prefect_dask_profiling.store.tables` (CSV in and out),
:mod:`~prefect_dask_profiling.store.spool` (files waiting for the store) and
:mod:`~prefect_dask_profiling.store.s3` (S3 specifics).

A run is complete only when its manifest exists. Writes never raise for storage failures:
whatever could not be written goes to a local spool (keyed by the store's identity, free of
credentials), delivered byte-identical by the next run (:meth:`RunStore.deliver_pending`) or
by ``dask-profiling upload-pending``. Readers survive damaged runs: a run that cannot be
read is skipped (or its index repaired) with a warning naming the run and the file.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd

from prefect_dask_profiling._util import InvalidInput, validate_name
from prefect_dask_profiling.store import layout, s3
from prefect_dask_profiling.store import url as store_url
from prefect_dask_profiling.store.errors import StoreError
from prefect_dask_profiling.store.manifest import (
    INDEX_FIELDS,
    MANIFEST_REQUIRED,
    SCHEMA_VERSION,
    STATUSES,
    Manifest,
    complete_manifest,
    dump,
    is_provisional,
    marker_doc,
    parse_manifest,
    sha256,
)
from prefect_dask_profiling.store.spool import (
    Clash,
    Spool,
    UploadResult,
    default_spool_dir,
    deliver,
)
from prefect_dask_profiling.store.tables import (
    NAME_COLUMNS,
    TASKS_COLUMNS,
    decode_table,
    encode_files,
    first_line,
)
from prefect_dask_profiling.store.url import DEFAULT_URL, public_url

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_URL", "INDEX_FIELDS", "MANIFEST_REQUIRED", "NAME_COLUMNS", "SCHEMA_VERSION",
           "STATUSES", "STORE_DOWN_S", "TASKS_COLUMNS", "DeliveryReport", "RunStore",
           "StoreError", "UploadResult", "WriteResult", "default_spool_dir", "new_run_id",
           "parse_age", "public_url", "report_link"]

STORE_DOWN_S = 30.0  # after a failure, spool directly for this long instead of waiting again
_CONTENT_TYPES = {".html": "text/html", ".csv": "text/csv", ".json": "application/json"}
_UNREACHABLE = {"ConnectionError", "ReadTimeoutError", "ConnectionClosedError",
                "ClientConnectorError", "ServerDisconnectedError", "EndpointConnectionError",
                "ConnectTimeoutError"}
# Statuses a later marker of the same run replaces (the run's end wrote a final one).
_PROVISIONAL_STATUSES = ("incomplete", "unjudged")


@dataclass
class WriteResult:
    """Outcome of a write: where it is (or will be, once uploaded) and whether it was spooled."""

    location: str | None
    spooled: bool
    warnings: list[str] = field(default_factory=list)


class DeliveryReport(TypedDict):
    """What :meth:`RunStore.deliver_pending` did with files earlier runs left in the spool.

    ``delivered``/``left`` count files; ``runs`` are the run ids whose manifest was
    delivered; ``note`` says why files were left (store down, out of time, busy), if any.
    """

    delivered: int
    left: int
    runs: list[str]
    seconds: float
    note: str | None
    warnings: list[str]


def new_run_id(now: datetime | None = None) -> str:
    """A unique, lexicographically sortable run id such as ``20261129T180512Z-3f9a1c``."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


class RunStore:
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

    def __init__(self, url: str | None = None, storage_options: dict | None = None, *,
                 spool_dir: str | os.PathLike | None = None, timeout: float = 10.0) -> None:
        import fsspec
        from fsspec.asyn import AsyncFileSystem
        from fsspec.implementations.local import LocalFileSystem

        raw = store_url.check_store_url(store_url.resolve_url(url))
        if storage_options is None:
            storage_options = store_url.env_storage_options()
        if not isinstance(storage_options, dict):
            raise ValueError("storage_options must be a dict")
        if not (isinstance(timeout, int | float) and not isinstance(timeout, bool)
                and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._secrets = store_url.secret_values(storage_options)
        protocol, path = fsspec.core.split_protocol(raw)
        protocol = protocol.lower() if protocol else None
        if protocol in store_url.LOCAL_PROTOCOLS:
            self.kind = "local"
            self.root = os.path.abspath(os.path.expanduser(path))
            self.url = self.root
            self.fs = LocalFileSystem(auto_mkdir=True)
        elif protocol in store_url.S3_PROTOCOLS:
            self.kind = "s3"
            self.root = store_url.s3_root(raw)
            self.url = f"s3://{self.root}"
            self.fs = s3.make_s3fs(storage_options, self.timeout)
        else:
            self.kind = protocol
            self.fs, root = fsspec.core.url_to_fs(raw, **storage_options)
            self.root = root.rstrip("/")
            self.url = public_url(raw)
        self._kw = {"timeout": self.timeout} if isinstance(self.fs, AsyncFileSystem) else {}
        self._local = isinstance(self.fs, LocalFileSystem)
        self.spool_dir = Path(spool_dir).expanduser() if spool_dir else default_spool_dir()
        self.spool = Spool(self.spool_dir, self.url,
                           store_url.location_options(storage_options, protocol))
        self._down_until = 0.0
        self._remembered: dict[tuple, Any] | None = None

    def __repr__(self) -> str:
        return f"RunStore({self.url!r})"

    # ------------------------------------------------------------------ paths
    def location(self, rel: str) -> str:
        """The full location (URL or local path) of ``rel``, a path relative to the root."""
        return f"{self.url}/{rel}"

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def _relative(self, location: str) -> str:
        prefix = f"{self.url}/"
        rel = location[len(prefix):] if location.startswith(prefix) else location
        if "://" in rel or rel.startswith("/") or not rel:
            raise ValueError(f"location {location!r} is not inside store {self.url!r}")
        for part in rel.split("/"):
            validate_name(part, "location")
        return rel

    # ------------------------------------------------------------------ writing
    def write_run(self, pipeline: str, run_id: str, tables: dict[str, pd.DataFrame],
                  manifest: dict, extra_files: dict[str, bytes] | None = None) -> WriteResult:
        """Write a run's tables (CSV) and extra files, then manifest.json, then its index marker.

        The manifest gains ``files`` (size and sha256 of each file) and is created exclusively:
        a run is never overwritten (``StoreError`` if the run already exists). Storage failures
        never raise: the unwritten files are spooled and ``spooled=True`` comes with a warning.
        """
        run_dir = layout.run_dir(pipeline, run_id)
        files = encode_files(tables, extra_files)
        doc = complete_manifest(pipeline, run_id, manifest, files)
        items = [(layout.run_file(pipeline, run_id, name), data, True)
                 for name, data in files.items()]
        items.append((layout.manifest_file(pipeline, run_id), dump(doc), True))
        items.append((layout.index_marker(pipeline, doc["version"], run_id, doc["status"]),
                      dump(marker_doc(doc)), False))
        return self._write_items(items, self.location(run_dir))

    def complete_run(self, pipeline: str, run_id: str, tables: dict[str, pd.DataFrame],
                     manifest: dict, extra_files: dict[str, bytes] | None = None,
                     provisional_status: str = "unjudged") -> WriteResult:
        """Complete a run stored by :meth:`write_run` with a provisional manifest.

        Writes the tables and files not stored yet, replaces the provisional manifest by
        ``manifest`` (whose ``files`` then lists every file of the run) and the run's index
        marker by one with the final status. Like :meth:`write_run`, storage failures spool.
        """
        run_dir = layout.run_dir(pipeline, run_id)
        files = encode_files(tables, extra_files)
        doc = complete_manifest(pipeline, run_id, manifest, files)
        stored = self._find(run_dir) if time.monotonic() >= self._down_until else {}
        items = [(rel, data, True) for name, data in files.items()
                 if (rel := layout.run_file(pipeline, run_id, name)) not in stored]
        items.append((layout.manifest_file(pipeline, run_id), dump(doc), False))
        items.append((layout.index_marker(pipeline, doc["version"], run_id, doc["status"]),
                      dump(marker_doc(doc)), False))
        result = self._write_items(items, self.location(run_dir))
        if doc["status"] != provisional_status:
            self._forget_marker(layout.index_marker(pipeline, doc["version"], run_id,
                                                    provisional_status), result.spooled)
        return result

    def _forget_marker(self, rel: str, spooled: bool) -> None:
        """Remove a superseded index marker (best effort: readers prefer the final one)."""
        try:
            self.spool.forget(rel)
            if not spooled:
                self._forget_reads()
                self.fs.rm_file(self._path(rel))
        except Exception as exc:
            logger.debug("superseded marker %s not removed: %r", rel, exc)

    def write_report(self, pipeline: str, run_id: str, stage: str,
                     html: str | bytes) -> WriteResult:
        """Write one stage's performance report to ``reports/<pipeline>/<run_id>/<stage>.html``."""
        rel = layout.report_file(pipeline, run_id, stage)
        data = html.encode() if isinstance(html, str) else bytes(html)
        return self._write_items([(rel, data, False)], self.location(rel))

    def _write_items(self, items: list[tuple[str, bytes, bool]], location: str) -> WriteResult:
        done = 0
        if time.monotonic() < self._down_until:
            reason = "it failed moments ago"
        else:
            try:
                for rel, data, exclusive in items:
                    self._put_checked(rel, data, exclusive)
                    done += 1
                return WriteResult(location, False, [])
            except Clash:
                raise StoreError(f"{self.location(items[done][0])} already exists: runs "
                                 "are never overwritten (use a new run id)") from None
            except Exception as exc:
                reason = self._describe(exc)
                self._down_until = time.monotonic() + STORE_DOWN_S
        pending = items[done:]
        try:
            where = self.spool.write([(rel, data) for rel, data, _ in pending])
        except OSError as exc:
            message = self._redact(f"could not write {len(pending)} file(s) to {self.url} "
                                   f"({reason}) nor to the spool ({exc}); they are lost")
        else:
            message = self._redact(
                f"could not write {len(pending)} file(s) to {self.url} ({reason}); kept them "
                f"in the spool {where}; upload later with `dask-profiling upload-pending "
                f"--store {self.url}`")
        logger.warning(message)
        return WriteResult(location, True, [message])

    def _put(self, rel: str, data: bytes, exclusive: bool,
             timeout: float | None = None) -> None:
        self._forget_reads()
        path = self._path(rel)
        if exclusive and self._local:
            with self.fs.open(path, "xb") as f:  # atomic O_EXCL create
                f.write(data)
            return
        kwargs = dict(self._kw)
        if kwargs:  # big payloads get time to travel: at least 1 MiB/s on top of the timeout
            kwargs["timeout"] = (timeout or self.timeout) + len(data) / 2**20
        if self.kind == "s3":
            kwargs["ContentType"] = _CONTENT_TYPES.get(os.path.splitext(rel)[1],
                                                       "application/octet-stream")
        self.fs.pipe_file(path, data, mode="create" if exclusive else "overwrite", **kwargs)

    def _put_checked(self, rel: str, data: bytes, exclusive: bool,
                     timeout: float | None = None) -> None:
        """:meth:`_put`; an exclusive create that finds the object already there succeeds when
        the stored bytes are the same (an earlier attempt's answer was lost), else raises
        :class:`~prefect_dask_profiling.store.spool.Clash`. A provisional manifest may be
        replaced by the run's final one."""
        try:
            self._put(rel, data, exclusive, timeout)
        except Exception as exc:
            if not (exclusive and s3.is_exists_error(exc)):
                raise
            remote = self.fs.cat_file(self._path(rel), **self._kw)
            if remote == data:
                logger.debug("%s was already stored byte-identical", self.location(rel))
                return
            if rel.endswith("/" + layout.MANIFEST) and is_provisional(remote):
                self._put(rel, data, False, timeout)
                return
            raise Clash(f"{self.location(rel)} already exists with different content") \
                from None

    # ------------------------------------------------------------------ spool
    def upload_pending(self, progress: Callable[[int, int], None] | None = None
                       ) -> UploadResult:
        """Upload this store's spooled files, byte-identical; manifest and index marker last.

        A run's manifest is uploaded only after all its spooled files, and its index marker
        only after the manifest. Uploaded files leave the spool; the others stay for next time.
        ``progress(done, total)`` is called after each file.
        """
        return self._deliver(None, progress)

    def deliver_pending(self, budget_s: float | None = None) -> DeliveryReport | None:
        """Deliver what earlier runs left in this store's spool, within ``budget_s`` seconds.

        Called at the end of every run, so the spool reaches the store with the next run
        (of any pipeline) once the store answers again. Bounded: nothing is tried while the
        store is known to be down, no file is started after the budget (default: the store's
        timeout), and each call has the store's timeout. Safe when two runs deliver at once:
        one holds the spool's lock, the other leaves the spool alone; exclusive creates that
        find identical bytes count as delivered.

        Returns
        -------
        DeliveryReport or None
            ``None`` when nothing was pending; else what was delivered and what was left,
            for the run's manifest and logs.
        """
        budget = self.timeout if budget_s is None else budget_s
        if isinstance(budget, bool) or not isinstance(budget, int | float) \
                or not math.isfinite(budget) or budget < 0:
            raise ValueError(f"budget_s must be a number of seconds >= 0, got {budget_s!r}")
        pending = self.spool.pending()
        if not pending:
            return None
        start = time.monotonic()
        if start < self._down_until:
            result, note = UploadResult(failed=len(pending)), "the store did not answer moments ago"
        else:
            result = self._deliver(start + budget, None)
            note = ("another process is delivering them" if result.busy
                    else "out of time" if result.out_of_time
                    else "the store failed" if result.failed and result.warnings
                    and not result.uploaded else None)
        report = DeliveryReport(delivered=result.uploaded, left=result.failed, runs=result.runs,
                                seconds=round(time.monotonic() - start, 3), note=note,
                                warnings=result.warnings)
        if result.uploaded:
            logger.info("dask-profiling: delivered %d spooled file(s) of run(s) %s to %s",
                        result.uploaded, ", ".join(result.runs) or "-", self.url)
        if result.failed:
            logger.warning("dask-profiling: %d spooled file(s) still wait for %s%s",
                           result.failed, self.url, f" ({note})" if note else "")
        return report

    def _deliver(self, deadline: float | None,
                 progress: Callable[[int, int], None] | None) -> UploadResult:
        with self.spool.locked() as mine:
            if not mine:
                result = UploadResult(failed=len(self.spool.pending()), busy=True)
                result.warnings.append(f"the spool {self.spool.dir} is being delivered by "
                                       "another process; try again when it is done")
            else:
                result = deliver(self.spool, self._send_spooled, deadline=deadline,
                                 progress=progress, describe=self._describe)
        result.warnings = [self._redact(w) for w in result.warnings]
        if result.uploaded and not any(w.startswith("could not upload") for w in result.warnings):
            self._down_until = 0.0
        elif any(w.startswith("could not upload") for w in result.warnings):
            self._down_until = time.monotonic() + STORE_DOWN_S
        for message in result.warnings:
            logger.warning(message)
        return result

    def _send_spooled(self, rel: str, data: bytes, left: float | None) -> None:
        exclusive = rel.startswith(layout.RUNS + "/")
        timeout = None if left is None else max(0.5, min(self.timeout, left))
        try:
            self._put_checked(rel, data, exclusive, timeout)
        except Clash as exc:
            raise Clash(f"{exc}; the spooled copy stays at {self.spool.dir / rel}") from None

    # ------------------------------------------------------------------ retention
    def ensure_lifecycle(self, retention_days: int) -> str | None:
        """On S3, make sure ``reports/`` expires after ``retention_days`` (merged by rule ID).

        Returns ``None`` when the rule is in place (or the store is not S3), else a warning
        (missing permission, missing bucket, unreachable endpoint): it never raises for those.
        """
        if isinstance(retention_days, bool) or not isinstance(retention_days, int) \
                or retention_days < 1:
            raise ValueError(f"retention_days must be a whole number >= 1, got {retention_days!r}")
        if self.kind != "s3":
            return None
        bucket, _, prefix = self.root.partition("/")
        rules = s3.lifecycle_rules(prefix, retention_days)
        try:
            self._check_reachable()
            s3.merge_lifecycle(self.fs, bucket, rules, timeout=self.timeout)
        except Exception as exc:
            self._note_failure(exc)
            code = s3.error_code(exc)
            cause = f"{code}: {first_line(exc)}" if code else self._describe(exc)
            fix = ("grant s3:GetLifecycleConfiguration and s3:PutLifecycleConfiguration, or "
                   if isinstance(exc, PermissionError) else "retry later, or ")
            message = self._redact(
                f"could not set the lifecycle rule on bucket {bucket!r} ({cause}): objects "
                f"under {rules[0]['Filter']['Prefix']} will not expire automatically; {fix}run "
                f"`dask-profiling sweep --store {self.url}` regularly")
            logger.warning(message)
            return message
        return None

    def sweep(self, older_than_days: float, now: datetime | None = None) -> list[str]:
        """Delete whole ``reports/<pipeline>/<run_id>/`` folders whose newest file is too old.

        Nothing outside ``reports/`` is touched. A folder with any file of unknown age, or a
        name that is not ours, is kept. Returns the locations of the removed folders.
        """
        if isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float) \
                or not math.isfinite(older_than_days) or older_than_days <= 0:
            raise ValueError(f"older_than_days must be a positive number, got {older_than_days!r}")
        cutoff = (now or datetime.now(UTC)) - timedelta(days=older_than_days)
        ages: dict[tuple[str, str], list[datetime | None]] = {}
        for rel, info in self._find(layout.REPORTS).items():
            run = layout.parse_report(rel)
            if run is not None:
                ages.setdefault(run, []).append(_mtime(info))
        removed = []
        for (pipeline, run_id), mtimes in sorted(ages.items()):
            if None in mtimes or max(mtimes) >= cutoff:  # unknown age or still fresh: keep
                continue
            rel = layout.report_dir(pipeline, run_id)
            try:
                self._forget_reads()
                self.fs.rm(self._path(rel), recursive=True, **self._kw)
            except Exception as exc:
                logger.warning("could not remove %s: %s", self.location(rel),
                               self._describe(exc))
                continue
            removed.append(self.location(rel))
        return removed

    def presign(self, location: str, expires_s: int) -> str | None:
        """A presigned HTTPS GET link to an S3 ``location`` valid for ``min(expires_s, 7 days)``.

        ``None`` for non-S3 stores, when signing fails, or when the credentials carry a
        session token (the link would contain it).
        """
        if isinstance(expires_s, bool) or not isinstance(expires_s, int) or expires_s <= 0:
            raise ValueError(f"expires_s must be a positive whole number, got {expires_s!r}")
        rel = self._relative(location)
        if self.kind != "s3":
            return None
        try:
            return s3.presign(self.fs, self._path(rel), expires_s, timeout=self.timeout)
        except Exception as exc:
            logger.warning("could not sign a link to %s: %s", self.location(rel),
                           self._describe(exc))
            return None

    # ------------------------------------------------------------------ reading
    def list_pipelines(self) -> list[str]:
        """Pipelines with at least one index marker or run folder."""
        names = {name for name in self._children(layout.INDEX) + self._children(layout.RUNS)
                 if layout.valid_names(name)}
        return sorted(names)

    def list_runs(self, pipeline: str, version: str | None = None) -> list[dict]:
        """Runs of ``pipeline`` (of ``version``, if given), newest first:
        ``[{run_id, version, status}]``.

        From the index markers plus one listing of the run folders, without reading any
        manifest — except to repair damage, each with a warning naming the run and the file:

        * a malformed marker is skipped;
        * a marker whose run folder is gone is skipped;
        * a run folder whose manifest exists but whose marker was never written (its writer
          stopped between the two writes) is listed from its manifest, and its marker
          written again; a damaged manifest there makes the run skipped.
        """
        if version is not None:
            validate_name(version, "version")
        runs = self._recall(("runs", pipeline), lambda: self._list_all_runs(pipeline))
        return [dict(r) for r in runs if version is None or r["version"] == version]

    def _list_all_runs(self, pipeline: str) -> list[dict]:
        """Every run of ``pipeline``, newest first (see :meth:`list_runs`)."""
        base = layout.index_dir(pipeline)
        runs: dict[str, dict] = {}
        for rel, info in self._find(base).items():
            entry = layout.parse_marker(rel, STATUSES)
            if not isinstance(entry, str) and info.get("size") == 0:
                entry = "empty marker"
            if isinstance(entry, str):
                logger.warning("skipping malformed index marker %s: %s", self.location(rel),
                               entry)
                continue
            previous = runs.get(entry.run_id)
            if previous is None or previous["status"] in _PROVISIONAL_STATUSES:
                runs[entry.run_id] = {"run_id": entry.run_id, "version": entry.version,
                                      "status": entry.status}
        folders = {name for name in self._children(layout.pipeline_runs(pipeline))
                   if layout.valid_names(name)}
        for run_id in sorted(set(runs) - folders):
            logger.warning("skipping run %s of pipeline %s: its index marker is in %s but its "
                           "folder %s is gone", run_id, pipeline,
                           self.location(layout.index_dir(pipeline, runs[run_id]["version"])),
                           self.location(layout.run_dir(pipeline, run_id)))
            del runs[run_id]
        for run_id in sorted(folders - set(runs)):
            entry = self._unindexed(pipeline, run_id)
            if entry is not None:
                runs[run_id] = entry
        return sorted(runs.values(), key=lambda r: r["run_id"], reverse=True)

    def _unindexed(self, pipeline: str, run_id: str) -> dict | None:
        """A run folder without index marker: its entry from its manifest (marker repaired),
        or ``None`` when it has no manifest (still being written, or never completed)."""
        rel = layout.manifest_file(pipeline, run_id)
        try:
            data = self.fs.cat_file(self._path(rel), **self._kw)
        except FileNotFoundError:
            logger.debug("run folder %s has no manifest (yet)", self.location(rel))
            return None
        except Exception as exc:
            self._note_failure(exc)
            logger.warning("skipping run %s of pipeline %s: could not read %s: %s", run_id,
                           pipeline, self.location(rel), self._describe(exc))
            return None
        try:
            doc = parse_manifest(data, pipeline, run_id, self.location(rel))
            layout.index_marker(pipeline, doc["version"], run_id, doc["status"])
        except (StoreError, ValueError) as exc:
            logger.warning("skipping run %s of pipeline %s: %s", run_id, pipeline, exc)
            return None
        marker = layout.index_marker(pipeline, doc["version"], run_id, doc["status"])
        try:
            self._put(marker, dump(marker_doc(doc)), False)
            done = f"wrote its index marker {self.location(marker)}"
        except Exception as exc:
            done = f"could not write its index marker ({self._describe(exc)})"
        logger.warning("run %s of pipeline %s has a manifest %s but no index marker (its writer "
                       "stopped between the two writes): listed from its manifest; %s", run_id,
                       pipeline, self.location(rel), done)
        return {"run_id": run_id, "version": doc["version"], "status": doc["status"]}

    def read_manifest(self, pipeline: str, run_id: str) -> Manifest:
        """The run's manifest; ``StoreError`` naming the file if missing, not UTF-8 JSON,
        malformed or of another schema."""
        return _or_raise(self.read_manifests(pipeline, [run_id])[run_id])

    def read_table(self, pipeline: str, run_id: str, name: str = "tasks") -> pd.DataFrame:
        """One of the run's CSV tables, checked against the size and sha256 in its manifest.

        ``StoreError`` naming the run and the file when the table is missing, truncated,
        changed, not UTF-8, not CSV, or (``tasks``) lacks columns or holds non-numbers.
        """
        return _or_raise(self.read_tables(pipeline, [run_id], name)[run_id])

    def read_tables(self, pipeline: str, run_ids: list[str], name: str = "tasks"
                    ) -> dict[str, pd.DataFrame | StoreError]:
        """:meth:`read_table` of several runs at once: their manifests in one wave of
        requests, then their tables in another (concurrent on S3, where reading a history
        one file after the other costs a round trip each).

        Returns
        -------
        dict
            Each run id's table, or the ``StoreError`` :meth:`read_table` would have raised.
        """
        validate_name(name, "table name")
        manifests = self.read_manifests(pipeline, run_ids)
        out: dict[str, pd.DataFrame | StoreError] = {}
        wanted: dict[str, tuple[str, Manifest]] = {}
        for run_id, manifest in manifests.items():
            remembered = self._remembered_value(("table", pipeline, run_id, name))
            if isinstance(manifest, StoreError):
                out[run_id] = manifest
            elif remembered is not None:
                out[run_id] = remembered.copy()
            else:
                try:
                    wanted[run_id] = (self._table_entry(pipeline, run_id, name, manifest),
                                      manifest)
                except StoreError as exc:
                    out[run_id] = exc
        found = self._read_many({rel: f"table {name!r} of run {run_id!r}"
                                 for run_id, (rel, _) in wanted.items()})
        for run_id, (rel, manifest) in wanted.items():
            try:
                data = found[rel]
                if isinstance(data, StoreError):
                    raise data
                table = self._check_table(rel, name, data, manifest)
            except StoreError as exc:
                out[run_id] = exc
                continue
            self._remember(("table", pipeline, run_id, name), table)
            out[run_id] = table.copy() if self._remembered is not None else table
        return {run_id: out[run_id] for run_id in run_ids}

    def read_manifests(self, pipeline: str, run_ids: list[str]
                       ) -> dict[str, Manifest | StoreError]:
        """:meth:`read_manifest` of several runs at once (one wave of requests): each run id's
        manifest, or the ``StoreError`` :meth:`read_manifest` would have raised."""
        if isinstance(run_ids, str):
            raise InvalidInput(f"run_ids must be a list of run ids, got the string {run_ids!r}")
        out: dict[str, Manifest | StoreError] = {}
        wanted = {}
        for run_id in run_ids:
            remembered = self._remembered_value(("manifest", pipeline, run_id))
            if remembered is not None:
                out[run_id] = copy.deepcopy(remembered)
            else:
                wanted[layout.manifest_file(pipeline, run_id)] = run_id
        found = self._read_many({rel: f"run {run_id!r} of pipeline {pipeline!r}"
                                 for rel, run_id in wanted.items()})
        for rel, run_id in wanted.items():
            try:
                data = found[rel]
                if isinstance(data, StoreError):
                    raise data
                doc = parse_manifest(data, pipeline, run_id, self.location(rel))
            except StoreError as exc:
                out[run_id] = exc
                continue
            self._remember(("manifest", pipeline, run_id), doc)
            out[run_id] = copy.deepcopy(doc) if self._remembered is not None else doc
        return {run_id: out[run_id] for run_id in run_ids}

    def _table_entry(self, pipeline: str, run_id: str, name: str, manifest: Manifest) -> str:
        """The table's path, if the manifest lists it."""
        rel = layout.table_file(pipeline, run_id, name)
        if not isinstance(manifest["files"].get(rel.rsplit("/", 1)[1]), dict):
            raise StoreError(f"run {run_id!r} of pipeline {pipeline!r} has no table {name!r}")
        return rel

    def _check_table(self, rel: str, name: str, data: bytes, manifest: Manifest
                     ) -> pd.DataFrame:
        """The table from its bytes, checked against the size and sha256 in the manifest."""
        entry = manifest["files"][rel.rsplit("/", 1)[1]]
        where = self.location(rel)
        if len(data) != entry.get("size") or sha256(data) != entry.get("sha256"):
            raise StoreError(f"{where} is truncated or changed: {len(data)} bytes, the manifest "
                             f"says {entry.get('size')} bytes with another checksum")
        return decode_table(data, name, where)

    def accept(self, pipeline: str, version: str, run_id: str) -> None:
        """Mark ``run_id`` as the run where the baseline of ``pipeline``/``version`` restarts."""
        marker = layout.accepted_marker(pipeline, version, run_id)
        if not self._exists(layout.manifest_file(pipeline, run_id)):
            raise StoreError(f"unknown run {run_id!r} of pipeline {pipeline!r} in {self.url}")
        body = dump({"run_id": run_id, "accepted": datetime.now(UTC).isoformat()})
        try:
            self._put(marker, body, False)
        except Exception as exc:
            raise StoreError(f"could not write to {self.url}: {self._describe(exc)}") from None

    def accepted(self, pipeline: str, version: str) -> list[str]:
        """Accepted run ids of ``pipeline``/``version``, newest first."""
        def listed() -> list[str]:
            found = [layout.parse_accepted(rel)
                     for rel in self._find(layout.accepted_dir(pipeline, version))]
            return sorted((f[2] for f in found if f is not None), reverse=True)

        return list(self._recall(("accepted", pipeline, version), listed))

    # ------------------------------------------------------------------ remembered reads
    @contextlib.contextmanager
    def remembering_reads(self) -> Iterator[RunStore]:
        """Within the block, answer a repeated listing or read from memory.

        Judging a run reads the history twice (the baseline, then the drift series) from
        the same listing and partly the same tables; with thousands of stored runs the
        listing is what costs (on S3 it pages through every index key). Any write or delete
        through this store forgets what was read; callers get copies, never the memory.
        """
        outer = self._remembered
        self._remembered = {} if outer is None else outer
        try:
            yield self
        finally:
            self._remembered = outer

    def _recall(self, key: tuple, read: Callable[[], Any]) -> Any:
        """``read()``, or inside :meth:`remembering_reads` its remembered answer (failures
        are not remembered)."""
        memory = self._remembered
        if memory is None:
            return read()
        try:
            return memory[key]
        except KeyError:  # not read yet, or forgotten by a write from another thread
            value = memory[key] = read()
            return value

    def _remembered_value(self, key: tuple) -> Any:
        memory = self._remembered
        return None if memory is None else memory.get(key)

    def _remember(self, key: tuple, value: Any) -> None:
        memory = self._remembered
        if memory is not None:
            memory[key] = value

    def _forget_reads(self) -> None:
        if self._remembered:
            self._remembered.clear()

    # ------------------------------------------------------------------ helpers
    def _check_reachable(self) -> None:
        """Fail at once while the store is known to be down, instead of waiting again."""
        if time.monotonic() < self._down_until:
            raise StoreError(f"could not reach {self.url}: it did not answer moments ago")

    def _note_failure(self, exc: BaseException) -> None:
        """After a timeout or a refused connection, treat the store as down for a while."""
        if _unreachable(exc):
            self._down_until = time.monotonic() + STORE_DOWN_S

    def _read(self, rel: str, what: str) -> bytes:
        self._check_reachable()
        try:
            return self.fs.cat_file(self._path(rel), **self._kw)
        except Exception as exc:
            raise self._read_error(rel, what, exc) from None

    def _read_error(self, rel: str, what: str, exc: BaseException) -> StoreError:
        if isinstance(exc, FileNotFoundError):
            return StoreError(f"{what} not found: no {self.location(rel)}")
        self._note_failure(exc)
        return StoreError(f"could not read {self.location(rel)}: {self._describe(exc)}")

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
            self._note_failure(exc)
            error = StoreError(f"could not read {len(items)} files under {self.url}: "
                               f"{self._describe(exc)}")
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
            self._note_failure(exc)
            raise StoreError(f"could not reach {self.url}: {self._describe(exc)}") from None

    def _children(self, rel: str) -> list[str]:
        """Names directly below folder ``rel`` (one listing; ``[]`` when there is none)."""
        self._check_reachable()
        base = self.fs._strip_protocol(self._path(rel)).rstrip("/") + "/"
        try:
            found = self.fs.ls(self._path(rel), detail=False, **self._kw)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except Exception as exc:
            self._note_failure(exc)
            raise StoreError(f"could not list {self.location(rel)}: "
                             f"{self._describe(exc)}") from None
        names = []
        for path in found:
            path = self.fs._strip_protocol(path).rstrip("/")
            if path.startswith(base):
                names.append(path[len(base):])
        return [n for n in names if n and "/" not in n]

    def _find(self, rel: str) -> dict[str, dict]:
        """Files below ``rel`` as ``{path relative to the root: info}``."""
        base = self._path(rel)
        self._check_reachable()
        try:
            found = self.fs.find(base, detail=True, **self._kw)
        except FileNotFoundError:
            return {}
        except Exception as exc:
            self._note_failure(exc)
            raise StoreError(f"could not list {self.location(rel)}: "
                             f"{self._describe(exc)}") from None
        root = self.fs._strip_protocol(self._path("")).rstrip("/") + "/"
        below = self.fs._strip_protocol(base).rstrip("/") + "/"
        out = {}
        for path, info in found.items():
            path = self.fs._strip_protocol(path)
            if path.startswith(below) and info.get("type", "file") == "file":
                out[path[len(root):]] = info
        return out

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, TimeoutError):  # fsspec's FSTimeoutError has no message
            return f"{type(exc).__name__}: no answer within the {self.timeout:g} s timeout"
        return self._redact(f"{type(exc).__name__}: {first_line(exc)}")

    def _redact(self, text: str) -> str:
        return store_url.redact(text, self._secrets)


# ---------------------------------------------------------------------- module helpers
def _or_raise(found: Any) -> Any:
    """``found``, unless it is the ``StoreError`` a batch read answered with."""
    if isinstance(found, StoreError):
        raise found
    return found


def _unreachable(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or its cause) says the endpoint did not answer, not that it refused."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, TimeoutError | ConnectionError) or any(
                cls.__name__ in _UNREACHABLE for cls in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _mtime(info: dict[str, Any]) -> datetime | None:
    for key in ("LastModified", "last_modified", "mtime", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            return datetime.fromtimestamp(value, UTC)
    return None


# ---------------------------------------------------------------------- CLI bodies
def parse_age(text: str) -> float:
    """Days from ``30d``, ``12h`` or a plain number of days."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dh]?)\s*", str(text), re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"--older-than must look like 30d, 12h or a number of days, got {text!r}")
    value = float(match.group(1))
    return value / 24 if match.group(2).lower() == "h" else value


def report_link(store: RunStore, run_id: str, stage: str, pipeline: str,
                expires_s: int = 3600) -> dict:
    """Where a stage's report is, with a presigned link when the store is S3 and can sign.

    ``StoreError`` for an unknown run or a report that expired or was never written.
    """
    manifest = store.read_manifest(pipeline, run_id)
    stage = validate_name(stage, "stage")
    entries = [s for s in manifest.get("stages") or [] if isinstance(s, dict)
               and s.get("name") == stage]
    report = entries[0].get("report") if entries else None
    if isinstance(report, dict) and isinstance(report.get("location"), str):
        location = report["location"]
    else:
        location = store.location(layout.report_file(pipeline, run_id, stage))
    rel = store._relative(location)
    if not store._exists(rel):
        known = ", ".join(str(s.get("name")) for s in manifest.get("stages") or []
                          if isinstance(s, dict)) or "none"
        raise StoreError(f"no report for stage {stage!r} of run {run_id!r} (expired or never "
                         f"written); stages in the manifest: {known}")
    url = store.presign(location, expires_s)
    return {"pipeline": pipeline, "run_id": run_id, "stage": stage, "location": location,
            "url": url, "signed": url is not None,
            "expires_s": min(expires_s, s3.MAX_PRESIGN_S) if store.kind == "s3" else None}
