"""The run store: run summaries, per-stage reports and an index under one fsspec URL.

Layout relative to the root (``./.dask-profiling``, ``s3://bucket/prefix``, ``memory://x``)::

    runs/<pipeline>/<run_id>/*.csv, extra files, manifest.json (last, exclusive create)
    reports/<pipeline>/<run_id>/<stage>.html            expire (S3 lifecycle, local sweep)
    index/<pipeline>/<version>/<run_id>.<status>        one listing finds the last N runs
    accepted/<pipeline>/<version>/<run_id>              baseline restarts at that run

A run is complete only when its manifest exists. Writes never raise for storage failures:
whatever could not be written goes to a local spool (keyed by the store URL, free of
credentials) and ``upload_pending`` sends it later, byte-identical.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pandas as pd

from prefect_dask_profiling._util import json_clean, validate_name
from prefect_dask_profiling.store import s3
from prefect_dask_profiling.store.manifest import SCHEMA_VERSION, STATUSES

logger = logging.getLogger(__name__)

DEFAULT_URL = "./.dask-profiling"
TASKS_COLUMNS = ["stage", "prefix", "tasks", "total_s", "p50_s", "p95_s", "gb_out"]
MANIFEST_REQUIRED = ("schema_version", "run_id", "pipeline", "version", "status", "files")
INDEX_FIELDS = ("run_id", "pipeline", "version", "status", "state", "regressed", "started",
                "ended", "wall_s", "source_hash", "flow_run_id", "flow_run_name")
STORE_DOWN_S = 30.0  # after a failure, spool directly for this long instead of waiting again
_SPOOL_META = "store.json"
_SECRET_OPTIONS = ("key", "secret", "token", "password", "aws_access_key_id",
                   "aws_secret_access_key", "aws_session_token", "account_key", "sas_token")
_SIGNED_QUERY = re.compile(
    r"(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|AWSAccessKeyId|Signature|sig)"
    r"=[^&\s\"']+", re.IGNORECASE)
_CONTENT_TYPES = {".html": "text/html", ".csv": "text/csv", ".json": "application/json"}


NAME_COLUMNS = ("stage", "prefix", "worker", "host", "source", "destination", "scope", "verdict",
                "cause")


class StoreError(Exception):
    """Malformed stored content or an unknown run; the message is one clear line."""


@dataclass
class WriteResult:
    """Outcome of a write: where it is (or will be, once uploaded) and whether it was spooled."""

    location: str | None
    spooled: bool
    warnings: list[str] = field(default_factory=list)


@dataclass
class UploadResult:
    """Outcome of ``upload_pending``: files uploaded, files still in the spool, warnings."""

    uploaded: int = 0
    failed: int = 0
    warnings: list[str] = field(default_factory=list)


def new_run_id(now: datetime | None = None) -> str:
    """A unique, lexicographically sortable run id such as ``20261129T180512Z-3f9a1c``."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def default_spool_dir() -> Path:
    """``$DASK_PROFILING_SPOOL`` or ``~/.cache/dask-profiling/spool``."""
    env = os.environ.get("DASK_PROFILING_SPOOL")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dask-profiling" / "spool"


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment (where credentials could hide)."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # plain or Windows drive path
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


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
        Where unwritable files wait for ``upload_pending`` (default: ``default_spool_dir()``).
    timeout
        Upper bound in seconds for any one storage call.
    """

    def __init__(self, url: str | None = None, storage_options: dict | None = None, *,
                 spool_dir: str | os.PathLike | None = None, timeout: float = 10.0) -> None:
        import fsspec
        from fsspec.asyn import AsyncFileSystem
        from fsspec.implementations.local import LocalFileSystem

        raw = url if url is not None else os.environ.get("DASK_PROFILING_STORE") or DEFAULT_URL
        if not isinstance(raw, str) or not raw.strip():
            raise ValueError(f"store URL must be a non-empty string, got {raw!r}")
        if storage_options is None:
            storage_options = _env_storage_options()
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self._secrets = _secret_values(storage_options)
        protocol, path = fsspec.core.split_protocol(raw)
        protocol = protocol.lower() if protocol else None
        if protocol in (None, "file", "local"):
            self.kind = "local"
            self.root = os.path.abspath(os.path.expanduser(path))
            self.url = self.root
            self.fs = LocalFileSystem(auto_mkdir=True)
        elif protocol in ("s3", "s3a"):
            self.kind = "s3"
            self.root = path.strip("/")
            if not self.root:
                raise ValueError(f"store URL {raw!r} names no bucket: use s3://bucket[/prefix]")
            self.url = f"s3://{self.root}"
            self.fs = s3.make_s3fs(storage_options, self.timeout)
        else:
            try:
                fsspec.get_filesystem_class(protocol)
            except ValueError:
                raise ValueError(f"unknown store protocol {protocol!r} in store URL "
                                 f"{public_url(raw)!r}") from None
            except ImportError as exc:
                raise ValueError(f"store protocol {protocol!r} needs a package that is not "
                                 f"installed ({_first_line(exc)})") from None
            self.kind = protocol
            self.fs, root = fsspec.core.url_to_fs(raw, **storage_options)
            self.root = root.rstrip("/")
            self.url = public_url(raw)
        self._kw = {"timeout": self.timeout} if isinstance(self.fs, AsyncFileSystem) else {}
        self._local = isinstance(self.fs, LocalFileSystem)
        self.spool_dir = Path(spool_dir).expanduser() if spool_dir else default_spool_dir()
        self._down_until = 0.0

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
        pipeline = validate_name(pipeline, "pipeline")
        run_id = validate_name(run_id, "run_id")
        files = _encode_files(tables, extra_files)
        doc = _complete_manifest(pipeline, run_id, manifest, files)
        marker = {k: doc.get(k) for k in INDEX_FIELDS}
        run_dir = f"runs/{pipeline}/{run_id}"
        items = [(f"{run_dir}/{name}", data, True) for name, data in files.items()]
        items.append((f"{run_dir}/manifest.json", _dump(doc), True))
        items.append((f"index/{pipeline}/{doc['version']}/{run_id}.{doc['status']}",
                      _dump(marker), False))
        return self._write_items(items, self.location(run_dir))

    def complete_run(self, pipeline: str, run_id: str, tables: dict[str, pd.DataFrame],
                     manifest: dict, extra_files: dict[str, bytes] | None = None,
                     provisional_status: str = "unjudged") -> WriteResult:
        """Complete a run stored by :meth:`write_run` with a provisional manifest.

        Writes the tables and files not stored yet, replaces the provisional manifest by
        ``manifest`` (whose ``files`` then lists every file of the run) and the run's index
        marker by one with the final status. Like :meth:`write_run`, storage failures spool.
        """
        pipeline = validate_name(pipeline, "pipeline")
        run_id = validate_name(run_id, "run_id")
        files = _encode_files(tables, extra_files)
        doc = _complete_manifest(pipeline, run_id, manifest, files)
        run_dir = f"runs/{pipeline}/{run_id}"
        stored = self._find(run_dir) if time.monotonic() >= self._down_until else {}
        items = [(f"{run_dir}/{name}", data, True) for name, data in files.items()
                 if f"{run_dir}/{name}" not in stored]
        items.append((f"{run_dir}/manifest.json", _dump(doc), False))
        marker_dir = f"index/{pipeline}/{doc['version']}"
        items.append((f"{marker_dir}/{run_id}.{doc['status']}",
                      _dump({k: doc.get(k) for k in INDEX_FIELDS}), False))
        result = self._write_items(items, self.location(run_dir))
        if doc["status"] != provisional_status:
            self._forget_marker(f"{marker_dir}/{run_id}.{provisional_status}", result.spooled)
        return result

    def _forget_marker(self, rel: str, spooled: bool) -> None:
        """Remove a superseded index marker (best effort: readers prefer the final one)."""
        try:
            (self._spool_key_dir() / rel).unlink(missing_ok=True)
            if not spooled:
                self.fs.rm_file(self._path(rel))
        except Exception as exc:
            logger.debug("superseded marker %s not removed: %r", rel, exc)

    def write_report(self, pipeline: str, run_id: str, stage: str,
                     html: str | bytes) -> WriteResult:
        """Write one stage's performance report to ``reports/<pipeline>/<run_id>/<stage>.html``."""
        rel = "/".join(["reports", validate_name(pipeline, "pipeline"),
                        validate_name(run_id, "run_id"), validate_name(stage, "stage") + ".html"])
        data = html.encode() if isinstance(html, str) else bytes(html)
        return self._write_items([(rel, data, False)], self.location(rel))

    def _write_items(self, items: list[tuple[str, bytes, bool]], location: str) -> WriteResult:
        done = 0
        if time.monotonic() < self._down_until:
            reason = "it failed moments ago"
        else:
            try:
                for rel, data, exclusive in items:
                    self._put(rel, data, exclusive)
                    done += 1
                return WriteResult(location, False, [])
            except Exception as exc:
                if items[done][2] and s3.is_exists_error(exc):
                    raise StoreError(f"{self.location(items[done][0])} already exists: runs "
                                     "are never overwritten (use a new run id)") from None
                reason = self._describe(exc)
                self._down_until = time.monotonic() + STORE_DOWN_S
        pending = items[done:]
        try:
            where = self._spool(pending)
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

    def _put(self, rel: str, data: bytes, exclusive: bool) -> None:
        path = self._path(rel)
        if exclusive and self._local:
            with self.fs.open(path, "xb") as f:  # atomic O_EXCL create
                f.write(data)
            return
        kwargs = dict(self._kw)
        if kwargs:  # big payloads get time to travel: at least 1 MiB/s on top of the timeout
            kwargs["timeout"] = self.timeout + len(data) / 2**20
        if self.kind == "s3":
            kwargs["ContentType"] = _CONTENT_TYPES.get(os.path.splitext(rel)[1],
                                                       "application/octet-stream")
        self.fs.pipe_file(path, data, mode="create" if exclusive else "overwrite", **kwargs)

    # ------------------------------------------------------------------ spool
    def _spool_key_dir(self) -> Path:
        return self.spool_dir / hashlib.sha256(self.url.encode()).hexdigest()[:16]

    def _spool(self, items: list[tuple[str, bytes, bool]]) -> Path:
        key_dir = self._spool_key_dir()
        key_dir.mkdir(parents=True, exist_ok=True)
        meta = key_dir / _SPOOL_META
        if not meta.exists():
            _atomic_write(meta, _dump({"url": self.url}))
        for rel, data, _exclusive in items:
            _atomic_write(key_dir / rel, data)
        return key_dir

    def upload_pending(self, progress: Callable[[int, int], None] | None = None
                       ) -> UploadResult:
        """Upload this store's spooled files, byte-identical; manifest and index marker last.

        A run's manifest is uploaded only after all its spooled files, and its index marker
        only after the manifest. Uploaded files leave the spool; the others stay for next time.
        ``progress(done, total)`` is called after each file.
        """
        result = UploadResult()
        key_dir = self._spool_key_dir()
        if not key_dir.is_dir():
            return result
        order = _upload_order([p.relative_to(key_dir).as_posix()
                               for p in sorted(key_dir.rglob("*"))
                               if p.is_file() and p.name != _SPOOL_META
                               and not p.name.endswith(".part")])
        blocked: set[tuple[str, str]] = set()
        store_down = False
        for n, (rel, run) in enumerate(order, 1):
            if store_down or (run is not None and run in blocked):
                result.failed += 1
                if run is not None:
                    blocked.add(run)
            else:
                try:
                    self._upload_one(key_dir, rel)
                    result.uploaded += 1
                except StoreError as exc:
                    result.failed += 1
                    result.warnings.append(str(exc))
                    if run is not None:
                        blocked.add(run)
                except Exception as exc:
                    result.failed += 1
                    store_down = True
                    result.warnings.append(self._redact(
                        f"could not upload spooled files to {self.url} ({self._describe(exc)});"
                        " they stay in the spool"))
            if progress is not None:
                progress(n, len(order))
        _prune_empty(key_dir)
        if result.uploaded and not store_down:
            self._down_until = 0.0
        for message in result.warnings:
            logger.warning(message)
        return result

    def _upload_one(self, key_dir: Path, rel: str) -> None:
        local = key_dir / rel
        data = local.read_bytes()
        exclusive = rel.startswith("runs/")
        try:
            self._put(rel, data, exclusive)
        except Exception as exc:
            if not (exclusive and s3.is_exists_error(exc)):
                raise
            remote = self.fs.cat_file(self._path(rel), **self._kw)
            if remote != data and rel.endswith("/manifest.json") and _provisional(remote):
                self._put(rel, data, exclusive=False)
            elif remote != data:
                raise StoreError(f"{self.location(rel)} already exists with different content;"
                                 f" the spooled copy stays at {local}") from None
        local.unlink(missing_ok=True)

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
            cause = f"{code}: {_first_line(exc)}" if code else self._describe(exc)
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
        for rel, info in self._find("reports").items():
            parts = rel.split("/")
            if len(parts) >= 4 and _valid_names(parts[1:3]):
                ages.setdefault((parts[1], parts[2]), []).append(_mtime(info))
        removed = []
        for (pipeline, run_id), mtimes in sorted(ages.items()):
            if None in mtimes or max(mtimes) >= cutoff:  # unknown age or still fresh: keep
                continue
            rel = f"reports/{pipeline}/{run_id}"
            try:
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
        """Pipelines that have at least one index marker."""
        names = set()
        for rel in self._find("index"):
            parts = rel.split("/")
            if len(parts) == 4 and _valid_names(parts[1:2]):
                names.add(parts[1])
        return sorted(names)

    def list_runs(self, pipeline: str, version: str | None = None) -> list[dict]:
        """Runs from the index markers, newest first: ``[{run_id, version, status}]``.

        One listing; no manifest is read. Malformed markers are skipped with a warning.
        """
        base = f"index/{validate_name(pipeline, 'pipeline')}"
        if version is not None:
            base += f"/{validate_name(version, 'version')}"
        runs: dict[str, dict] = {}
        for rel, info in self._find(base).items():
            parts = rel.split("/")
            entry = _parse_marker(parts[2:], info)
            if isinstance(entry, str):
                logger.warning("skipping malformed index marker %s: %s", self.location(rel),
                               entry)
                continue
            previous = runs.get(entry["run_id"])
            if previous is None or previous["status"] in ("incomplete", "unjudged"):
                runs[entry["run_id"]] = entry
        return sorted(runs.values(), key=lambda r: r["run_id"], reverse=True)

    def read_manifest(self, pipeline: str, run_id: str) -> dict:
        """The run's manifest; ``StoreError`` if missing, malformed or of another schema."""
        pipeline = validate_name(pipeline, "pipeline")
        run_id = validate_name(run_id, "run_id")
        rel = f"runs/{pipeline}/{run_id}/manifest.json"
        data = self._read(rel, f"run {run_id!r} of pipeline {pipeline!r}")
        where = self.location(rel)
        try:
            doc = json.loads(data.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise StoreError(f"{where} is not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or "schema_version" not in doc:
            raise StoreError(f"{where} is not a dask-profiling manifest (no schema_version)")
        if doc["schema_version"] != SCHEMA_VERSION:
            raise StoreError(f"{where} has schema_version {doc['schema_version']!r}; this "
                             f"version of dask-profiling reads {SCHEMA_VERSION}")
        missing = [k for k in MANIFEST_REQUIRED if k not in doc]
        if missing:
            raise StoreError(f"{where} lacks {', '.join(missing)}")
        if doc["run_id"] != run_id or doc["pipeline"] != pipeline:
            raise StoreError(f"{where} belongs to run {doc['run_id']!r} of pipeline "
                             f"{doc['pipeline']!r}")
        if not isinstance(doc["files"], dict):
            raise StoreError(f"{where} has a malformed 'files' entry")
        return doc

    def read_table(self, pipeline: str, run_id: str, name: str = "tasks") -> pd.DataFrame:
        """One of the run's CSV tables, checked against the size and sha256 in its manifest."""
        validate_name(name, "table name")
        manifest = self.read_manifest(pipeline, run_id)
        filename = f"{name}.csv"
        entry = manifest["files"].get(filename)
        if not isinstance(entry, dict):
            raise StoreError(f"run {run_id!r} of pipeline {pipeline!r} has no table {name!r}")
        rel = f"runs/{pipeline}/{run_id}/{filename}"
        where = self.location(rel)
        data = self._read(rel, f"table {name!r} of run {run_id!r}")
        if len(data) != entry.get("size") or _sha256(data) != entry.get("sha256"):
            raise StoreError(f"{where} is truncated or changed: {len(data)} bytes, the manifest "
                             f"says {entry.get('size')} bytes with another checksum")
        try:
            frame = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=[""],
                                dtype={c: str for c in NAME_COLUMNS})
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise StoreError(f"{where} is not a valid CSV table ({_first_line(exc)})") from None
        if name == "tasks":
            _check_tasks(frame, where)
        return frame

    def accept(self, pipeline: str, version: str, run_id: str) -> None:
        """Mark ``run_id`` as the run where the baseline of ``pipeline``/``version`` restarts."""
        pipeline = validate_name(pipeline, "pipeline")
        version = validate_name(version, "version")
        run_id = validate_name(run_id, "run_id")
        if not self._exists(f"runs/{pipeline}/{run_id}/manifest.json"):
            raise StoreError(f"unknown run {run_id!r} of pipeline {pipeline!r} in {self.url}")
        body = _dump({"run_id": run_id, "accepted": datetime.now(UTC).isoformat()})
        try:
            self._put(f"accepted/{pipeline}/{version}/{run_id}", body, False)
        except Exception as exc:
            raise StoreError(f"could not write to {self.url}: {self._describe(exc)}") from None

    def accepted(self, pipeline: str, version: str) -> list[str]:
        """Accepted run ids of ``pipeline``/``version``, newest first."""
        base = f"accepted/{validate_name(pipeline, 'pipeline')}/{validate_name(version, 'version')}"
        ids = [rel.rsplit("/", 1)[1] for rel in self._find(base)
               if rel.count("/") == 3 and _valid_names(rel.rsplit("/", 1)[1:])]
        return sorted(ids, reverse=True)

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
        except FileNotFoundError:
            raise StoreError(f"{what} not found: no {self.location(rel)}") from None
        except Exception as exc:
            self._note_failure(exc)
            raise StoreError(f"could not read {self.location(rel)}: "
                             f"{self._describe(exc)}") from None

    def _exists(self, rel: str) -> bool:
        self._check_reachable()
        try:
            return bool(self.fs.exists(self._path(rel), **self._kw))
        except Exception as exc:
            self._note_failure(exc)
            raise StoreError(f"could not reach {self.url}: {self._describe(exc)}") from None

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
        return self._redact(f"{type(exc).__name__}: {_first_line(exc)}")

    def _redact(self, text: str) -> str:
        for value in self._secrets:
            text = text.replace(value, "***")
        return _SIGNED_QUERY.sub(lambda m: f"{m.group(1)}=***", text)


# ---------------------------------------------------------------------- module helpers
def _env_storage_options() -> dict:
    raw = os.environ.get("DASK_PROFILING_STORAGE_OPTIONS")
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except ValueError:
        raise ValueError("DASK_PROFILING_STORAGE_OPTIONS is not valid JSON") from None
    if not isinstance(options, dict):
        raise ValueError("DASK_PROFILING_STORAGE_OPTIONS must be a JSON object")
    return options


_UNREACHABLE = {"ConnectionError", "ReadTimeoutError", "ConnectionClosedError",
                "ClientConnectorError", "ServerDisconnectedError"}


def _unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says the endpoint did not answer, not that it refused."""
    seen = 0
    while exc is not None and seen < 5:
        if isinstance(exc, TimeoutError | ConnectionError) or any(
                cls.__name__ in _UNREACHABLE for cls in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _secret_values(options: dict | None) -> list[str]:
    values: list[str] = []
    for key, value in (options or {}).items():
        if isinstance(value, dict):
            values += _secret_values(value)
        elif key in _SECRET_OPTIONS and isinstance(value, str) and len(value) >= 4:
            values.append(value)
    return values


def _encode_files(tables: dict[str, pd.DataFrame],
                  extra_files: dict[str, bytes] | None) -> dict[str, bytes]:
    """The run's files by name: each table as CSV, then the extra files."""
    files: dict[str, bytes] = {}
    for name, frame in tables.items():
        validate_name(name, "table name")
        if not isinstance(frame, pd.DataFrame):
            raise ValueError(f"table {name!r} must be a pandas DataFrame")
        files[f"{name}.csv"] = frame.to_csv(index=False).encode()
    for name, data in (extra_files or {}).items():
        validate_name(name, "file name")
        if name == "manifest.json" or name in files:
            raise ValueError(f"file name {name!r} clashes with a table or the manifest")
        files[name] = data.encode() if isinstance(data, str) else bytes(data)
    return files


def _complete_manifest(pipeline: str, run_id: str, manifest: dict,
                       files: dict[str, bytes]) -> dict:
    if not isinstance(manifest, dict):
        raise ValueError("manifest must be a dict")
    doc = dict(manifest)
    for key, value in (("pipeline", pipeline), ("run_id", run_id)):
        if doc.setdefault(key, value) != value:
            raise ValueError(f"manifest {key} {doc[key]!r} differs from {value!r}")
    if doc.setdefault("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ValueError(f"manifest schema_version must be {SCHEMA_VERSION}")
    validate_name(doc.setdefault("version", "unknown"), "version")
    if doc.setdefault("status", "incomplete") not in STATUSES:
        raise ValueError(f"manifest status must be one of {', '.join(STATUSES)}, "
                         f"got {doc['status']!r}")
    doc.setdefault("state", "UNKNOWN")
    doc.setdefault("warnings", [])
    doc["files"] = {name: {"size": len(data), "sha256": _sha256(data)}
                    for name, data in files.items()}
    return json_clean(doc)


def _provisional(manifest: bytes) -> bool:
    """Whether a stored manifest is the provisional one a run writes before its verdict."""
    try:
        doc = json.loads(manifest)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("status") == "unjudged" and doc.get(
        "unjudged_reason") == "verdict pending"


def _check_tasks(frame: pd.DataFrame, where: str) -> None:
    missing = [c for c in TASKS_COLUMNS if c not in frame.columns]
    if missing:
        raise StoreError(f"{where} lacks column(s) {', '.join(missing)}")
    for column in TASKS_COLUMNS[2:]:
        if len(frame) and not pd.api.types.is_numeric_dtype(frame[column]):
            raise StoreError(f"{where} has non-numeric values in column {column}")
        if len(frame) and not frame[column].map(math.isfinite).all():
            raise StoreError(f"{where} has missing or infinite values in column {column}")


def _parse_marker(parts: list[str], info: dict) -> dict | str:
    """``{run_id, version, status}`` from ``[version, "<run_id>.<status>"]``, or why not."""
    if len(parts) != 2:
        return "not at index/<pipeline>/<version>/<run_id>.<status>"
    version, name = parts
    run_id, _, status = name.rpartition(".")
    if status not in STATUSES:
        return f"unknown status {status!r}"
    if not _valid_names([version, run_id]):
        return "invalid version or run id"
    if info.get("size") == 0:
        return "empty marker"
    return {"run_id": run_id, "version": version, "status": status}


def _upload_order(rels: list[str]) -> list[tuple[str, tuple[str, str] | None]]:
    """Spooled paths in upload order, each with the (pipeline, run_id) it completes, if any."""

    def rank(rel: str) -> tuple[int, str]:
        if rel.startswith("index/"):
            return 3, rel
        if rel.startswith("runs/") and rel.endswith("/manifest.json"):
            return 2, rel
        return (1 if rel.startswith("runs/") else 0), rel

    out = []
    for rel in sorted(rels, key=rank):
        parts = rel.split("/")
        run = None
        if parts[0] == "runs" and len(parts) >= 4:
            run = (parts[1], parts[2])
        elif parts[0] == "index" and len(parts) == 4:
            run = (parts[1], parts[3].rpartition(".")[0])
        out.append((rel, run))
    return out


def _valid_names(names: list[str]) -> bool:
    try:
        for name in names:
            validate_name(name, "name")
    except ValueError:
        return False
    return True


def _mtime(info: dict) -> datetime | None:
    for key in ("LastModified", "last_modified", "mtime", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            return datetime.fromtimestamp(value, UTC)
    return None


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _prune_empty(key_dir: Path) -> None:
    for folder in sorted((p for p in key_dir.rglob("*") if p.is_dir()), reverse=True):
        try:
            folder.rmdir()
        except OSError:
            pass
    if [p.name for p in key_dir.iterdir()] == [_SPOOL_META]:
        (key_dir / _SPOOL_META).unlink(missing_ok=True)
        key_dir.rmdir()


def _dump(doc: Any) -> bytes:
    return json.dumps(json_clean(doc), indent=2).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


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
        location = store.location(f"reports/{pipeline}/{run_id}/{stage}.html")
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
