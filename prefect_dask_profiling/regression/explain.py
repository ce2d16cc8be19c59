"""Regressions that explain themselves: what changed in a stage's bottleneck and in the run's
context, between the baseline runs and tonight (pure: manifests in, explanation out).

:func:`explain_stage` compares the stage's stored diagnosis (``stages[i]["diagnosis"]``,
written by the per-stage diagnosis step) with the baseline runs' diagnoses of the same
stage, and ranks context differences read from the manifests: code (version, source hash),
data (tasks in the stage), resources (workers, threads), software (Python, packages,
version mismatches between client, scheduler and workers). Manifests written before
diagnoses existed simply give no bottleneck comparison.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict, cast

from prefect_dask_profiling.environment import Environment, RasterStack, mismatch_key
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.store.manifest import Manifest

if TYPE_CHECKING:
    from prefect_dask_profiling.summary.memory import StageMemory

MISMATCH_KEYS = {"mismatches", "mismatch_detail"}
"""Environment keys compared as version mismatches, not as client versions."""
KEY_SIGNALS = ("monitor.cpu_per_busy_thread", "fine.cpu_fraction", "tasks.busy_fraction",
               "tasks.task_skew", "memory.spilled_peak_mb", "tasks.transfer_share")
"""Signals quoted when a bottleneck changes, in this order of preference."""
SOFTWARE_WEIGHT = {"dask": 3.0, "distributed": 3.0, "numpy": 2.5, "pandas": 2.5,
                   "python": 3.0}
"""Rank of a version change by package (others 1.5)."""
RASTER_WEIGHT = {"gdal": 5.5, "libcurl": 5.0, "rasterio": 4.0}
"""Rank of a change of the workers' raster stack (``environment.raster``)."""
REQUEST_OPTION_WEIGHT = 6.0
"""Rank of a changed GDAL option that shapes storage requests (others 3.0)."""


class ContextChange(TypedDict):
    """One difference between tonight's run context and the baseline's usual one: ``what``
    changed, from ``was`` to ``now`` (JSON scalars), ranked by ``weight`` (higher: more
    likely the cause)."""

    what: str
    was: Any
    now: Any
    weight: float


class BottleneckChange(TypedDict):
    """The stage's bottleneck class in the baseline (the most common of ``was_runs``
    diagnosed runs) and tonight, whether it ``changed``, in words."""

    was: str
    now: str
    changed: bool
    was_runs: int
    text: str


class Explanation(TypedDict):
    """Why a stage may have regressed (:func:`explain_stage`; the manifest's
    ``explanations[stage]``): its bottleneck change (``None`` without diagnoses), the
    context changes ranked, what memory did differently (``""``: nothing) and all in words."""

    stage: str
    bottleneck: BottleneckChange | None
    context: list[ContextChange]
    memory: str
    text: str


Usual = Callable[[list[Any]], Any]
"""The most common non-``None`` value of a list (``None`` when there is none)."""


def explain_stage(stage: str, manifest: Manifest, baselines: list[Manifest],
                  ratio: float | None = None) -> Explanation:
    """Why ``stage`` of the run in ``manifest`` may have regressed against ``baselines``.

    Parameters
    ----------
    stage
        The stage name.
    manifest
        Tonight's manifest.
    baselines
        Manifests of the baseline runs (any order; unreadable entries are skipped).
    ratio
        How many times slower the stage is (for the text), if known.

    Returns
    -------
    The :class:`Explanation`, with ``context`` ranked most likely cause first.

    Raises
    ------
    ValueError
        When ``manifest`` is not a dict or ``stage`` is empty.
    """
    if not isinstance(manifest, dict):
        raise InvalidInput(f"manifest must be a dict, got {type(manifest).__name__}")
    if not stage:
        raise InvalidInput("stage must be a non-empty name")
    base = [b for b in baselines or [] if isinstance(b, dict)]
    bottleneck = _bottleneck_change(stage, manifest, base, ratio)
    context = context_changes(stage, manifest, base)
    parts = []
    if bottleneck is not None:
        parts.append(bottleneck["text"])
    memory = memory_change(stage, manifest, base)
    if memory:
        slower = f"{stage} {ratio:.1f}× slower" if ratio else stage
        parts.append(f"{slower}: {memory}" if bottleneck is None else memory)
    if context:
        parts.append("changed since the baseline: " + "; ".join(
            f"{c['what']} {c['was']} → {c['now']}" for c in context[:4]))
    elif base:
        parts.append("nothing recorded in the run context changed since the baseline "
                     "(memory limits and cluster type are not recorded)")
    return {"stage": stage, "bottleneck": bottleneck, "context": context, "memory": memory,
            "text": ". ".join(parts) if parts else "no baseline runs to compare with"}


