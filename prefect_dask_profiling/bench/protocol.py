"""The profiling protocol: apples-to-apples local vs remote benchmark sessions.

``dask-profiling bench --workload pkg.mod:fn --scheduler tcp://HOST:PORT --n 128,256
--seeds 1,2,3 --warmup 1 --repeats 3 --out DIR`` runs the same inputs (same ``n`` values,
seeds, aggregates per batch and warmup policy) on a local cluster and on the remote one:

1. **preflight** — :mod:`prefect_dask_profiling.bench.preflight`: worker visibility and metadata,
   the workload's module importable on every worker (what is missing is named), client /
   scheduler / worker version mismatches (listed), environment fingerprint, and a warning
   when the "remote" scheduler is on the loopback or on this machine;
2. **calibration** — :mod:`prefect_dask_profiling.bench.calibrate` → effective threads;
3. **warmup** — ``warmup`` untimed batches per ``n`` (results forgotten before measuring);
4. **measured phase** — ``repeats`` batches per ``n``, each batch one aggregate per seed,
   under a Dask ``performance_report``, the :class:`~prefect_dask_profiling.timing.TaskTimings`
   plugin, the task stream and before/after :mod:`~prefect_dask_profiling.bench.probes` of the
   scheduler, fine performance metrics and worker transfer logs
   (:mod:`prefect_dask_profiling.bench.measure`);
5. **signals → verdict** — :func:`~prefect_dask_profiling.diagnosis.signals.extract_signals` builds
   the signal dict, :func:`~prefect_dask_profiling.diagnosis.classify.classify` (pure) names the
   bottleneck.

This module runs the session (:func:`run_bench`: clusters from
:mod:`prefect_dask_profiling.bench.clusters`, each side measured, then the comparison and notes of
:mod:`prefect_dask_profiling.bench.report`); ``dask-profiling bench``
(:mod:`prefect_dask_profiling.cli.bench`) calls it. The inputs are a
:class:`~prefect_dask_profiling.bench.config.BenchConfig`.

Artifacts::

    DIR/<timestamp>/local/summary.json, local/performance_report.html
    DIR/<timestamp>/remote/summary.json, remote/performance_report.html
    DIR/<timestamp>/comparison.json, notes.md

Bad input (unknown workload, unreachable scheduler, no workers, workload not importable on
the workers) raises :class:`~prefect_dask_profiling.bench.config.BenchInputError`, a
``ValueError``: the CLI prints it as one line and exits 2.
"""

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
