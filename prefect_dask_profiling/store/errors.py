"""The store's one error type, shared by its modules."""

from __future__ import annotations


class StoreError(Exception):
    """Malformed stored content or an unknown run; the message is one clear line."""