def context_changes(stage: str, manifest: Manifest,
                    baselines: list[Manifest]) -> list[ContextChange]:
    """Differences between tonight's context and the baseline's usual one, ranked."""
    if not baselines:
        return []
    out: list[ContextChange] = []

    def usual(values: list[Any]) -> Any:
        values = [v for v in values if v is not None]
        return Counter(map(_hashable, values)).most_common(1)[0][0] if values else None

    for key, what, weight in (("version", "flow version", 5.0),
                              ("source_hash", "flow source hash", 5.0)):
        was, now = usual([b.get(key) for b in baselines]), manifest.get(key)
        if now is not None and was is not None and was != now:
            out.append({"what": what, "was": was, "now": now, "weight": weight})
    was_tasks = _median([_stage(b, stage).get("tasks") for b in baselines])
    now_tasks = _stage(manifest, stage).get("tasks")
    if was_tasks and now_tasks:
        r = now_tasks / was_tasks
        if abs(math.log(r)) >= math.log(1.2):
            out.append({"what": f"tasks in stage {stage}", "was": round(was_tasks),
                        "now": now_tasks, "weight": 4.0 + min(abs(math.log2(r)), 3.0)})
    for key, what in (("workers", "workers"), ("threads", "threads")):
        was, now = usual([b.get(key) for b in baselines]), manifest.get(key)
        if was and now and was != now:
            out.append({"what": what, "was": was, "now": now,
                        "weight": 4.5 if now < was else 2.0})
    env_now = manifest.get("environment") or cast(Environment, {})
    out.extend(raster_changes(env_now.get("raster"), [
        env.get("raster") for b in baselines if (env := b.get("environment"))], usual))
    for key in sorted(set(env_now) - MISMATCH_KEYS - {"raster"}):
        was = usual([cast(dict, b.get("environment") or {}).get(key) for b in baselines])
        now = cast(dict, env_now).get(key)
        if was is not None and now is not None and was != now:
            out.append({"what": f"{key} (client)", "was": was, "now": now,
                        "weight": SOFTWARE_WEIGHT.get(key, 1.5)})
    out.extend(_new_mismatches(env_now, baselines))
    return sorted(out, key=lambda c: -c["weight"])


def _new_mismatches(env_now: Environment,
                    baselines: list[Manifest]) -> list[ContextChange]:
    """Version mismatches tonight that no baseline run had, compared by
    :func:`~prefect_dask_profiling.environment.mismatch_key` (roles, not worker addresses,
    which change every run); ``was`` is the baseline's mismatch of the same package, if any."""
    def keys(env: Environment | None) -> set[str]:
        return {mismatch_key(str(m)) for m in (env.get("mismatches") if env else None) or []}

    was_all = set().union(*(keys(b.get("environment")) for b in baselines))
    was_by_package = {m.partition(": ")[0]: m for m in sorted(was_all)}
    return [{"what": "version mismatch client/scheduler/workers",
             "was": was_by_package.get(m.partition(": ")[0], "none"), "now": m,
             "weight": 3.5}
            for m in sorted(keys(env_now) - was_all)]


def raster_changes(now: RasterStack | None, baselines: list[RasterStack | None],
                   usual: Usual) -> list[ContextChange]:
    """Changes of the workers' GDAL, rasterio, libcurl and GDAL options (``environment.raster``).

    Options that shape storage requests (range merging, multi-range strategy, directory
    listing on open, ...) rank above everything else recorded: they are the usual cause of
    a read stage's request blow-up.
    """
    if not isinstance(now, dict):
        return []
    base = [b for b in baselines if isinstance(b, dict)]
    if not base:
        return []
    from prefect_dask_profiling.timing.worker_io import (
        REQUEST_OPTION_DEFAULTS,
        UNCOMPARED_OPTIONS,
    )

    out: list[ContextChange] = []
    for key, weight in RASTER_WEIGHT.items():
        was, cur = usual([cast(dict, b).get(key) for b in base]), cast(dict, now).get(key)
        if was is not None and cur is not None and was != cur:
            out.append({"what": f"{key} (workers)", "was": was, "now": cur, "weight": weight})
    options = now.get("options") or {}
    names = set(options) | {n for b in base for n in (b.get("options") or {})}
    for name in sorted(names - UNCOMPARED_OPTIONS):
        was = usual([(b.get("options") or {}).get(name) for b in base])
        cur = options.get(name)
        if was != cur:
            weight = REQUEST_OPTION_WEIGHT if name in REQUEST_OPTION_DEFAULTS else 3.0
            out.append({"what": name, "was": "unset" if was is None else was,
                        "now": "unset" if cur is None else cur, "weight": weight})
    return out


def _bottleneck_change(stage: str, manifest: Manifest, baselines: list[Manifest],
                       ratio: float | None) -> BottleneckChange | None:
    now = _diagnosis(manifest, stage)
    was_all = [d for d in (_diagnosis(b, stage) for b in baselines) if d]
    if now is None or not was_all:
        return None
    was_primary = Counter(d["primary"] for d in was_all).most_common(1)[0][0]
    was = [d for d in was_all if d["primary"] == was_primary]
    slower = f"{stage} {ratio:.1f}× slower" if ratio else stage
    changed = was_primary != now["primary"]
    signal = _key_signal(now, was)
    now_text = now["primary"] + (f" ({signal[0]} {signal[2]:.2g})" if signal else "")
    was_text = was_primary + (f" ({signal[0]} {signal[1]:.2g})" if signal else "")
    if changed:
        text = f"{slower}: was {was_text}, now {now_text}"
    else:
        text = f"{slower}: still {now_text}; was {was_text} in the baseline"
    return {"was": was_primary, "now": now["primary"], "changed": changed,
            "was_runs": len(was_all), "text": text}


