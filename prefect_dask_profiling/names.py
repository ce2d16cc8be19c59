"""Validation of every name that becomes part of a storage path or an artifact key."""

from __future__ import annotations

import re
import unicodedata

MAX_LENGTH = 128
_ARTIFACT_KEY = re.compile(r"[^a-z0-9]+")


def validate_name(value: object, field: str) -> str:
    """Return ``value`` if it is safe as one path segment, else raise ``ValueError``.

    Parameters
    ----------
    value
        The candidate name (pipeline, stage, run id, version, ...).
    field
        What the name is, for the error message.
    """
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string, got {type(value).__name__}")
    if not value or not value.strip():
        raise ValueError(f"{field} must not be empty")
    if value != value.strip():
        raise ValueError(f"{field} must not start or end with whitespace: {value!r}")
    if len(value) > MAX_LENGTH:
        raise ValueError(f"{field} is longer than {MAX_LENGTH} characters")
    if any(unicodedata.category(ch)[0] in "CZ" and ch != " " for ch in value):
        raise ValueError(f"{field} must not contain control or separator characters: {value!r}")
    if "/" in value or "\\" in value or ":" in value:
        raise ValueError(f"{field} must not contain '/', '\\\\' or ':': {value!r}")
    if value in (".", "..") or ".." in value or value.startswith("."):
        raise ValueError(f"{field} must not contain '..' or start with '.': {value!r}")
    if any(ch in value for ch in "*?[]{}#%\"'<>|"):
        raise ValueError(f"{field} must not contain glob or URL special characters: {value!r}")
    return value


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from ``parts``."""
    key = "-".join(_ARTIFACT_KEY.sub("-", p.lower()).strip("-") for p in parts if p)
    key = re.sub(r"-{2,}", "-", key).strip("-")
    return key or "dask-profiling"
