"""The profiling protocol (``dask-profiling bench``): the same workload, local vs remote.

:func:`run_bench` runs preflight, calibration, warmup and the measured phase on each
cluster, then the signals, the classifier's verdict and the comparison (docs/diagnosis.md).
It writes ``DIR/<timestamp>/{local,remote}/summary.json`` and ``performance_report.html``,
``comparison.json`` and ``notes.md``. Bad input raises
:class:`~prefect_dask_profiling.bench.config.BenchInputError` (the CLI exits 2)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from prefect_dask_profiling._util import json_clean
from prefect_dask_profiling.bench.clusters import connect, local_cluster
from prefect_dask_profiling.bench.config import BenchConfig, load_workload
from prefect_dask_profiling.bench.measure import Progress, run_side
from prefect_dask_profiling.bench.report import compare, notes_markdown
from prefect_dask_profiling.bench.types import BenchEnvironment, BenchSummary, Comparison
from prefect_dask_profiling.environment import environment_fingerprint


@dataclass
class BenchResult:
    """Where a session wrote its artifacts, and what it found."""

    directory: Path
    summaries: dict[str, BenchSummary]
    comparison: Comparison
    notes: str


def _session_dir(root: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = root / stamp
    i = 1
    while path.exists():
        path = root / f"{stamp}-{i}"
        i += 1
    return path


def run_bench(config: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """Run the whole protocol; write the artifacts; return them.

    Raises
    ------
    BenchInputError
        Bad input, found before anything is measured.
    """
    progress = progress or (lambda message: None)
    config.validate()
    fn = load_workload(config.workload)
    remote_client = None
    if config.scheduler:
        remote_client = connect(config.scheduler, config.connect_timeout, config.worker_wait)
    try:
        directory = _session_dir(Path(config.out))
        summaries: dict[str, BenchSummary] = {}
        if config.local:
            progress(f"local: starting {config.local_workers} workers × "
                     f"{config.local_threads} threads")
            with local_cluster(config) as client:
                summaries["local"] = run_side(client, "local", config, fn, directory, progress)
        if remote_client is not None:
            summaries["remote"] = run_side(remote_client, "remote", config, fn, directory,
                                           progress)
    finally:
        if remote_client is not None:
            remote_client.close()
    environment: BenchEnvironment = {**environment_fingerprint(), "config": asdict(config)}
    comparison = json_clean(compare(summaries))
    comparison["environment"] = json_clean(environment)
    notes = notes_markdown(summaries, comparison, environment)
    (directory / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
    (directory / "notes.md").write_text(notes)
    progress(f"artifacts in {directory}")
    return BenchResult(directory, summaries, comparison, notes)
