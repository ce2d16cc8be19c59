"""The shape of one side's benchmark summary (``<session>/<side>/summary.json``).

JSON data (non-finite numbers are ``null``); typed so the report, the comparison and the
command line read the same keys.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["BenchConfigSummary", "BenchSummary", "Bottleneck"]


class BenchConfigSummary(TypedDict):
    """The inputs both sides ran with."""

    workload: str
    n: list[int]
    seeds: list[int]
    warmup: int
    repeats: int
    aggregates_per_batch: int


class Bottleneck(TypedDict, total=False):
    """The classifier's verdict: what bounds the side, how sure, and what to try."""

    primary: str
    secondary: str | None
    confidence: str
    signals: Any
    sources: Any
    disagreements: Any
    compatible: Any
    note: str
    actions: list[str]
    scores: dict[str, Any]


class BenchSummary(TypedDict):
    """One side (``local`` or ``remote``) of a benchmark session."""

    schema: str
    side: str
    created: str
    config: BenchConfigSummary
    preflight: dict[str, Any]
    calibration: dict[str, Any]
    metrics: dict[str, Any]
    batches: list[dict[str, Any]]
    signals: dict[str, Any]
    bottleneck: Bottleneck
    prefixes: list[dict[str, Any]]
    utilisation: list[dict[str, Any]]
    warnings: list[str]
    artifacts: dict[str, str]
