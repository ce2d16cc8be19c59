"""The store URL: its default, the one validator, and keeping credentials out of text.

A store URL may carry credentials (``s3://key:secret@bucket``, a signed query string) and
storage options carry keys and secrets. Nothing written or printed by this package shows
them: messages use :func:`public_url` and :func:`redact`, ``repr`` uses
:func:`redacted_options`.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prefect_dask_profiling.errors import InvalidInput

DEFAULT_URL = "./.dask-profiling"
STORE_ENV = "DASK_PROFILING_STORE"
OPTIONS_ENV = "DASK_PROFILING_STORAGE_OPTIONS"
LOCAL_PROTOCOLS = (None, "file", "local")
S3_PROTOCOLS = ("s3", "s3a")
# Storage options whose values are credentials (matched case-insensitively, also nested).
SECRET_OPTIONS = ("key", "secret", "token", "password", "aws_access_key_id",
                  "aws_secret_access_key", "aws_session_token", "account_key", "sas_token",
                  "client_secret", "credentials", "session_token", "access_key", "secret_key")
# Storage options that change WHERE the data goes (not who writes it): part of a store's
# identity, e.g. for the spool. Dotted names are nested (``client_kwargs.endpoint_url``).
LOCATION_OPTIONS = ("endpoint_url", "client_kwargs.endpoint_url", "host", "port",
                    "account_name", "project")
_SIGNED_QUERY = re.compile(
    r"\b(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|AWSAccessKeyId|Signature|sig"
    r"|token|access_token|sas_token)=[^&\s\"']+", re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^/@\s\"']+@")


def resolve_url(url: str | None) -> str:
    """``url``, else ``$DASK_PROFILING_STORE``, else :data:`DEFAULT_URL`."""
    return url if url is not None else os.environ.get(STORE_ENV) or DEFAULT_URL


def protocol_of(url: str) -> str | None:
    """The lower-case protocol of ``url`` (``None`` for a plain local path)."""
    import fsspec

    protocol, _ = fsspec.core.split_protocol(url)
    return protocol.lower() if protocol else None


def check_store_url(url: object) -> str:
    """Return ``url`` if it can name a run store, else raise ``ValueError`` saying why.

    A store URL is a local folder (plain path or ``file://``), ``s3://bucket[/prefix]`` or
    any URL of an installed fsspec protocol. The message never repeats credentials the URL
    may carry (user info, signed query parameters).

    Parameters
    ----------
    url
        The candidate store URL.

    Raises
    ------
    ValueError
        For a non-string or empty URL, an unknown protocol, a protocol whose package is not
        installed, or an S3 URL without a bucket.
    """
    import fsspec

    if not isinstance(url, str) or not url.strip():
        shown = public_url(url) if isinstance(url, str) else type(url).__name__
        raise InvalidInput(f"store URL must be a non-empty string, got {shown!r}")
    protocol = protocol_of(url)
    if protocol in LOCAL_PROTOCOLS:
        return url
    if protocol in S3_PROTOCOLS and not s3_root(url):
        raise InvalidInput(f"store URL {public_url(url)!r} names no bucket: use "
                           "s3://bucket[/prefix]")
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise InvalidInput(f"store URL {public_url(url)!r} has an unknown protocol "
                           f"{protocol!r}") from None
    except ImportError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise InvalidInput(f"store protocol {protocol!r} needs a package that is not "
                           f"installed ({first})") from None
    return url


def s3_root(url: str) -> str:
    """``bucket/prefix`` of an ``s3://`` URL, without user info, query or fragment (``""``
    when it names no bucket)."""
    parts = urlsplit(url)
    bucket = parts.netloc.rpartition("@")[2]
    return f"{bucket}/{parts.path.strip('/')}".strip("/") if bucket else ""


def public_url(url: str) -> str:
    """``url`` without user info, query or fragment (where credentials could hide)."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # plain or Windows drive path
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


def env_storage_options() -> dict[str, Any]:
    """Storage options from ``$DASK_PROFILING_STORAGE_OPTIONS`` (a JSON object), or ``{}``."""
    raw = os.environ.get(OPTIONS_ENV)
    if not raw:
        return {}
    try:
        options = json.loads(raw)
    except ValueError:
        raise InvalidInput(f"{OPTIONS_ENV} is not valid JSON") from None
    if not isinstance(options, dict):
        raise InvalidInput(f"{OPTIONS_ENV} must be a JSON object")
    return options


def is_secret_key(key: object) -> bool:
    """Whether a storage option named ``key`` holds a credential."""
    return isinstance(key, str) and key.lower() in SECRET_OPTIONS


def secret_values(options: dict[str, Any] | None) -> list[str]:
    """The credential values in ``options`` (nested dicts included), to redact from text."""
    values: list[str] = []
    for key, value in (options or {}).items():
        if isinstance(value, dict):
            values += secret_values(value)
        elif is_secret_key(key) and isinstance(value, str) and len(value) >= 4:
            values.append(value)
    return values


def redacted_options(options: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of ``options`` whose credential values read ``***`` (for ``repr`` and logs)."""
    if options is None:
        return None
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out[key] = redacted_options(value)
        elif is_secret_key(key) and value is not None:
            out[key] = "***"
        elif isinstance(value, str) and "://" in value:
            out[key] = redact(value)
        else:
            out[key] = value
    return out


def redact(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """``text`` with ``secrets``, URL user info and signed query parameters replaced by ``***``."""
    for value in secrets:
        text = text.replace(value, "***")
    text = _USERINFO.sub("***@", text)
    return _SIGNED_QUERY.sub(lambda m: f"{m.group(1)}=***", text)


def location_options(storage_options: dict[str, Any] | None,
                     protocol: str | None = None) -> dict[str, str]:
    """The options in ``storage_options`` that change where data goes, redacted of credentials.

    Two stores with the same URL but another endpoint are different stores: their spooled
    files must never meet. For S3 without an explicit endpoint, ``$AWS_ENDPOINT_URL_S3`` /
    ``$AWS_ENDPOINT_URL`` (read by botocore) count too.
    """
    found: dict[str, str] = {}
    for name in LOCATION_OPTIONS:
        value: Any = storage_options or {}
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and value != "":
            found["endpoint_url" if name.endswith("endpoint_url") else name] = str(value)
    if protocol in S3_PROTOCOLS and "endpoint_url" not in found:
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if env:
            found["endpoint_url"] = env
    if "endpoint_url" in found:
        found["endpoint_url"] = public_url(found["endpoint_url"])
    return found
