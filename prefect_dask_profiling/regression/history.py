"""The baseline of a run: the last few healthy runs of the same pipeline and version.

One listing of ``index/<pipeline>/<version>/`` (and of ``accepted/``) finds the candidates;
only the tables of the runs actually used are read, newest first, so loading a baseline costs
the same with ten stored runs as with ten thousand.

Rules:

* same pipeline and version — prefixes change with the code, so other versions never count;
* complete runs only (index markers are written after the manifest) whose status is
  ``healthy``: regressed and failed runs would drag the median towards the regression;
* an accepted run (``dask-profiling accept RUN``) restarts the baseline: only it and newer
  runs count, and it counts even though it was flagged regressed;
* a run whose table is missing or unreadable is skipped with a warning, never a crash.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, StoreError

logger = logging.getLogger(__name__)

HISTORY_COLUMNS = ["run_id", *TASKS_COLUMNS]


@dataclass
class Baseline:
    """The runs a new run is compared against.

    Attributes
    ----------
    history
        Long table: ``run_id`` plus the ``tasks.csv`` columns of every run used.
    runs
        The run ids used, oldest to newest.
    version
        The pipeline version the baseline belongs to.
    note
        Human-readable remarks (new version, restart at an accepted run, runs left out...).
    skipped
        ``(run_id, reason)`` of the runs skipped because their table could not be read.
    """

    history: pd.DataFrame
    runs: list[str]
    version: str
    note: str = ""
    skipped: list[tuple[str, str]] = field(default_factory=list)


def load_baseline(store: RunStore, pipeline: str, version: str, n: int = 8,
                  exclude_run_id: str | None = None, before: str | None = None) -> Baseline:
    """The last ``n`` healthy runs of ``pipeline``/``version``, as a :class:`Baseline`.

    Parameters
    ----------
    store
        Where the runs are.
    pipeline, version
        Whose runs.
    n
        How many runs at most.
    exclude_run_id
        A run never to include (the run being judged).
    before
        Only runs older than this run id count (to judge an older run against its own past).

    Notes
    -----
    Storage errors while listing give an empty baseline with a note (a run is never failed
    because its history could not be read); unreadable runs are skipped with a warning.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number >= 1, got {n!r}")
    try:
        entries = store.list_runs(pipeline, version)
        restart = _restart(store.accepted(pipeline, version), before)
    except StoreError as exc:
        logger.warning("no baseline for %s %s: %s", pipeline, version, exc)
        return Baseline(_empty(), [], version, f"no baseline: {exc}")
    entries = [e for e in entries if e["run_id"] != exclude_run_id
               and (before is None or e["run_id"] < before)
               and (restart is None or e["run_id"] >= restart)]
    frames, skipped, left_out = _read_newest(store, pipeline, entries, restart, n)
    runs = [run_id for run_id, _ in reversed(frames)]
    history = pd.concat([f.assign(run_id=r) for r, f in reversed(frames)], ignore_index=True) \
        if frames else _empty()
    history = history[[*HISTORY_COLUMNS, *[c for c in history if c not in HISTORY_COLUMNS]]]
    notes = _notes(store, pipeline, version, entries, restart, runs, n, left_out, skipped)
    return Baseline(history, runs, version, "; ".join(notes), skipped)


def _restart(accepted: list[str], before: str | None) -> str | None:
    """The newest accepted run id (up to ``before``), where the baseline restarts.

    An accepted run judged itself has an empty baseline: it is the new normal.
    """
    candidates = [a for a in accepted if before is None or a <= before]
    return max(candidates) if candidates else None


def _read_newest(store: RunStore, pipeline: str, entries: list[dict], restart: str | None,
                 n: int) -> tuple[list[tuple[str, pd.DataFrame]], list[tuple[str, str]],
                                  Counter]:
    """Tables of the newest usable runs (newest first), the skipped runs, statuses left out."""
    frames: list[tuple[str, pd.DataFrame]] = []
    skipped: list[tuple[str, str]] = []
    left_out: Counter = Counter()
    for entry in sorted(entries, key=lambda e: e["run_id"], reverse=True):
        if len(frames) == n:
            break
        run_id, status = entry["run_id"], entry["status"]
        if not (status == "healthy" or (run_id == restart and status == "regressed")):
            left_out[status] += 1
            continue
        try:
            frames.append((run_id, store.read_table(pipeline, run_id, "tasks")))
        except StoreError as exc:
            logger.warning("baseline of %s: skipping run %s: %s", pipeline, run_id, exc)
            skipped.append((run_id, str(exc)))
    return frames, skipped, left_out


def _notes(store: RunStore, pipeline: str, version: str, entries: list[dict],
           restart: str | None, runs: list[str], n: int, left_out: Counter,
           skipped: list[tuple[str, str]]) -> list[str]:
    notes = []
    if not entries and restart is None:
        notes.append(_new_version_note(store, pipeline, version))
    if restart is not None:
        notes.append(f"baseline restarts at accepted run {restart}")
    if entries and len(runs) < n:
        notes.append(f"{len(runs)} of {n} baseline runs available")
    if left_out:
        parts = ", ".join(f"{count} {status}" for status, count in sorted(left_out.items()))
        notes.append(f"left out {parts} run(s)")
    if skipped:
        notes.append(f"skipped {len(skipped)} unreadable run(s): "
                     + ", ".join(run_id for run_id, _ in skipped))
    return notes


