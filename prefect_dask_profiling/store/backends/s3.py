"""The S3 backend: ``s3://bucket[/prefix]`` (or ``s3a://``) through s3fs.

Different from fsspec's defaults: the filesystem cannot hang (``store.s3.make_s3fs``);
every listing is one ``list_objects_v2`` request per 1,000 keys (s3fs's ``ls`` and
``find`` send a HEAD and a second listing for an empty folder); run folders are listed
from a name on (``StartAfter``); what is written carries its content type; reports expire
by a lifecycle rule; links are presigned.
"""

from __future__ import annotations

import os
from typing import Any, Required, TypedDict

from prefect_dask_profiling.store import compression, s3
from prefect_dask_profiling.store.backends.base import Backend, FileInfo, Folders, LifecyclePlan
from prefect_dask_profiling.store.url import s3_root

_CONTENT_TYPES = {".html": compression.HTML_CONTENT_TYPE, ".csv": "text/csv",
                  ".json": "application/json"}


class ListRequest(TypedDict, total=False):
    """The arguments of one S3 ``ListObjectsV2`` call: the bucket and key prefix, ``/`` as
    the ``Delimiter`` to list folders, where to start and the next page's token."""

    Bucket: Required[str]
    Prefix: Required[str]
    Delimiter: str
    StartAfter: str
    ContinuationToken: str


class S3Backend(Backend):
    """A bucket (and prefix) on S3 or an S3-compatible endpoint, through s3fs."""

    name = "s3"

    def connect(self, url: str, storage_options: dict[str, Any]) -> tuple[Any, str, str]:
        """The s3fs filesystem of :func:`~prefect_dask_profiling.store.s3.make_s3fs` (no
        ``Expect: 100-continue`` hangs, bounded retries), ``bucket/prefix``, its URL."""
        root = s3_root(url)
        return s3.make_s3fs(storage_options, self.timeout), root, f"s3://{root}"

    def put(self, rel: str, data: bytes, exclusive: bool, options: dict[str, Any]) -> None:
        """As :meth:`Backend.put`, with the object's ``ContentType`` (a report opens as a
        page from a link); a page (``.html``) goes gzip-compressed, its ``ContentEncoding``
        ``gzip``: 7-8 times fewer bytes stored and sent, decoded by the browser (and by
        httpx, curl ``--compressed``...) that opens the link. Still one PUT."""
        content_type = _CONTENT_TYPES.get(os.path.splitext(rel)[1], "application/octet-stream")
        headers = {**options, "ContentType": content_type}
        if compression.is_page(rel):
            data = data if compression.is_gzip(data) else compression.gzip_page(data)
            headers["ContentEncoding"] = "gzip"
        super().put(rel, data, exclusive, headers)

    def children(self, rel: str) -> list[str]:
        """Names directly below folder ``rel``: one :meth:`listing`."""
        return list(self.listing(rel))

    def listing(self, rel: str) -> dict[str, FileInfo]:
        """Entries directly below folder ``rel``: one delimited listing."""
        files, folders = self.list_objects(rel, folders=True)
        out = {path.rpartition("/")[2]: info for path, info in files.items()}
        out.update({name: {"type": "directory"} for name in folders})
        return out

    def find(self, rel: str) -> dict[str, FileInfo]:
        """Files below ``rel``: one listing without delimiter."""
        return self.list_objects(rel, folders=False)[0]

    def folders(self, rel: str, start_after: str, stop: str | None) -> Folders:
        """Folders below ``rel`` after ``start_after``, no page asked for past ``stop``:
        the folders of a window's months, not of the whole history."""
        return Folders(self.list_objects(rel, folders=True, start_after=start_after, stop=stop)[1],
                       bounded=True)

    def list_objects(self, rel: str, *, folders: bool, start_after: str | None = None,
             stop: str | None = None) -> tuple[dict[str, FileInfo], list[str]]:
        """One paged S3 listing below folder ``rel``: ``({path relative to the root: info},
        [folder names])``, in key order; ``({}, [])`` when there is nothing (or no bucket).

        One ``list_objects_v2`` request per 1,000 keys and nothing else: s3fs's ``find`` and
        ``ls`` send a HEAD and a second listing for an empty folder (an accepted-runs folder
        is empty in most stores, and listed every night).

        Parameters
        ----------
        rel
            The folder, relative to the root.
        folders
            List with the delimiter ``/``: the files and folders directly below ``rel``.
            Otherwise every file below it, and no folders.
        start_after
            Only names (relative to ``rel``) after this one (S3's ``StartAfter``).
        stop
            Ask for no page after one that reached past this name: the caller needs the
            names up to it only.
        """
        bucket, _, key = self.path(rel).partition("/")
        prefix = f"{key}/" if key else ""
        kwargs: ListRequest = {"Bucket": bucket, "Prefix": prefix}
        if folders:
            kwargs["Delimiter"] = "/"
        if start_after is not None:
            kwargs["StartAfter"] = prefix + start_after
        files: dict[str, FileInfo] = {}
        names: list[str] = []
        below = f"{rel}/" if rel else ""
        try:
            while True:
                page = self.fs.call_s3("list_objects_v2", **kwargs, **self.call_kw)
                last = ""
                for item in page.get("Contents") or []:
                    name = item["Key"][len(prefix):]
                    last = max(last, name)
                    if name and not name.endswith("/"):  # not a folder placeholder
                        files[below + name] = {**item, "name": f"{bucket}/{item['Key']}",
                                               "size": item["Size"], "type": "file"}
                for common in page.get("CommonPrefixes") or []:
                    name = common["Prefix"][len(prefix):].rstrip("/")
                    last = max(last, name)
                    names.append(name)
                if not page.get("IsTruncated") or (stop is not None and last > stop):
                    return files, sorted(names)
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        except FileNotFoundError:
            return {}, []

    def lifecycle(self, retention_days: int) -> LifecyclePlan:
        """The bucket's two rules for this store (:func:`~prefect_dask_profiling.store.s3.
        lifecycle_rules`): ``reports/`` expires, abandoned multipart uploads are aborted."""
        bucket, _, prefix = self.root.partition("/")
        rules = s3.lifecycle_rules(prefix, retention_days)
        return LifecyclePlan(bucket, rules[0]["Filter"]["Prefix"], rules,
                             "s3:GetLifecycleConfiguration and s3:PutLifecycleConfiguration")

    def put_lifecycle(self, plan: LifecyclePlan) -> None:
        """Merge ``plan``'s rules into the bucket's by rule ID (one GET, a PUT if needed)."""
        s3.merge_lifecycle(self.fs, plan.container, plan.rules, timeout=self.timeout)

    def link_expiry(self, expires_s: int) -> int | None:
        """``expires_s``, at most 7 days (SigV4's limit)."""
        return min(expires_s, s3.MAX_PRESIGN_S)

    def presign(self, rel: str, expires_s: int) -> str | None:
        """A SigV4 GET link to ``rel`` (:func:`~prefect_dask_profiling.store.s3.presign`:
        ``None`` when it would carry a session token)."""
        return s3.presign(self.fs, self.path(rel), expires_s, timeout=self.timeout)
