"""S3 helpers for the run store: a filesystem that cannot hang, lifecycle rules, presigned links.

Built around measured behaviour of s3fs/botocore against moto and SeaweedFS: botocore's
``Expect: 100-continue`` header makes PUTs hang forever against a half-dead endpoint, so it is
removed on the session; ``total_max_attempts`` (not ``max_attempts``) bounds the sends; and a
lifecycle PUT replaces the whole configuration, so rules are merged by ID.
"""

from __future__ import annotations

import errno
import hashlib
import json
from typing import Any, Required, TypedDict
from urllib.parse import parse_qs, urlsplit

from prefect_dask_profiling.store import layout

MAX_PRESIGN_S = 7 * 24 * 3600  # SigV4 links are valid for at most 7 days on AWS
RULE_ID_PREFIX = "dask-profiling"


class RuleFilter(TypedDict):
    """The objects an S3 lifecycle rule applies to: those under ``Prefix``."""

    Prefix: str


class RuleDays(TypedDict, total=False):
    """An S3 lifecycle action's delay: ``Days`` (expiration) or ``DaysAfterInitiation``
    (aborting a multipart upload)."""

    Days: int
    DaysAfterInitiation: int


class LifecycleRule(TypedDict, total=False):
    """One S3 lifecycle rule, keys as the S3 API spells them: the ones this package writes
    (:func:`lifecycle_rules`). Rules read back from a bucket may carry others (other
    filters, transitions), which :func:`merge_lifecycle` keeps as they are."""

    ID: Required[str]
    Status: Required[str]
    Filter: RuleFilter
    Expiration: RuleDays
    AbortIncompleteMultipartUpload: RuleDays


def make_s3fs(storage_options: dict[str, Any] | None, timeout: float) -> Any:
    """An ``s3fs.S3FileSystem`` whose calls fail within about ``timeout`` seconds.

    Parameters
    ----------
    storage_options
        The caller's options (``endpoint_url``, ``key``, ``secret``, ``token``,
        ``client_kwargs``, ``config_kwargs``, ...). They override the defaults here, key by key.
    timeout
        Seconds for connect/read timeouts; the caller also passes it as fsspec's per-call
        ``timeout=`` so that no call can outlast it.
    """
    import aiobotocore.session
    import botocore.handlers
    import s3fs

    options = dict(storage_options or {})
    config = {
        "connect_timeout": max(0.5, min(2.0, timeout / 2)),
        "read_timeout": max(1.0, timeout),
        "retries": {"total_max_attempts": 2, "mode": "standard"},
        "signature_version": "s3v4",
    }
    config.update(options.pop("config_kwargs", None) or {})
    if "session" not in options:
        session = aiobotocore.session.AioSession()
        session.unregister("before-call.s3", botocore.handlers.add_expect_header)
        options["session"] = session
    options.setdefault("skip_instance_cache", True)
    options.setdefault("use_listings_cache", False)
    # The store's objects are small: above 1, s3fs sends a HEAD before every GET to decide
    # on a parallel ranged download, doubling the round trips of reading a history.
    options.setdefault("max_concurrency", 1)
    fs = s3fs.S3FileSystem(config_kwargs=config, **options)
    fs.retries = 1  # s3fs's own outer retry loop (default 5) on top of botocore's attempts
    # the store's own calls are not a stage's storage requests (timing.worker_io's
    # UNCOUNTED_ATTRIBUTE)
    fs.dask_profiling_uncounted = True
    return fs


def error_code(exc: BaseException) -> str | None:
    """The S3 error code (``AccessDenied``, ``NoSuchBucket``, ...) behind an s3fs exception."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
    return None


def is_exists_error(exc: BaseException) -> bool:
    """Whether ``exc`` reports that an exclusive create found the object already there.

    moto raises ``FileExistsError``; SeaweedFS answers ``PreconditionFailed`` without the
    ``If-None-Match`` condition element, which s3fs turns into ``OSError(EINVAL)``.
    """
    if isinstance(exc, FileExistsError):
        return True
    if error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
        return True
    return (isinstance(exc, OSError) and exc.errno == errno.EINVAL
            and "condition" in str(exc).lower())


def lifecycle_rules(root_prefix: str, retention_days: int) -> list[LifecycleRule]:
    """The two rules for a store rooted at ``root_prefix`` inside its bucket.

    One expires ``<root>/reports/`` after ``retention_days``; the other aborts multipart
    uploads left behind under ``<root>/`` by crashed writers. Rule IDs carry the prefix, so
    stores sharing a bucket under different prefixes keep separate rules.
    """
    root = f"{root_prefix.strip('/')}/" if root_prefix.strip("/") else ""
    tag = root.rstrip("/").replace("/", "-") or "bucket"
    digest = hashlib.sha256(root.encode()).hexdigest()[:6]
    suffix = f"{tag[:180]}-{digest}"
    return [
        {"ID": f"{RULE_ID_PREFIX}-expire-reports-{suffix}", "Status": "Enabled",
         "Filter": {"Prefix": f"{root}{layout.REPORTS}/"},
         "Expiration": {"Days": int(retention_days)}},
        {"ID": f"{RULE_ID_PREFIX}-abort-uploads-{suffix}", "Status": "Enabled",
         "Filter": {"Prefix": root}, "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}},
    ]


def merge_lifecycle(fs: Any, bucket: str, rules: list[LifecycleRule],
                    timeout: float | None = None) -> bool:
    """Add or update ``rules`` by ID, keeping every other rule; return whether a PUT was made.

    Read-modify-write: S3 has no conditional lifecycle PUT, so two writers racing can still
    lose an update; running this again repairs it.
    """
    try:
        current = fs.call_s3("get_bucket_lifecycle_configuration", Bucket=bucket,
                             timeout=timeout)["Rules"]
    except FileNotFoundError as exc:  # also raised for NoSuchBucket
        if error_code(exc) != "NoSuchLifecycleConfiguration":
            raise
        current = []
    ids = {rule["ID"] for rule in rules}
    merged = [rule for rule in current if rule.get("ID") not in ids] + list(rules)
    if _canonical(merged) == _canonical(current):
        return False
    fs.call_s3("put_bucket_lifecycle_configuration", Bucket=bucket,
               LifecycleConfiguration={"Rules": merged}, timeout=timeout)
    return True


def _canonical(rules: list[LifecycleRule]) -> list[str]:
    return sorted(json.dumps(rule, sort_keys=True, default=str) for rule in rules)


def presign(fs: Any, path: str, expires_s: int, timeout: float | None = None) -> str | None:
    """A SigV4 GET link to ``bucket/key``, or ``None`` if it would carry a session token.

    Temporary credentials put ``X-Amz-Security-Token`` into the link, which would hand out a
    credential; such links are never returned.
    """
    expires = min(int(expires_s), MAX_PRESIGN_S)
    url = fs.url(path, expires=expires, timeout=timeout)
    query = {k.lower() for k in parse_qs(urlsplit(url).query)}
    if "x-amz-security-token" in query or "security-token" in query:
        return None
    return url
