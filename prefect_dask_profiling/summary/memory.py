"""Memory per stage: one row per stage from a record's per-(stage, worker) memory table.

The scheduler plugin folds each worker's memory samples into the stages that were running
(:class:`~prefect_dask_profiling.summary.record.RunRecord` ``memory``, ``spill``); this module
reduces them to what a stage is judged and shown by: its peak process memory over the
workers, the level it started from and what it added above it (what the stage is judged
on: a stage must not inherit the memory of the stage before it), its headroom (the tightest
worker), the bytes it spilled to disk and read back, and
its largest single task result. It also words the worker-death incidents, once, for every
place that shows them (artifact, ``show``, explanations).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import pandas as pd

from prefect_dask_profiling.summary.record import RunRecord

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import Incident

__all__ = ["MEMORY_SHOW_COLUMNS", "STAGE_MEMORY_COLUMNS", "StageMemory", "describe_incident",
           "format_bytes", "memory_cells", "memory_table", "stage_memory", "stage_memory_info"]

STAGE_MEMORY_COLUMNS = ["stage", "workers", "memory_limit", "peak_bytes", "start_bytes",
                        "added_bytes", "result_bytes", "headroom", "peak_spilled_bytes",
                        "spilled_bytes", "read_back_bytes", "largest_result_bytes",
                        "largest_result_prefix"]


class StageMemory(TypedDict):
    """One stage's memory as the manifest keeps it (``StageInfo.memory``).

    ``peak_bytes``: the largest process memory of any worker while the stage ran (what
    near-OOM headroom is about); ``start_bytes``: the largest process memory a worker had
    when the stage started (carried in from before it: earlier stages' results not yet
    released, unmanaged memory not yet returned to the OS); ``added_bytes``: the most one
    worker's process memory (or its managed bytes) rose above its level at the stage's
    start — what the stage itself added, the figure its memory regression is judged on
    (:func:`~prefect_dask_profiling.regression.memory.history_from_manifests`);
    ``result_bytes``: the sizes of the stage's task results, summed (what its tasks hand
    to Dask to hold); ``memory_limit``: the smallest worker memory limit (0 when unknown);
    ``headroom``: min over workers of ``(limit - peak process) / limit`` (``None`` without a limit);
    ``spilled_bytes`` / ``read_back_bytes``: bytes Dask wrote to / read back from disk
    while the stage ran, all workers; ``peak_spilled_bytes``: the most bytes one worker held
    on disk; ``largest_result_bytes``: the largest task result of the stage (and its prefix).
    """

    workers: int
    memory_limit: int
    peak_bytes: int
    start_bytes: int
    added_bytes: int
    result_bytes: int
    headroom: float | None
    peak_spilled_bytes: int
    spilled_bytes: int
    read_back_bytes: int
    largest_result_bytes: int
    largest_result_prefix: str | None


def stage_memory(record: RunRecord) -> pd.DataFrame:
    """One row per stage that has memory samples or task results (``STAGE_MEMORY_COLUMNS``).

    Returns
    -------
    A DataFrame sorted by stage; ``headroom`` is NaN where no worker limit is known.
    """
    rows = []
    memory = record.memory
    stages = list(dict.fromkeys([*record.stages, *memory["stage"].astype(str)]))
    for stage in stages:
        m = record.stage_rows("memory", stage)
        limits = m["memory_limit"][m["memory_limit"] > 0]
        spill = record.spill.get(stage, {})
        tasks = record.stage_rows("tasks", stage)
        largest, prefix = _largest_result(tasks)
        results = (int(pd.to_numeric(tasks["nbytes"], errors="coerce").fillna(0).sum())
                   if "nbytes" in tasks.columns else 0)
        start, added = _start_and_added(m, results)
        rows.append({
            "stage": stage, "workers": int(m["worker"].nunique()),
            "memory_limit": int(limits.min()) if not limits.empty else 0,
            "peak_bytes": int(m["peak_process"].max()) if not m.empty else 0,
            "start_bytes": start, "added_bytes": added, "result_bytes": results,
            "headroom": float(m["headroom"].min()) if m["headroom"].notna().any()
            else float("nan"),
            "peak_spilled_bytes": int(m["peak_spilled"].max()) if not m.empty else 0,
            "spilled_bytes": int(spill.get("disk_write_bytes", 0)),
            "read_back_bytes": int(spill.get("disk_read_bytes", 0)),
            "largest_result_bytes": largest, "largest_result_prefix": prefix})
    return pd.DataFrame(rows, columns=STAGE_MEMORY_COLUMNS)


def stage_memory_info(record: RunRecord) -> dict[str, StageMemory]:
    """:func:`stage_memory` by stage, as the plain dicts the manifest stores."""
    out: dict[str, StageMemory] = {}
    for row in stage_memory(record).to_dict("records"):
        stage = row.pop("stage")
        headroom = row["headroom"]
        row["headroom"] = None if headroom != headroom else round(float(headroom), 4)
        out[str(stage)] = StageMemory(**row)  # type: ignore[typeddict-item]
    return out


def _start_and_added(m: pd.DataFrame, result_bytes: int) -> tuple[int, int]:
    """The stage's start level and what it added, over its (stage, worker) memory rows.

    Per worker: the process memory's rise above its level at the stage's start (the peak of
    the process readings that reached the scheduler while the stage ran: a heartbeat from
    before the stage, sampled late, is part of the start level), less the
    managed bytes that rose meanwhile but are not the stage's own (the managed rise beyond
    ``result_bytes``, the sizes of the stage's task results: the last results of the stage
    before, landing between the start sample and this stage's first one); and at least the
    managed rise that can be the stage's own results (the process may reuse memory an
    earlier stage freed without returning it to the OS). The stage keeps the largest of
    each over its workers. Rows of runs recorded before the start level existed
    (``start_process = 0``) give their process peak, as before.
    """
    if m.empty:
        return 0, 0

    def column(name: str) -> pd.Series:
        if name not in m.columns:
            return pd.Series(0, index=m.index, dtype="int64")
        return pd.to_numeric(m[name], errors="coerce").fillna(0)

    start, peak = column("start_process"), column("own_peak_process")
    managed_rise = (column("peak_managed") - column("start_managed")).clip(lower=0)
    own = managed_rise.clip(upper=max(int(result_bytes), 0))
    added = pd.concat([peak - start - (managed_rise - own), own], axis=1).max(axis=1)
    # no start level recorded (older runs): the process peak
    added = added.where(start > 0, column("peak_process"))
    return int(start.max()), int(added.clip(lower=0).max())


def _largest_result(tasks: pd.DataFrame) -> tuple[int, str | None]:
    """The largest single result among one stage's tasks and its prefix."""
    if "max_nbytes" not in tasks.columns:
        return 0, None
    t = tasks.dropna(subset=["max_nbytes"])
    if t.empty or t["max_nbytes"].max() <= 0:
        return 0, None
    row = t.loc[t["max_nbytes"].idxmax()]
    return int(row["max_nbytes"]), str(row["prefix"])


