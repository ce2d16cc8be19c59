"""The shapes of a benchmark session's data: one side's summary (``<session>/<side>/
summary.json``), its parts, and the session's comparison (``comparison.json``).

JSON data (non-finite numbers are ``null``); typed so the report, the comparison and the
command line read the same keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict

from prefect_dask_profiling.environment import Fingerprint

if TYPE_CHECKING:
    from prefect_dask_profiling.diagnosis.classify import ClassScore, Evidence, Signals
    from prefect_dask_profiling.diagnosis.signals import Batch
    from prefect_dask_profiling.summary.tables import PrefixSummary, UtilisationRow

__all__ = [
    "BenchConfigSummary",
    "BenchEnvironment",
    "BenchMetrics",
    "BenchSummary",
    "Bottleneck",
    "Comparison",
    "ImportCheck",
    "MetricComparison",
    "PerN",
    "Preflight",
    "PreflightVersions",
    "PreflightWorker",
    "SideVerdict",
]

KeyVersions = dict[str, str | None]
"""``{package: version}`` of the :data:`~prefect_dask_profiling.environment.KEY_PACKAGES`
one process reports."""


class BenchConfigSummary(TypedDict):
    """The inputs both sides ran with."""

    workload: str
    n: list[int]
    seeds: list[int]
    warmup: int
    repeats: int
    aggregates_per_batch: int


class ImportCheck(TypedDict, total=False):
    """Whether a worker imported one module: its version if it did, the error if not."""

    ok: Required[bool]
    version: str | None
    error: str


class PreflightWorker(TypedDict):
    """One worker as the preflight saw it (``None``: not reported)."""

    address: str
    name: str | None
    host: str | None
    hostname: str | None
    nthreads: int | None
    memory_limit: int | None
    python: str | None
    workload_versions: dict[str, str | None]


class PreflightVersions(TypedDict):
    """The key packages' versions of the client, the scheduler and each worker."""

    client: KeyVersions
    scheduler: KeyVersions
    workers: dict[str, KeyVersions]


class Preflight(TypedDict):
    """One side's cluster before anything ran (``bench.preflight.preflight``)."""

    scheduler: str | None
    n_workers: int
    total_threads: int
    workers: list[PreflightWorker]
    versions: PreflightVersions
    mismatches: list[str]
    required_modules: list[str]
    warnings: list[str]


class PerN(TypedDict):
    """One side's batches of one ``n``, summed."""

    aggregates: int
    succeeded: int
    wall_s: float
    median_batch_s: float
    throughput_agg_s: float | None


class BenchMetrics(TypedDict):
    """One side's throughput, task statistics, busy fraction and success
    (``bench.report.side_metrics``; ``None``: not measured)."""

    aggregates: int
    succeeded: int
    success_rate: float | None
    wall_s: float
    throughput_agg_s: float
    threads: int
    effective_threads: float
    throughput_per_thread: float | None
    throughput_per_effective_thread: float | None
    busy_fraction: float | None
    tasks: float | None
    task_median_s: float | None
    task_p95_s: float | None
    task_compute_s: float | None
    thread_cpu_s: float | None
    thread_noncpu_s: float | None
    cpu_fraction: float | None
    per_n: dict[str, PerN]
    errors: list[str]


class Bottleneck(TypedDict, total=False):
    """The classifier's verdict (the parts of ``diagnosis.classify.Classification`` a
    summary keeps): what bounds the side, how sure, and what to try."""

    primary: str
    secondary: str | None
    confidence: str
    agreeing_sources: int
    signals: list[Evidence]
    sources: list[str]
    disagreements: list[str]
    compatible: list[str]
    note: str
    actions: list[str]
    scores: dict[str, ClassScore]


class BenchSummary(TypedDict):
    """One side (``local`` or ``remote``) of a benchmark session. ``prefixes`` and
    ``utilisation`` are the run's per-prefix and utilisation tables as records."""

    schema: str
    side: str
    created: str
    config: BenchConfigSummary
    preflight: Preflight
    calibration: dict[str, Any]  # bench.calibrate.Calibration.to_dict
    metrics: BenchMetrics
    batches: list[Batch]
    signals: Signals
    bottleneck: Bottleneck
    prefixes: list[PrefixSummary]
    utilisation: list[UtilisationRow]
    warnings: list[str]
    artifacts: dict[str, str]


class MetricComparison(TypedDict, total=False):
    """One metric on each side measured, and remote over local when both were."""

    metric: Required[str]
    local: float | None
    remote: float | None
    remote_vs_local: float | None


class SideVerdict(TypedDict):
    """A side's bottleneck in brief."""

    primary: str
    secondary: str | None
    confidence: str
    note: str


class BenchEnvironment(Fingerprint):
    """The client's fingerprint and the session's ``BenchConfig`` (as its fields)."""

    config: dict[str, Any]  # dataclasses.asdict(bench.config.BenchConfig)


class Comparison(TypedDict):
    """``comparison.json`` (``bench.report.compare``; ``environment`` added by the
    session): the metric table, each side's verdict, the rubric's reading and warnings.
    ``config`` is the first side's (empty when no side ran)."""

    schema: str
    sides: list[str]
    identical_inputs: bool
    config: BenchConfigSummary
    table: list[MetricComparison]
    verdicts: dict[str, SideVerdict]
    rubric: list[str]
    warnings: dict[str, list[str]]
    environment: NotRequired[BenchEnvironment]