def _new_version_note(store: RunStore, pipeline: str, version: str) -> str:
    """Says the version starts a new baseline and how much history the previous one had."""
    try:
        others = [e for e in store.list_runs(pipeline) if e["version"] != version]
    except StoreError:
        others = []
    if not others:
        return f"no earlier runs of pipeline {pipeline}: a new baseline starts"
    previous = max(others, key=lambda e: e["run_id"])["version"]
    count = sum(e["version"] == previous for e in others)
    return (f"version {version} has no history yet: a new baseline starts (previous version "
            f"{previous} had {count} runs)")


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object if c in ("run_id", "stage", "prefix")
                                      else float) for c in HISTORY_COLUMNS})


# ---------------------------------------------------------------------- CLI bodies
SHOW_COLUMNS = ["stage", "prefix", "tasks", "total_s", "p50_s", "p95_s", "gb_out", "share"]
CHECK_COLUMNS = ["stage", "prefix", "verdict", "cause", "baseline_s", "latest_s", "ratio",
                 "robust_z", "tasks_ratio", "share"]  # the human table; --json has them all
MANIFEST_SUMMARY = ["run_id", "pipeline", "version", "status", "state", "regressed",
                    "started", "ended", "wall_s", "workers", "threads", "flow_run_name",
                    "source_hash"]


def open_store(url: str | None) -> RunStore:
    """A store that exists (``StoreError`` naming it otherwise)."""
    store = RunStore(url)
    try:
        found = store.fs.exists(store.root)
    except Exception as exc:
        raise StoreError(f"could not reach store {store.url}: {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
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


def list_runs(store: RunStore, pipeline: str, version: str | None = None) -> pd.DataFrame:
    """``run_id, version, status`` of the stored runs, newest first."""
    runs = store.list_runs(pipeline, version)
    if version is not None and not runs:
        raise StoreError(f"no runs of pipeline {pipeline!r} version {version!r} in {store.url}")
    return pd.DataFrame(runs, columns=["run_id", "version", "status"])


def show_run(store: RunStore, pipeline: str, run_id: str) -> tuple[dict, pd.DataFrame]:
    """The manifest's summary fields and the run's per-prefix table."""
    manifest = store.read_manifest(pipeline, run_id)
    tasks = store.read_table(pipeline, run_id, "tasks")
    summary = {k: manifest.get(k) for k in MANIFEST_SUMMARY}
    summary["utilisation"] = (manifest.get("utilisation") or {}).get("run")
    summary["baseline"] = manifest.get("baseline")
    summary["stages"] = [s.get("name") for s in manifest.get("stages") or []
                         if isinstance(s, dict)]
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
    """The verdict of one stored run against its baseline."""

    run_id: str
    pipeline: str
    version: str
    baseline: Baseline
    verdicts: pd.DataFrame

    @property
    def regressed(self) -> bool:
        return bool((self.verdicts["verdict"] == "regression").any())

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "pipeline": self.pipeline, "version": self.version,
                "regressed": self.regressed,
                "baseline": {"runs": self.baseline.runs, "note": self.baseline.note,
                             "skipped": [list(s) for s in self.baseline.skipped]},
                "verdicts": self.verdicts.to_dict(orient="records")}


def check_run(store: RunStore, pipeline: str, run_id: str | None = None,
              version: str | None = None, n: int = 8, **options) -> Check:
    """Judge ``run_id`` (default: the newest run, of ``version`` if given) against its baseline.

    ``options`` go to :func:`~prefect_dask_profiling.regression.verdict.detect_regressions`.
    """
    from prefect_dask_profiling.regression.verdict import detect_regressions

    if run_id is None:
        runs = store.list_runs(pipeline, version)
        if not runs:
            what = f"pipeline {pipeline!r}" + (f" version {version!r}" if version else "")
            raise StoreError(f"no runs of {what} in {store.url}")
        run_id = runs[0]["run_id"]
    run_version = store.read_manifest(pipeline, run_id)["version"]
    if version is not None and version != run_version:
        raise StoreError(f"run {run_id} is version {run_version!r}, not {version!r}")
    latest = store.read_table(pipeline, run_id, "tasks")
    baseline = load_baseline(store, pipeline, run_version, n=n, exclude_run_id=run_id,
                             before=run_id)
    verdicts = detect_regressions(baseline.history, latest, **options)
    return Check(run_id, pipeline, run_version, baseline, verdicts)


def accept_run(store: RunStore, pipeline: str, run_id: str) -> str:
    """Mark ``run_id`` as where its version's baseline restarts; returns the version."""
    version = store.read_manifest(pipeline, run_id)["version"]
    store.accept(pipeline, version, run_id)
    return version