def format_bytes(value: Any) -> str:
    """``value`` bytes in binary units (``3.1 GiB``); ``n/a`` when unknown."""
    if value is None or value != value:
        return "n/a"
    n = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def describe_incident(incident: Incident) -> str:
    """One line for an incident: kind, worker, stage, prefixes, keys and the evidence."""
    keys = incident.get("keys") or []
    more = int(incident.get("n_keys") or len(keys)) - len(keys)
    shown = ", ".join(f"`{k}`" for k in keys[:5])
    if more > 0 or len(keys) > 5:
        shown += f" (+{more + max(len(keys) - 5, 0)} more)"
    limit = incident.get("memory_limit")
    last = incident.get("last_process")
    memory = (f"last sample {format_bytes(last)} of {format_bytes(limit)}"
              if limit else f"last sample {format_bytes(last)}, no limit known")
    return (f"{incident.get('kind', 'worker lost')}: worker {incident.get('worker')} in stage "
            f"{', '.join(incident.get('stages') or ['?'])} (prefixes "
            f"{', '.join(incident.get('prefixes') or ['?'])}; keys {shown}); {memory}; "
            f"{incident.get('reason') or ''}".rstrip("; "))


MEMORY_SHOW_COLUMNS = ["stage", "peak_gib", "limit_gib", "headroom", "spilled_gib",
                       "read_back_gib", "largest_result_mib", "largest_result_prefix"]


def memory_table(stages: Sequence[Mapping[str, object]]) -> pd.DataFrame:
    """The stored stages' memory (``manifest["stages"][i]["memory"]``) for a terminal table.

    One row per stage that has a memory entry (``MEMORY_SHOW_COLUMNS``, sizes in GiB/MiB);
    runs stored before memory was recorded give an empty table. ``stages`` are the
    manifest's stage entries (each a :class:`~prefect_dask_profiling.store.manifest.StageInfo`
    as plain data), read defensively: this layer cannot name the store's type.
    """
    rows = []
    for s in stages or []:
        m = s.get("memory") if isinstance(s, dict) else None
        if not isinstance(m, dict):
            continue
        headroom = m.get("headroom")
        rows.append({
            "stage": str(s.get("name")),
            "peak_gib": (m.get("peak_bytes") or 0) / 2**30,
            "limit_gib": (m.get("memory_limit") or 0) / 2**30,
            "headroom": float(headroom) if headroom is not None else float("nan"),
            "spilled_gib": (m.get("spilled_bytes") or 0) / 2**30,
            "read_back_gib": (m.get("read_back_bytes") or 0) / 2**30,
            "largest_result_mib": (m.get("largest_result_bytes") or 0) / 2**20,
            "largest_result_prefix": m.get("largest_result_prefix") or ""})
    return pd.DataFrame(rows, columns=MEMORY_SHOW_COLUMNS)


def memory_cells(memory: Any) -> tuple[str, str, str]:
    """A stored stage's memory as (peak of limit, headroom, spilled) text; blanks if none."""
    if not isinstance(memory, dict) or not memory.get("workers"):
        return "", "", ""
    headroom = memory.get("headroom")
    limit = memory.get("memory_limit")
    peak = format_bytes(memory.get("peak_bytes"))
    return (f"{peak} of {format_bytes(limit)}" if limit else peak,
            f"{headroom:.0%}" if isinstance(headroom, (int, float)) else "n/a",
            format_bytes(memory.get("spilled_bytes") or 0))
