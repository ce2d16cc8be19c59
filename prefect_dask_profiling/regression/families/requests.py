"""The storage-request family: requests and bytes per chunk per stage (:mod:`..requests`).

Read from the stages' ``io`` of tonight and of the nights that count in the requests
baseline; one night is never conclusive (the next night confirms or clears it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pandas as pd

from prefect_dask_profiling.regression.families.base import REGISTRY, StageFamily
from prefect_dask_profiling.regression.requests import (
    REQUEST_VERDICT_COLUMNS,
    describe_requests,
    detect_requests,
    request_rows,
)
from prefect_dask_profiling.regression.rule import RegressionRule, Rules

__all__ = ["RequestsFamily"]


class RequestsFamily(StageFamily):
    """``request-regression`` when a stage's requests or bytes per chunk doubled."""

    name: ClassVar[str] = "requests"
    metrics: ClassVar[dict[str, str | None]] = {
        "requests_per_chunk": "requests", "bytes_per_chunk": "requests"}
    baseline: ClassVar[str | None] = "requests"
    table: ClassVar[str | None] = "request_verdicts"
    json_key: ClassVar[str] = "request_verdicts"
    event: ClassVar[str | None] = "dask-profiling.requests.detected"
    flags: ClassVar[tuple[str, ...]] = ("request-regression",)
    settings: ClassVar[tuple[str, ...]] = (
        "requests_regression", "requests_threshold", "requests_min_per_chunk", "history")
    columns: ClassVar[tuple[str, ...]] = tuple(REQUEST_VERDICT_COLUMNS)
    policy: ClassVar[tuple[tuple[str, tuple[str, ...], bool], ...]] = (
        ("requests_per_chunk", ("request-regression",), False),
        ("bytes_per_chunk", ("request-regression",), False))

    def history_size(self, rules: Rules) -> int:
        return rules.regression.history

    def judge_rows(self, manifests: tuple[Mapping[str, Any], ...],
                   tonight: Mapping[str, Any], rule: RegressionRule) -> pd.DataFrame:
        return detect_requests(request_rows(manifests), request_rows([dict(tonight)]), rule)

    def line(self, row: Any) -> str:
        return f"{row.stage}/{row.metric}: {row.ratio:.2f}x"

    def describe(self, rows: pd.DataFrame) -> str:
        return describe_requests(rows)


REGISTRY.register(RequestsFamily())
