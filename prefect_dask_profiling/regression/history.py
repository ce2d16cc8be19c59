"""Questions asked of a store's history: which runs, one run, two runs compared, accepting.

Plain functions returning data; the ``dask-profiling`` commands print what they return.
Which runs form a baseline is :mod:`~prefect_dask_profiling.regression.baseline`; judging a
stored run again (``check``) is :func:`~prefect_dask_profiling.regression.judge.judge_stored`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, cast

import pandas as pd

from prefect_dask_profiling.store.errors import StoreNotFound
from prefect_dask_profiling.store.runs import RunStore, StoreError

if TYPE_CHECKING:
    from prefect_dask_profiling.forecast.model import HistoryStats
    from prefect_dask_profiling.regression.explain import Explanation
    from prefect_dask_profiling.store.manifest import Baseline, ChunksVsBlocks
    from prefect_dask_profiling.summary.io import StageIO

__all__ = ["accept_run", "compare_runs", "eta_plan", "find_run", "list_runs", "open_store",
           "resolve_pipeline", "show_run"]

SHOW_COLUMNS = ["stage", "prefix", "tasks", "errors", "total_s", "p50_s", "p95_s", "gb_out",
                "share"]
MANIFEST_SUMMARY = ["run_id", "pipeline", "version", "status", "state", "regressed",
                    "unjudged_reason", "started", "ended", "wall_s", "workers", "threads",
                    "flow_run_name", "source_hash"]


class StageStorage(TypedDict):
    """A stage's storage requests and its chunks against the files' blocks (either may be
    ``None``)."""

    io: StageIO | None
    chunks_vs_blocks: ChunksVsBlocks | None


class RunSummary(TypedDict, total=False):
    """What ``dask-profiling show`` prints of a run (:func:`show_run`), in this order: the
    manifest's :data:`MANIFEST_SUMMARY` fields (``None`` when absent), the run's
    utilisation, baseline and stage names, the stages' bottleneck diagnoses, the regressed
    stages' explanations (only when the run has some), the stages' storage requests and the
    warnings."""

    # who ran
    run_id: str
    pipeline: str
    version: str
    flow_run_name: str | None
    source_hash: str | None
    # how it ended
    status: str
    regressed: bool | None
    unjudged_reason: str | None
    state: str | None
    # when, and on what
    started: str | None
    ended: str | None
    wall_s: float | None
    workers: int | None
    threads: int | None
    utilisation: float | None
    baseline: Baseline | None
    stages: list[str]
    bottlenecks: dict[str, dict[str, Any]]  # each a Diagnosis.to_dict
    explanations: dict[str, Explanation]
    storage: dict[str, StageStorage]
    warnings: list[str]


def open_store(url: str | None) -> RunStore:
    """A store that exists (``StoreError`` naming it otherwise)."""
    store = RunStore(url)  # the URL is checked by store.url.check_store_url
    if not store.root_exists():  # StoreUnreachable / StoreAccessDenied name the store
        raise StoreNotFound(f"no store at {store.url} (set --store or $DASK_PROFILING_STORE)")
    return store


def resolve_pipeline(store: RunStore, pipeline: str | None) -> str:
    """``pipeline`` if the store has runs of it; the only pipeline when none is given."""
    known = store.list_pipelines()
    if pipeline is None:
        if len(known) == 1:
            return known[0]
        names = ", ".join(known) or "none"
        raise StoreError(f"--pipeline is required: store {store.url} holds pipelines: {names}")
    if pipeline not in known:
        names = ", ".join(known) or "none"
        raise StoreError(f"unknown pipeline {pipeline!r} in store {store.url} "
                         f"(known: {names})")
    return pipeline


def find_run(store: RunStore, run_id: str, pipeline: str | None = None) -> str:
    """The pipeline holding ``run_id``: run ids are unique, so no pipeline needs naming.

    Parameters
    ----------
    store
        Where to look.
    run_id
        The run.
    pipeline
        When given, only checked to exist (the run is then looked up there).

    Raises
    ------
    StoreError
        When no pipeline, or more than one, holds the run (naming them).
    """
    if pipeline is not None:
        return resolve_pipeline(store, pipeline)
    pipelines = store.list_pipelines()
    holders = [p for p in pipelines if store.run_entry(p, run_id) is not None]
    if not holders:  # a run whose index marker was never written still has its manifest
        holders = [p for p in pipelines if _has_manifest(store, p, run_id)]
    if not holders:
        raise StoreError(f"run {run_id} not found in store {store.url}")
    if len(holders) > 1:
        raise StoreError(f"run {run_id} is in several pipelines ({', '.join(holders)}): "
                         "choose one with --pipeline")
    return holders[0]


def _has_manifest(store: RunStore, pipeline: str, run_id: str) -> bool:
    try:
        store.read_manifest(pipeline, run_id)
    except StoreError:
        return False
    return True


def eta_plan(store: RunStore, pipeline: str, version: str | None = None,
             history: int | None = None) -> HistoryStats:
    """What the live ETA of the pipeline's next run starts from: per stage the p50 / p90 of
    its duration over the time baseline the run would be judged against (same version:
    ``version``, default the newest run's), and from which nights.

    Raises
    ------
    StoreError
        When the pipeline has no runs (of ``version``).
    """
    from prefect_dask_profiling.forecast.model import history_stats
    from prefect_dask_profiling.regression.judge import load_history
    from prefect_dask_profiling.regression.rule import RegressionRule, Rules
    from prefect_dask_profiling.store.manifest import RunKey

    if version is None:
        newest = store.newest_run(pipeline)
        if newest is None:
            raise StoreError(f"no runs of pipeline {pipeline!r} in {store.url}")
        version = str(newest["version"])
    rules = Rules.from_options(history=history or RegressionRule.history)
    with store.remembering_reads():
        found = load_history(store, RunKey("", pipeline, version), rules)
    return history_stats(pipeline, version, found.manifests, found.baseline.history,
                         needed=rules.regression.min_history)


def list_runs(store: RunStore, pipeline: str, version: str | None = None) -> pd.DataFrame:
    """``run_id, version, status`` of the stored runs, newest first."""
    runs = store.list_runs(pipeline, version)
    if version is not None and not runs:
        raise StoreError(f"no runs of pipeline {pipeline!r} version {version!r} in {store.url}")
    return pd.DataFrame(runs, columns=["run_id", "version", "status"])


def show_run(store: RunStore, pipeline: str, run_id: str) -> tuple[RunSummary, pd.DataFrame]:
    """The manifest's summary fields and the run's per-prefix table."""
    manifest = store.read_manifest(pipeline, run_id)
    tasks = store.read_table(pipeline, run_id, "tasks")
    summary = cast(RunSummary, {k: manifest.get(k) for k in MANIFEST_SUMMARY})
    summary["utilisation"] = (manifest.get("utilisation") or {}).get("run")
    summary["baseline"] = manifest.get("baseline")
    summary["stages"] = [s.get("name") for s in manifest.get("stages") or []
                         if isinstance(s, dict)]
    # per-stage bottleneck verdicts; runs stored before diagnoses existed have none
    summary["bottlenecks"] = {s.get("name"): d for s in manifest.get("stages") or []
                              if isinstance(s, dict) and isinstance(d := s.get("diagnosis"), dict)}
    explanations = cast(dict, manifest).get("explanations")  # the judgement's part
    if explanations:
        summary["explanations"] = explanations
    # storage requests per stage; runs stored before they were counted have none
    summary["storage"] = {s.get("name"): {"io": s.get("io"),
                                          "chunks_vs_blocks": s.get("chunks_vs_blocks")}
                          for s in manifest.get("stages") or []
                          if isinstance(s, dict) and (s.get("io") or s.get("chunks_vs_blocks"))}
    summary["warnings"] = manifest.get("warnings") or []
    return summary, tasks[[c for c in SHOW_COLUMNS if c in tasks.columns]]


def compare_runs(store: RunStore, pipeline: str, run_a: str, run_b: str) -> pd.DataFrame:
    """Per (stage, prefix): total seconds and tasks of both runs, and the ratio B / A."""
    a = store.read_table(pipeline, run_a, "tasks")[["stage", "prefix", "tasks", "total_s"]]
    b = store.read_table(pipeline, run_b, "tasks")[["stage", "prefix", "tasks", "total_s"]]
    keys = ["stage", "prefix"]
    a, b = (f.astype({"stage": str, "prefix": str}).groupby(keys).sum() for f in (a, b))
    both = a.merge(b, how="outer", left_index=True, right_index=True,
                   suffixes=("_a", "_b")).reset_index()
    both["ratio"] = both["total_s_b"] / both["total_s_a"]
    both["delta_s"] = both["total_s_b"].fillna(0.0) - both["total_s_a"].fillna(0.0)
    both = both.sort_values("delta_s", key=lambda s: s.abs(), ascending=False, kind="stable")
    return both[["stage", "prefix", "total_s_a", "total_s_b", "ratio", "delta_s", "tasks_a",
                 "tasks_b"]].reset_index(drop=True)


def accept_run(store: RunStore, pipeline: str, run_id: str) -> str:
    """Mark ``run_id`` as where its version's baseline restarts; returns the version."""
    version = store.read_manifest(pipeline, run_id)["version"]
    store.accept(pipeline, version, run_id)
    return version