def _key_signal(now: dict[str, Any], was: list[dict[str, Any]]
                ) -> tuple[str, float, float] | None:
    """The first key signal measured both tonight and in the baseline: (name, was, now)."""
    def values(d: dict[str, Any]) -> dict[str, float]:
        return {s["signal"]: float(s["value"]) for s in d.get("signals") or []
                if isinstance(s, dict) and isinstance(s.get("value"), (int, float))}

    tonight = values(now)
    for name in KEY_SIGNALS:
        before = _median([values(d).get(name) for d in was])
        if name in tonight and before is not None:
            return name, before, tonight[name]
    return None


def _diagnosis(manifest: Manifest, stage: str) -> dict[str, Any] | None:
    d = _stage(manifest, stage).get("diagnosis")
    return d if isinstance(d, dict) and d.get("primary") else None


def _stage(manifest: Manifest, stage: str) -> dict[str, Any]:
    """The manifest's entry of ``stage``; an empty one (every read gives ``None``) when the
    run has no such stage."""
    for s in manifest.get("stages") or []:
        if isinstance(s, dict) and s.get("name") == stage:
            return s
    return {}


def _median(values: list[Any]) -> float | None:
    nums = sorted(float(v) for v in values if isinstance(v, (int, float)) and v == v)
    if not nums:
        return None
    mid = len(nums) // 2
    return nums[mid] if len(nums) % 2 else (nums[mid - 1] + nums[mid]) / 2


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) else str(value)


def explain_verdicts(verdicts, manifest: Manifest,
                     baselines: list[Manifest]) -> dict[str, Explanation]:
    """:func:`explain_stage` for every stage with a regressed prefix in ``verdicts``.

    ``verdicts`` is the regression table (``stage, prefix, verdict, baseline_s, latest_s``);
    the stage's slowdown is its regressed prefixes' latest over baseline seconds.
    """
    if verdicts is None or len(verdicts) == 0 or "verdict" not in verdicts:
        return {}
    bad = verdicts[verdicts["verdict"] == "regression"]
    out: dict[str, Explanation] = {}
    for stage, rows in bad.groupby("stage", sort=False):
        base = float(rows["baseline_s"].fillna(0).sum()) if "baseline_s" in rows else 0.0
        late = float(rows["latest_s"].fillna(0).sum()) if "latest_s" in rows else 0.0
        out[str(stage)] = explain_stage(str(stage), manifest, baselines,
                                        ratio=late / base if base > 0 else None)
    return out


# -- memory: spill, peaks and dead workers behind a slower stage ---------------------------

SPILL_QUOTED = 64 * 2**20
"""Bytes a stage must spill tonight before its spill is quoted (a few chunks)."""


def memory_change(stage: str, manifest: Manifest,
                  baselines: list[Manifest]) -> str:
    """What memory did differently in ``stage`` tonight, in words; empty if nothing did.

    Quotes the bytes spilled to disk when the stage spilled at least 64 MiB and twice its
    baseline median ("3.1 GiB spilled, was 0"), a peak at least 1.5x its baseline median,
    and the workers that died while running it (``manifest["incidents"]``).
    """
    from prefect_dask_profiling.summary.memory import format_bytes

    def size(value: float) -> str:
        return "0" if not value else format_bytes(value)

    now = _stage(manifest, stage).get("memory") or cast("StageMemory", {})
    was = [m for m in (_stage(b, stage).get("memory") for b in baselines)
           if isinstance(m, dict)]
    parts = []
    spilled = now.get("spilled_bytes")
    spilled_was = _median([m.get("spilled_bytes") for m in was])
    if isinstance(spilled, (int, float)) and spilled >= SPILL_QUOTED and (
            spilled_was is None or spilled >= 2 * spilled_was):
        parts.append(f"{size(spilled)} spilled" + (
            f", was {size(spilled_was)}" if spilled_was is not None else ""))
    peak, peak_was = now.get("peak_bytes"), _median([m.get("peak_bytes") for m in was])
    if isinstance(peak, (int, float)) and peak_was and peak >= 1.5 * peak_was:
        parts.append(f"peak memory {size(peak)}, was {size(peak_was)}")
    deaths = [i for i in manifest.get("incidents") or []
              if isinstance(i, dict) and stage in (i.get("stages") or [])]
    if deaths:
        kinds = Counter(str(i.get("kind") or "worker lost") for i in deaths)
        parts.append("worker(s) died while it ran: " + ", ".join(
            f"{n} {kind}" for kind, n in kinds.most_common()))
    return "; ".join(parts)
