"""The memory family: peak and spilled bytes per stage against the memory baseline, and
near-OOM (:mod:`..memory`).

Read from the stages' ``memory`` of tonight and of the nights that count in the memory
baseline (``memory_history`` of them). One night of a relative metric is never conclusive
(the next night confirms or clears it); near-OOM is absolute and conclusive at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd

from prefect_dask_profiling.regression.families.base import REGISTRY, StageFamily
from prefect_dask_profiling.regression.memory import (
    MEMORY_VERDICT_COLUMNS,
    describe_memory,
    detect_memory,
    history_from_manifests,
    latest_from_manifest,
)
from prefect_dask_profiling.regression.rule import RegressionRule, Rules

__all__ = ["MemoryFamily"]


class MemoryFamily(StageFamily):
    """``memory-regression`` (peak or spilled bytes) and ``near-oom`` (headroom) per stage."""

    name: ClassVar[str] = "memory"
    metrics: ClassVar[dict[str, str | None]] = {
        "peak_bytes": "memory", "spilled_bytes": "memory", "headroom": None}
    baseline: ClassVar[str | None] = "memory"
    table: ClassVar[str | None] = "memory_verdicts"
    json_key: ClassVar[str] = "memory_verdicts"
    event: ClassVar[str | None] = "dask-profiling.memory.detected"
    flags: ClassVar[tuple[str, ...]] = ("memory-regression", "near-oom")
    settings: ClassVar[tuple[str, ...]] = (
        "memory_regression", "memory_history", "memory_threshold", "memory_z_threshold",
        "memory_mad_floor", "memory_onset_chance", "memory_min_fraction", "memory_min_bytes",
        "near_oom", "near_oom_headroom")
    columns: ClassVar[tuple[str, ...]] = tuple(MEMORY_VERDICT_COLUMNS)
    policy: ClassVar[tuple[tuple[str, tuple[str, ...], bool], ...]] = (
        ("peak_bytes", ("memory-regression",), False),
        ("spilled_bytes", ("memory-regression",), False),
        ("headroom", ("near-oom",), True))

    def history_size(self, rules: Rules) -> int:
        return rules.regression.memory_history

    def judge_rows(self, manifests: tuple[Mapping[str, Any], ...],
                   tonight: Mapping[str, Any], rule: RegressionRule) -> pd.DataFrame:
        return detect_memory(history_from_manifests(manifests),
                             latest_from_manifest(dict(tonight)), rule)

    def describe(self, rows: pd.DataFrame) -> str:
        return describe_memory(rows)


REGISTRY.register(MemoryFamily())
