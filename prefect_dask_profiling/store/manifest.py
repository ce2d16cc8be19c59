"""The run manifest: the small JSON document that makes a stored run complete.

Built from the run record, its summary and utilisation, the stages' reports and the
environment; written last by :meth:`~prefect_dask_profiling.store.runs.RunStore.write_run`.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

import pandas as pd

from prefect_dask_profiling._util import json_clean

SCHEMA_VERSION = 1
FINGERPRINT_PACKAGES = ("dask", "distributed", "prefect", "prefect-dask", "pandas", "numpy",
                        "prefect-dask-profiling")
STATUSES = ("healthy", "regressed", "failed", "incomplete", "unjudged")


@dataclass
class StageInfo:
    """One stage as the manifest lists it."""

    name: str
    wall_s: float = 0.0
    tasks: int = 0
    task_s: float = 0.0
    report: dict[str, Any] | None = None
    note: str | None = None


@dataclass
class RunContext:
    """Who ran: identifiers of the run, known before the record is collected."""

    run_id: str
    pipeline: str
    version: str
    source_hash: str | None = None
    flow_run_id: str | None = None
    flow_run_name: str | None = None
    deployment: str | None = None
    started: datetime = field(default_factory=lambda: datetime.now(UTC))


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(client=None) -> dict[str, Any]:
    """Versions of the stack here and any client/scheduler/worker mismatch."""
    env: dict[str, Any] = {"python": platform.python_version()}
    for name in FINGERPRINT_PACKAGES:
        env[name.replace("-", "_")] = package_version(name)
    env["mismatches"] = version_mismatches(client) if client is not None else []
    return env


def version_mismatches(client) -> list[str]:
    """Packages whose versions differ between client, scheduler and workers."""
    try:
        versions = client.get_versions(check=False)
    except Exception as exc:  # a dying cluster must not cost the summary
        return [f"versions not collected: {exc!r}"]
    sides = {"client": versions.get("client", {}), "scheduler": versions.get("scheduler", {})}
    sides.update({f"worker {w}": v for w, v in (versions.get("workers") or {}).items()})
    mismatches = []
    for pkg in ("python", "dask", "distributed", "msgpack", "cloudpickle", "numpy", "pandas",
                "toolz", "tornado", "lz4"):
        seen = {}
        for side, info in sides.items():
            value = (info.get("packages") or {}).get(pkg)
            if pkg == "python":
                value = (info.get("host") or {}).get("python") or value
            if value is not None:
                seen.setdefault(str(value), []).append(side)
        if len(seen) > 1:
            detail = "; ".join(f"{v} on {', '.join(s)}" for v, s in seen.items())
            mismatches.append(f"{pkg}: {detail}")
    return mismatches


def status_for(state: str, regressed: bool, judged: bool = True) -> str:
    """Index status of a run from the flow's final state and the verdict.

    A run that completed but whose verdict could not be computed is ``unjudged``: it is
    kept out of every baseline and ``dask-profiling check`` fails for it.
    """
    if state not in ("COMPLETED", "FAILED") or (state == "FAILED" and not regressed):
        return "failed" if state != "UNKNOWN" else "incomplete"
    if not judged:
        return "unjudged"
    return "regressed" if regressed else "healthy"


def build_manifest(ctx: RunContext, *, state: str, regressed: bool,
                   utilisation: pd.DataFrame, stages: list[StageInfo], workers: int,
                   threads: int, env: dict[str, Any], warnings: list[str],
                   baseline: dict[str, Any] | None = None,
                   ended: datetime | None = None, judged: bool = True,
                   unjudged_reason: str | None = None) -> dict[str, Any]:
    """The manifest document (``files`` is added by the store)."""
    ended = ended or datetime.now(UTC)
    util = {"run": None, "stages": {}}
    for scope, row in utilisation.iterrows():
        value = row["utilisation"]
        if scope == "run":
            util["run"] = value
        else:
            util["stages"][scope] = value
    return json_clean({
        "schema_version": SCHEMA_VERSION,
        "run_id": ctx.run_id, "pipeline": ctx.pipeline, "version": ctx.version,
        "source_hash": ctx.source_hash, "flow_run_id": ctx.flow_run_id,
        "flow_run_name": ctx.flow_run_name, "deployment": ctx.deployment,
        "state": state, "status": status_for(state, regressed, judged), "regressed": regressed,
        "unjudged_reason": None if judged else unjudged_reason,
        "baseline": baseline or {"runs": [], "version": ctx.version, "note": "no check ran"},
        "started": ctx.started.isoformat(), "ended": ended.isoformat(),
        "wall_s": (ended - ctx.started).total_seconds(),
        "workers": workers, "threads": threads, "utilisation": util,
        "stages": [s.__dict__ for s in stages],
        "environment": env, "warnings": warnings,
    })
