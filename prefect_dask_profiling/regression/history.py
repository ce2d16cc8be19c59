"""Questions asked of a store's history: which runs, one run, two runs compared, a re-check.

Plain functions returning data; the ``dask-profiling`` commands print what they return.
Which runs form a baseline is :mod:`~prefect_dask_profiling.regression.baseline`; whether a
run counts as regressed is :func:`~prefect_dask_profiling.regression.verdict.run_outcome`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from prefect_dask_profiling.regression.baseline import (
    HISTORY_COLUMNS,
    Baseline,
    counts_in_baseline,
    load_baseline,
)
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.regression.verdict import (
    RunOutcome,
    detect_regressions,
    run_outcome,
)
from prefect_dask_profiling.store.runs import RunStore, StoreError

__all__ = ["HISTORY_COLUMNS", "Baseline", "Check", "accept_run", "check_run", "compare_runs",
           "counts_in_baseline", "find_run", "list_runs", "load_baseline", "open_store",
           "resolve_pipeline", "show_run"]

SHOW_COLUMNS = ["stage", "prefix", "tasks", "errors", "total_s", "p50_s", "p95_s", "gb_out",
                "share"]
MANIFEST_SUMMARY = ["run_id", "pipeline", "version", "status", "state", "regressed",
                    "unjudged_reason", "started", "ended", "wall_s", "workers", "threads",
                    "flow_run_name", "source_hash"]


def open_store(url: str | None) -> RunStore:
    """A store that exists (``StoreError`` naming it otherwise)."""
    store = RunStore(url)  # the URL is checked by store.url.check_store_url
    try:
        found = store.fs.exists(store.root)
    except Exception as exc:  # any transport error: say where and what, in one line
        raise StoreError(f"could not reach store {store.url}: {store._describe(exc)}") from None
    if not found:
        raise StoreError(f"no store at {store.url} (set --store or $DASK_PROFILING_STORE)")
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
    holders = [p for p in pipelines if any(e["run_id"] == run_id for e in store.list_runs(p))]
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


def list_runs(store: RunStore, pipeline: str, version: str | None = None) -> pd.DataFrame:
    """``run_id, version, status`` of the stored runs, newest first."""
    runs = store.list_runs(pipeline, version)
    if version is not None and not runs:
        raise StoreError(f"no runs of pipeline {pipeline!r} version {version!r} in {store.url}")
    return pd.DataFrame(runs, columns=["run_id", "version", "status"])


def show_run(store: RunStore, pipeline: str, run_id: str) -> tuple[dict[str, Any],
                                                                   pd.DataFrame]:
    """The manifest's summary fields and the run's per-prefix table."""
    manifest = store.read_manifest(pipeline, run_id)
    tasks = store.read_table(pipeline, run_id, "tasks")
    summary = {k: manifest.get(k) for k in MANIFEST_SUMMARY}
    summary["utilisation"] = (manifest.get("utilisation") or {}).get("run")
    summary["baseline"] = manifest.get("baseline")
    summary["stages"] = [s.get("name") for s in manifest.get("stages") or []
                         if isinstance(s, dict)]
    # per-stage bottleneck verdicts; runs stored before diagnoses existed have none
    summary["bottlenecks"] = {s.get("name"): s["diagnosis"] for s in manifest.get("stages") or []
                              if isinstance(s, dict) and isinstance(s.get("diagnosis"), dict)}
    if manifest.get("explanations"):
        summary["explanations"] = manifest["explanations"]
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
    both = a.join(b, how="outer", lsuffix="_a", rsuffix="_b").reset_index()
    both["ratio"] = both["total_s_b"] / both["total_s_a"]
    both["delta_s"] = both["total_s_b"].fillna(0.0) - both["total_s_a"].fillna(0.0)
    both = both.sort_values("delta_s", key=lambda s: s.abs(), ascending=False, kind="stable")
    return both[["stage", "prefix", "total_s_a", "total_s_b", "ratio", "delta_s", "tasks_a",
                 "tasks_b"]].reset_index(drop=True)


@dataclass
class Check:
    """The verdict of one stored run against its baseline.

    Attributes
    ----------
    status
        The run's stored status (what the run's own finish decided).
    outcome
        What the verdicts computed now mean for the run (:func:`run_outcome`).
    unjudged_reason
        Why the run was stored without a verdict, when its status is ``unjudged``.
    """

    run_id: str
    pipeline: str
    version: str
    baseline: Baseline
    verdicts: pd.DataFrame
    status: str = "healthy"
    outcome: RunOutcome | None = None
    unjudged_reason: str | None = None
    explanations: dict[str, Any] = field(default_factory=dict)

    @property
    def regressed(self) -> bool:
        """The run counts as regressed (never when it failed or is incomplete)."""
        outcome = self.outcome or run_outcome(self.verdicts)
        return outcome.regressed

    @property
    def unjudged(self) -> bool:
        """The run was stored without a verdict: someone should look at why."""
        return self.status == "unjudged"

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "pipeline": self.pipeline, "version": self.version,
                "status": self.status, "regressed": self.regressed,
                "unjudged_reason": self.unjudged_reason,
                "note": self.outcome.reason if self.outcome else "",
                "baseline": {"runs": self.baseline.runs, "note": self.baseline.note,
                             "skipped": [list(s) for s in self.baseline.skipped]},
                "verdicts": self.verdicts.to_dict(orient="records"),
                "explanations": self.explanations}


def check_run(store: RunStore, pipeline: str, run_id: str | None = None,
              version: str | None = None, rule: RegressionRule | None = None) -> Check:
    """Judge ``run_id`` (default: the newest run, of ``version`` if given) against its baseline.

    Parameters
    ----------
    store, pipeline
        Where the run is.
    run_id
        The run; default the newest one.
    version
        Only runs of this version (and the run must be of it).
    rule
        The regression rule; default :class:`RegressionRule` ().
    """
    rule = rule if rule is not None else RegressionRule()
    with store.remembering_reads():  # manifests and the listing are read more than once
        if run_id is None:
            runs = store.list_runs(pipeline, version)
            if not runs:
                what = f"pipeline {pipeline!r}" + (f" version {version!r}" if version else "")
                raise StoreError(f"no runs of {what} in {store.url}")
            run_id = runs[0]["run_id"]
        manifest = store.read_manifest(pipeline, run_id)
        run_version = manifest["version"]
        if version is not None and version != run_version:
            raise StoreError(f"run {run_id} is version {run_version!r}, not {version!r}")
        latest = store.read_table(pipeline, run_id, "tasks")
        baseline = load_baseline(store, pipeline, run_version, n=rule.history,
                                 exclude_run_id=run_id, before=run_id)
        verdicts = detect_regressions(baseline.history, latest, rule=rule)
        status = str(manifest.get("status") or "healthy")
        outcome = run_outcome(verdicts, failed=status == "failed",
                              incomplete=status == "incomplete")
        return Check(run_id, pipeline, run_version, baseline, verdicts, status=status,
                     outcome=outcome, unjudged_reason=manifest.get("unjudged_reason"),
                     explanations=_explain(store, pipeline, manifest, baseline, verdicts))


def _explain(store: RunStore, pipeline: str, manifest: dict[str, Any], baseline: Baseline,
             verdicts: pd.DataFrame) -> dict[str, Any]:
    """Why each regressed stage regressed (:mod:`~prefect_dask_profiling.regression.explain`);
    baseline manifests that cannot be read are left out."""
    from prefect_dask_profiling.regression.explain import explain_verdicts

    if verdicts.empty or not (verdicts["verdict"] == "regression").any():
        return {}
    manifests = []
    for run in baseline.runs:
        try:
            manifests.append(store.read_manifest(pipeline, run))
        except StoreError:
            continue
    return explain_verdicts(verdicts, manifest, manifests)


def accept_run(store: RunStore, pipeline: str, run_id: str) -> str:
    """Mark ``run_id`` as where its version's baseline restarts; returns the version."""
    version = store.read_manifest(pipeline, run_id)["version"]
    store.accept(pipeline, version, run_id)
    return version
