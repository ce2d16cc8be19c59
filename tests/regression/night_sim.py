"""Generated nights through the real :func:`~prefect_dask_profiling.run.pipeline.finish_run`.

Shared by the stateful simulation (``test_history_simulation.py``), the focused defect tests
(``test_history_defects.py``) and ``benchmarks/alert_quality.py``. Three parts:

* **nights** (:class:`NightSpec`, :func:`night_record`): one real record
  (:func:`run_records.record_stages`, recorded once per session on an in-process
  LocalCluster) made into a night whose per-stage times, memory peak / spill / headroom and
  storage requests per chunk are known in advance: the tasks table is scaled per
  (stage, prefix), the record's ``memory`` table gets one sample row per stage on one worker
  with a 1 GiB limit, ``spill`` the bytes spilled, and ``io`` the GDAL requests of
  :data:`CHUNKS` chunks;
* **the driver** (:class:`Driver`): finishes a night on a real store with explicit simulated
  times (a night starts on day N at 02:00 UTC and ends at 03:00; run ids from
  :func:`~prefect_dask_profiling.store.runs.new_run_id` of the start), acknowledges
  (at a simulated time), accepts, damages and repairs stored files, and reads back what the
  store says (manifest, ``judge_stored``, ``alert_history.episodes_of``);
* **the simulation** (:class:`Simulation`): a seeded generator of mixed nights — calm and
  rough noise, blips, steps, drift, chronic and sudden near-OOM, spill noise, request
  blow-ups, acks, accepts, version bumps, overlapping runs in both orders, failed and
  retried flows, reruns cancelled (0-task rows), damaged tables, manifests and ``carried``
  fields at any position of the window, for a night or for good — that checks the history
  model's invariants (docs/alerts.md, "What the simulation checks") after every night and
  collects violations with the sequence of nights that led to them.

A seeded generator rather than Hypothesis' ``RuleBasedStateMachine``: one night costs
~0.5 s of real store I/O and judging, so the budget buys a few hundred nights per test run;
Hypothesis would spend it on shrinking and on short examples, and its database of failing
examples would replay different nights once the generator changes. Seeds are reported with
every violation; the night log (:attr:`Simulation.log`) is the failing sequence, and the
defect tests hold the minimal ones.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression import alert_history
from prefect_dask_profiling.regression.history import accept_run
from prefect_dask_profiling.regression.judge import judge_stored
from prefect_dask_profiling.run.pipeline import (
    DEFAULT_OPTIONS,
    FinishResult,
    complete_run,
    judge_run,
    store_record,
)
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary import RunRecord

PIPELINE = "sim"
STAGES = ("read", "reduce")
BASELINE_NIGHTS = 8  # the rule's default history
STEP_WATCHED = 2.3  # a step must leave the stage this far above its baseline's level to be
#                     watched (the threshold, 2.0, with the rough regime's noise)
MAIN_PREFIX = "sum"  # the prefix that holds ~85% of a stage's time: the judged one
MIB, GIB = 2**20, 2**30
LIMIT = GIB  # every worker's memory limit
CHUNKS = 50  # chunks read per stage on a night
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
JUDGED = ("healthy", "suspected", "regressed", "acknowledged")
SECONDS = 200.0  # as run_records.SECONDS: the recorded milliseconds made nightly seconds
SMALL_WINDOW = 5  # ``alerts --runs 5``: must derive the state the full window does


# ---------------------------------------------------------------------- nights
@dataclass
class NightSpec:
    """One generated night: what it is, when it ran, what it measured.

    Attributes
    ----------
    day
        The simulated day (0 = :data:`EPOCH`).
    kind
        A label for the log (``calm``, ``step``, ``chronic``...).
    factors
        Time factors by stage or by ``(stage, prefix)`` (both multiply).
    peak
        Peak process memory per stage, as a fraction of :data:`LIMIT` (default 0.5).
    spilled
        Bytes spilled to disk per stage (default 0).
    requests
        GDAL requests per chunk per stage (default 2.0).
    version
        The pipeline version.
    failed
        The flow body raised (``error=`` and ``state="FAILED"``).
    flow_run_id, attempt
        The Prefect flow run and attempt (a retried flow: same flow run, a new run id).
    start, end
        Start and end as offsets from the day's midnight (default 02:00 and 03:00 UTC).
    run_id
        A fixed run id (the same nights on two stores); default from the start time.
    cancelled
        Stages with a ``cancelled`` prefix whose only task run was a rerun (its worker
        left while it ran), then cancelled: a 0-task row with no sketch (issue 56).
    absent
        Stages that did not run tonight (a conditional stage): no tasks, memory or
        requests of theirs are recorded.
    """

    day: int
    kind: str = "calm"
    factors: dict[Any, float] = field(default_factory=dict)
    peak: dict[str, float] = field(default_factory=dict)
    spilled: dict[str, int] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)
    version: str = "1"
    failed: bool = False
    flow_run_id: str | None = None
    attempt: int | None = None
    start: timedelta = timedelta(hours=2)
    end: timedelta = timedelta(hours=3)
    run_id: str | None = None
    cancelled: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()

    @property
    def started(self) -> datetime:
        return EPOCH + timedelta(days=self.day) + self.start

    @property
    def ended(self) -> datetime:
        return EPOCH + timedelta(days=self.day) + self.end

    def with_run_id(self) -> NightSpec:
        """The same night with its run id fixed (from its start time)."""
        return self if self.run_id else dataclasses.replace(self,
                                                            run_id=new_run_id(self.started))


def night_record(base: RunRecord, spec: NightSpec) -> RunRecord:
    """``base`` made into ``spec``'s night: times, memory, spill and storage requests."""
    base = without_stages(base, spec.absent)
    tasks = base.tasks.copy()
    columns = ["compute_s", "p50_s", "p95_s", "max_s"]
    tasks[columns] = tasks[columns].astype(float) * SECONDS
    for key, factor in spec.factors.items():
        if isinstance(key, tuple):
            rows = (tasks["stage"] == key[0]) & (tasks["prefix"] == key[1])
        else:
            rows = tasks["stage"] == key
        tasks.loc[rows, columns] = tasks.loc[rows, columns] * factor
    stages = [s for s in dict.fromkeys(tasks["stage"].astype(str))]
    if spec.cancelled:
        zero = {c: 0 for c in tasks.columns}
        rows = [{**zero, "stage": stage, "prefix": "cancelled", "reruns": 1,
                 "p50_s": None, "p95_s": None} for stage in spec.cancelled]
        tasks = pd.concat([tasks, pd.DataFrame(rows, columns=tasks.columns)],
                          ignore_index=True)
    memory, io, spill = [], [], {}
    for stage in stages:
        peak = int(spec.peak.get(stage, 0.5) * LIMIT)
        spilled = int(spec.spilled.get(stage, 0))
        memory.append({"stage": stage, "worker": "tcp://127.0.0.1:40001", "samples": 20,
                       "memory_limit": LIMIT, "peak_process": peak,
                       "peak_managed": int(peak * 0.8), "peak_unmanaged": int(peak * 0.2),
                       "peak_spilled": spilled, "headroom": (LIMIT - peak) / LIMIT})
        spill[stage] = {"disk_write_bytes": spilled, "disk_read_bytes": spilled}
        requests = round(spec.requests.get(stage, 2.0) * CHUNKS)
        io.append({"stage": stage, "worker": "tcp://127.0.0.1:40001", "chunks": CHUNKS,
                   "decoded_bytes": CHUNKS * 4 * MIB, "gdal_get": requests, "gdal_head": 0,
                   "gdal_list": 0, "gdal_bytes": requests * 256 * 1024})
    return dataclasses.replace(base, tasks=tasks, memory=pd.DataFrame(memory),
                               spill=spill, io=pd.DataFrame(io))


def without_stages(base: RunRecord, stages: Iterable[str]) -> RunRecord:
    """``base`` as if ``stages`` had not run: their rows, sketches and scheduler data gone."""
    gone = set(stages)
    if not gone:
        return base

    def kept(frame: pd.DataFrame) -> pd.DataFrame:
        if "stage" not in frame:
            return frame
        return frame[~frame["stage"].astype(str).isin(gone)].reset_index(drop=True)

    return dataclasses.replace(
        base, tasks=kept(base.tasks), orchestration=kept(base.orchestration),
        transfers=kept(base.transfers),
        sketches={k: v for k, v in base.sketches.items() if k[0] not in gone},
        scheduler={k: v for k, v in base.scheduler.items() if k not in gone})


# ---------------------------------------------------------------------- one stored night
@dataclass
class NightRun:
    """A finished night: its spec, what :func:`finish_run` returned, what was stored."""

    spec: NightSpec
    run_id: str
    result: FinishResult
    manifest: dict[str, Any]

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def judged(self) -> bool:
        return self.status in JUDGED

    @property
    def events(self) -> list[dict[str, Any]]:
        return list((self.manifest.get("outcome") or {}).get("events") or [])

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event", "").endswith("." + kind)]

    @property
    def baseline_runs(self) -> list[str]:
        return list((self.manifest.get("baseline") or {}).get("runs") or [])

    @property
    def failing_episodes(self) -> list[str]:
        return list((self.manifest.get("outcome") or {}).get("episodes") or [])

    def time_flagged(self) -> set[tuple[str, str]]:
        """(stage, prefix) the one-night rule flagged, that an episode's confirmation
        flagged (a second night nearer the suspected ratio than the baseline, its one-night
        verdict ``ok``), or whose drift fails the run."""
        verdicts = self.result.verdicts
        if "verdict" in verdicts:
            alert = verdicts["alert"].astype(str) if "alert" in verdicts else ""
            rows = verdicts[(verdicts["verdict"] == "regression")
                            | pd.Series(alert, index=verdicts.index).isin(
                                ["regression", "suspected"])]
        else:
            rows = verdicts.iloc[0:0]
        flagged = {(str(s), str(p)) for s, p in zip(rows["stage"], rows["prefix"],
                                                    strict=True)}
        for name in (self.manifest.get("drift") or {}).get("failing") or []:
            stage, _, prefix = str(name).partition("/")
            flagged.add((stage, prefix))
        return flagged

    def memory_flagged(self) -> list[str]:
        return list((self.manifest.get("memory") or {}).get("flagged") or [])

    def requests_flagged(self) -> list[str]:
        return list((self.manifest.get("requests") or {}).get("flagged") or [])

    def line(self) -> str:
        """One log line: day, kind, run id, status, flags, events."""
        events = ",".join(f"{e['event'].rsplit('.', 1)[-1]}:{_key(e)}" for e in self.events)
        return (f"day {self.spec.day:3d} {self.spec.kind:<18} {self.run_id} v{self.spec.version}"
                f" {self.status:<9} time={sorted(self.time_flagged())} "
                f"mem={self.memory_flagged()} req={self.requests_flagged()} "
                f"baseline={len(self.baseline_runs)} events=[{events}]")


def skipped_of(run: NightRun) -> list[str]:
    """The nights tonight's history left out as unreadable (the manifest's ``skipped``)."""
    return sorted(str(s.get("run_id")) for s in run.manifest.get("skipped") or [])


def _key(event: dict[str, Any]) -> str:
    ep = event.get("episode") or {}
    return f"{ep.get('stage')}/{ep.get('prefix')}/{ep.get('metric')}"


def episode_key(event: dict[str, Any]) -> tuple[str, str, str]:
    """``(stage, prefix, metric)`` of an event's episode."""
    ep = event.get("episode") or {}
    return str(ep.get("stage")), str(ep.get("prefix")), str(ep.get("metric"))


class Driver:
    """Finishes generated nights on one real store, and reads back what it stored.

    Parameters
    ----------
    store
        The run store (local folder or moto S3).
    base
        The real record every night is made from.
    settings
        How nights are judged (default the pipeline's ``DEFAULT_OPTIONS``: the default rules).
    """

    def __init__(self, store: RunStore, base: RunRecord,
                 settings: ProfilingOptions | None = None, pipeline: str = PIPELINE) -> None:
        self.store = store
        self.base = base
        self.settings = settings or DEFAULT_OPTIONS
        self.pipeline = pipeline

    def run(self, spec: NightSpec) -> NightRun:
        """Finish ``spec``'s night as a profiled flow does: the three seams of
        :func:`~prefect_dask_profiling.run.pipeline.finish_run` (store the record, judge,
        complete). Its views (trend page, fleet rows), which nothing judged reads, are not
        drawn: they were a tenth of a generated night's time."""
        spec = spec.with_run_id()
        ctx = RunContext(run_id=spec.run_id, pipeline=self.pipeline, version=spec.version,
                         flow_run_id=spec.flow_run_id, started=spec.started)
        if spec.attempt is not None and "attempt" in {f.name for f in
                                                      dataclasses.fields(RunContext)}:
            ctx = dataclasses.replace(ctx, attempt=spec.attempt)
        error = RuntimeError("the flow body failed") if spec.failed else None
        end = store_record(self.store, night_record(self.base, spec), ctx, [], self.settings,
                           error=error, state="FAILED" if spec.failed else None,
                           ended=spec.ended)
        judge_run(end)
        result = complete_run(end)
        return NightRun(spec, spec.run_id, result, self.manifest(spec.run_id))

    def manifest(self, run_id: str) -> dict[str, Any]:
        return dict(self.store.read_manifest(self.pipeline, run_id))

    def ack(self, version: str, target: str, at: datetime) -> None:
        """``dask-profiling ack TARGET``, made at the simulated time ``at``."""
        params = inspect.signature(alert_history.acknowledge).parameters
        if "at" in params:
            alert_history.acknowledge(self.store, self.pipeline, version, target, at=at)
            return
        alert_history.acknowledge(self.store, self.pipeline, version, target)
        path = f"{self.store.root}/{alert_history.ack_marker(self.pipeline, version, target)}"
        doc = json.loads(self.store.fs.cat_file(path))
        doc["at"] = at.isoformat()
        self.store.fs.pipe_file(path, json.dumps(doc).encode())

    def accept(self, run_id: str) -> None:
        """``dask-profiling accept RUN``."""
        accept_run(self.store, self.pipeline, run_id)

    def damage(self, run_id: str, name: str) -> Callable[[], None]:
        """Damage a stored file of ``run_id``: ``regression.csv``, ``tasks.csv`` or
        ``manifest.json`` overwritten with bytes that do not match its checksum (a manifest:
        truncated), or ``carried`` (the manifest's field made malformed); returns what
        restores it."""
        stored = "manifest.json" if name == "carried" else name
        path = f"{self.store.root}/{layout.run_file(self.pipeline, run_id, stored)}"
        kept = self.store.fs.cat_file(path)
        if name == "carried":
            doc = json.loads(kept)
            doc["carried"] = {"episodes": "damaged", "ratios": 7}
            self.store.fs.pipe_file(path, json.dumps(doc).encode())
        elif name == "manifest.json":
            self.store.fs.pipe_file(path, kept[:len(kept) // 2])
        else:
            self.store.fs.pipe_file(path, b"\x00garbage: not what was stored\n" + kept[:7])

        def restore() -> None:
            self.store.fs.pipe_file(path, kept)

        return restore

    def judge_again(self, run_id: str):
        """``dask-profiling check --run RUN``'s judgement (:func:`judge_stored`)."""
        return judge_stored(self.store, self.pipeline, run_id)

    def episodes(self, version: str, runs: int = alert_history.LOOKBACK_RUNS):
        """``dask-profiling alerts [--runs N]``' replay (:func:`alert_history.episodes_of`)."""
        return alert_history.episodes_of(self.store, self.pipeline, version, runs=runs)


def copy_local_store(store: RunStore, where: Path) -> RunStore:
    """A second local store holding the same runs (to run one night two ways)."""
    root = Path(store.root)
    if root.is_dir():  # a store nothing was written to yet has no folder
        shutil.copytree(root, where / "store")
    return RunStore(str(where / "store"), spool_dir=where / "spool")


def same_verdict(a: NightRun, b: NightRun) -> list[str]:
    """What differs between two finishes of the same night (empty when they agree)."""
    out = []
    if a.status != b.status:
        out.append(f"status {a.status} vs {b.status}")
    if sorted(a.baseline_runs) != sorted(b.baseline_runs):
        out.append(f"baseline {a.baseline_runs} vs {b.baseline_runs}")
    ids_a = sorted(e.get("id", "") for e in a.events)
    ids_b = sorted(e.get("id", "") for e in b.events)
    if ids_a != ids_b:
        out.append(f"events {[e['event'] for e in a.events]} vs "
                   f"{[e['event'] for e in b.events]}")
    return out


# ---------------------------------------------------------------------- the simulation
@dataclass(frozen=True)
class Regime:
    """Night-to-night noise: per prefix-night ``U(1 - jitter, 1 + jitter)``, and one-night
    ``spike``x spikes on ``spike_share`` of prefix-nights."""

    name: str
    jitter: float
    spike_share: float = 0.0
    spike: float = 1.8


CALM = Regime("calm", 0.20)
ROUGH = Regime("rough", 0.35, 0.05)


@dataclass
class Watch:
    """A step being watched: it must fail a run by its second plain night."""

    stage: str
    factor: float
    first_run: str
    nights: int = 0
    failed: bool = False
    exempt: str = ""


@dataclass
class Simulation:
    """A seeded mix of nights on one store, with the model's invariants checked after each.

    Parameters
    ----------
    driver
        The store and the record.
    seed
        The generator's seed.
    workdir
        A folder for store copies (overlap orders, retries); ``None`` skips those checks
        (S3).
    """

    driver: Driver
    seed: int
    workdir: Path | None = None
    day: int = 0
    version: int = 1
    regime: Regime = CALM
    level: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 1.0))
    drift: dict[str, float] = field(default_factory=dict)
    chronic: set[str] = field(default_factory=set)
    blowup: dict[str, float] = field(default_factory=dict)
    watches: list[Watch] = field(default_factory=list)
    acked: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    episode_keys: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    log: list[NightRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    accepted: str | None = None
    chronic_regressed: int = 0
    open_ids: dict[str, dict[tuple[str, str, str], str]] = field(default_factory=dict)
    calm_streak: int = 0
    damaged: dict[str, str] = field(default_factory=dict)
    # every night ever damaged, for one night or for good (_check_windows)
    ever_damaged: set[str] = field(default_factory=set)
    # issue 56: every id paged (id -> (version, index of its night in the log)) and the
    # ids a cleared or resolved event named (_check_pages)
    pages: dict[str, tuple[str, int]] = field(default_factory=dict)
    closed_named: set[str] = field(default_factory=set)
    # an episode's span in the log, by id: the night an event first carried it, the night
    # a cleared or resolved event first named it, and the night an ack was given before
    # (_check_baseline holds out only an acknowledged episode's own nights)
    seen_at: dict[str, int] = field(default_factory=dict)
    closed_at: dict[str, int] = field(default_factory=dict)
    acked_at: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.regime = CALM if self.rng.random() < 0.5 else ROUGH
        missing = [s for s in STAGES if MAIN_PREFIX not in self.prefixes(s)]
        if missing:  # a step of such a stage could not show in the judged prefix
            pairs = self.driver.base.tasks[["stage", "prefix"]].drop_duplicates()
            raise ValueError(f"the base record has no {MAIN_PREFIX!r} prefix in {missing}: "
                             f"{pairs.values.tolist()}")

    # ------------------------------------------------------------ generating nights
    @property
    def v(self) -> str:
        return str(self.version)

    def spec(self, kind: str, **overrides: Any) -> NightSpec:
        """Tonight's night from the current state (noise, levels, drift, memory...)."""
        rng, regime = self.rng, self.regime
        factors: dict[Any, float] = {}
        for stage in STAGES:
            for prefix in self.prefixes(stage):
                noise = rng.uniform(1 - regime.jitter, 1 + regime.jitter)
                if rng.random() < regime.spike_share:
                    noise *= regime.spike
                factors[(stage, prefix)] = noise
            factors[stage] = self.level[stage] * self.drift.get(stage, 1.0)
        for watch in self.watches:  # a step is its factor times the level, no jitter
            factors[(watch.stage, MAIN_PREFIX)] = 1.0
        peak = {s: (0.93 if s in self.chronic else rng.uniform(0.35, 0.55)) for s in STAGES}
        spilled = {}
        if rng.random() < 0.10:  # spill noise on 10% of nights
            spilled[str(rng.choice(STAGES))] = int(rng.uniform(300, 600) * MIB)
        requests = {s: 2.0 * rng.uniform(0.9, 1.1) * self.blowup.get(s, 1.0) for s in STAGES}
        spec = NightSpec(day=self.day, kind=kind, factors=factors, peak=peak,
                         spilled=spilled, requests=requests, version=self.v)
        return dataclasses.replace(spec, **overrides).with_run_id()

    def prefixes(self, stage: str) -> list[str]:
        tasks = self.driver.base.tasks
        return sorted(set(tasks.loc[tasks["stage"] == stage, "prefix"].astype(str)))

    def run(self, nights: int) -> None:
        """Generate and judge about ``nights`` nights (a few more when a step is pending)."""
        target = self.day + nights
        while self.day < target or self.watches:
            self.one_day()
            if self.day > target + 10:
                break

    def one_day(self) -> None:
        """Pick what happens today, run it, check the invariants."""
        rng = self.rng
        pending = any(w.nights < 2 for w in self.watches)
        actions = self._actions(pending)
        names, weights = zip(*actions, strict=True)
        weights = np.array(weights, float) / sum(weights)
        action = names[int(rng.choice(len(names), p=weights))]
        self.counts[action] = self.counts.get(action, 0) + 1
        getattr(self, f"_do_{action}")()
        self._advance_drift()
        self.day += 1

    def _actions(self, pending: bool) -> list[tuple[str, float]]:
        """What may happen today, with weights; disturbances wait while a step is new."""
        free = [s for s in STAGES if s not in self.drift
                and not any(w.stage == s for w in self.watches)]
        out = [("plain", 10.0)]
        if pending:
            return out
        if self._judged_since_restart() >= 5 and free:
            out += [("step", 1.2), ("blip", 1.0), ("drift", 0.3), ("blowup", 0.4)]
        if self.watches or any(self.level[s] != 1.0 for s in STAGES):
            out += [("revert", 1.5), ("accept", 0.5), ("ack", 0.7)]
        out += self._paging_actions()
        out += [("chronic", 0.4), ("sudden_oom", 0.3), ("failed", 0.4), ("retry", 0.3),
                ("overlap", 0.5), ("damage", 0.6), ("cancelled", 0.5), ("version", 0.1),
                ("regime", 0.1)]
        if self.blowup:
            out.append(("unblow", 1.0))
        return out

    def _judged_since_restart(self) -> int:
        """Judged nights of this version since the accepted run (the baseline's pool)."""
        return sum(n.judged and n.spec.version == self.v
                   and (self.accepted is None or n.run_id >= self.accepted) for n in self.log)

    def _advance_drift(self) -> None:
        for stage, value in list(self.drift.items()):
            self.drift[stage] = value * 1.08
            if self.drift[stage] > 2.6:  # it has drifted far enough: accepted as the new level
                self.level[stage] *= self.drift.pop(stage)
                self.notes.append(f"day {self.day}: drift of {stage} ends")

    # ------------------------------------------------------------ actions
    def _do_plain(self) -> None:
        self.finish(self.spec("rough" if self.regime is ROUGH else "calm"))

    def _do_regime(self) -> None:
        self.regime = ROUGH if self.regime is CALM else CALM
        self._do_plain()

    def _do_step(self) -> None:
        stage = str(self.rng.choice(self._free()))
        factor = float(self.rng.uniform(2.6, 10.0))
        if stage in self.chronic and self.rng.random() < 0.7:
            factor = 10.0  # a 10x read step beside chronic near-OOM
        self.level[stage] *= factor
        night = self.spec(f"step {stage} {factor:.1f}x")
        exempt = "acknowledged before" if any(k[:2] == (stage, MAIN_PREFIX)
                                              for k in self.acked.values()) else ""
        reference = self._baseline_level(stage)
        if not exempt and reference and self.level[stage] < STEP_WATCHED * reference:
            # after a revert the baseline still holds the accepted higher level: the step
            # leaves tonight below it, not a regression against the baseline
            exempt = f"{self.level[stage] / reference:.2f}x the baseline's level"
        self.watches.append(Watch(stage, factor, night.run_id, exempt=exempt))
        self.finish(night)

    def _baseline_level(self, stage: str) -> float | None:
        """The median level of ``stage`` over the nights tonight's time baseline can hold:
        the newest :data:`BASELINE_NIGHTS` judged nights of this version (since the
        accepted run) whose time was not flagged."""
        levels = [float(n.spec.factors.get(stage, 1.0)) for n in reversed(self.log)
                  if n.spec.version == self.v and n.judged
                  and (not n.time_flagged() or n.run_id == self.accepted)
                  and not (self.accepted and n.run_id < self.accepted)][:BASELINE_NIGHTS]
        return float(np.median(levels)) if levels else None

    def _free(self) -> list[str]:
        return [s for s in STAGES if s not in self.drift
                and not any(w.stage == s for w in self.watches)]

    def _do_blip(self) -> None:
        stage = str(self.rng.choice(self._free()))
        spec = self.spec(f"blip {stage}")
        spec.factors[(stage, MAIN_PREFIX)] = spec.factors.get((stage, MAIN_PREFIX), 1.0) * \
            float(self.rng.uniform(2.2, 3.5))
        self.finish(spec)

    def _do_drift(self) -> None:
        self.drift[str(self.rng.choice(self._free()))] = 1.0
        self._do_plain()

    def _do_blowup(self) -> None:
        stage = str(self.rng.choice(STAGES))
        self.blowup[stage] = float(self.rng.choice([3.0, 8.0, 25.0]))
        self.finish(self.spec(f"requests {stage} x{self.blowup[stage]:g}"))

    def _do_unblow(self) -> None:
        self.blowup.clear()
        self._do_plain()

    def _do_revert(self) -> None:
        for stage in STAGES:
            self.level[stage] = 1.0
        self.watches.clear()
        self.finish(self.spec("revert"))

    def _do_accept(self) -> None:
        last = next((n for n in reversed(self.log) if n.judged and n.spec.version == self.v),
                    None)
        if last is None:
            return self._do_plain()
        self.driver.accept(last.run_id)
        self.accepted = last.run_id
        self._end_every_episode(self.log.index(last))
        self.notes.append(f"day {self.day}: accepted {last.run_id} ({last.status})")
        self.watches.clear()
        self.chronic_regressed = 0  # the accepted night ends every episode: a new one
        self.open_ids.pop(self.v, None)  # (a condition still there opens under a new id)
        self._do_plain()

    def _do_ack(self) -> None:
        # ids paged for this version since the accepted run (ack refuses an id whose
        # episode an accept or a version bump ended: it matches nothing)
        open_ids = [i for n in self.log[-3:] for e in n.events
                    if n.spec.version == self.v
                    and (self.accepted is None or n.run_id > self.accepted)
                    and e.get("event", "").endswith(("detected", "suspected"))
                    for i in [str((e.get("episode") or {}).get("id"))]]
        last = self.log[-1] if self.log else None
        if not open_ids or last is None:
            return self._do_plain()
        at = last.spec.ended + timedelta(hours=6)
        if self.rng.random() < 0.5:
            target = str(self.rng.choice(open_ids))
            self.driver.ack(self.v, target, at)
            self.acked[target] = self.episode_keys.get(target, ("", "", ""))
            self.acked_at.setdefault(target, len(self.log))
        else:  # by run id: every episode open at that run
            target = last.run_id
            self.driver.ack(self.v, target, at)
            for ep_id in open_ids:
                self.acked[ep_id] = self.episode_keys.get(ep_id, ("", "", ""))
                self.acked_at.setdefault(ep_id, len(self.log))
        self.notes.append(f"day {self.day}: ack {target}")
        for watch in self.watches:
            watch.exempt = watch.exempt or "acknowledged"
        self._do_plain()

    def _do_chronic(self) -> None:
        if self.chronic:
            self.chronic.clear()
            self.chronic_regressed = 0
        else:
            self.chronic.add(str(self.rng.choice(STAGES)))
            self.chronic_regressed = 0
        self._do_plain()

    def _do_sudden_oom(self) -> None:
        stage = str(self.rng.choice(STAGES))
        spec = self.spec(f"sudden oom {stage}")
        spec.peak[stage] = 0.96
        self.finish(spec)

    def _do_failed(self) -> None:
        self.finish(self.spec("failed flow", failed=True))

    def _do_retry(self) -> None:
        """An infrastructure retry: attempt 1 fails at 02:30, attempt 2 runs 02:31-03:30."""
        flow_run = f"flow-{self.seed}-{self.day}"
        first = self.spec("retry: attempt 1", failed=True, flow_run_id=flow_run, attempt=1,
                          end=timedelta(hours=2, minutes=30))
        second = self.spec("retry: attempt 2", flow_run_id=flow_run, attempt=2,
                           start=timedelta(hours=2, minutes=31),
                           end=timedelta(hours=3, minutes=30))
        alone = self._counterfactual(second)
        self.finish(first)
        run = self.finish(second)
        if alone is not None:
            self._expect(not (diff := same_verdict(run, alone)),
                         f"attempt 2 judged otherwise than without the failed attempt 1: {diff}")

    def _do_overlap(self) -> None:
        """A 02:00-04:00 and B 03:00-03:30: neither judges the other, in either order."""
        a = self.spec("overlap A", end=timedelta(hours=4))
        calm = [s for s in self._free() if self.level[s] == 1.0 and not any(
            k[0] == s for k in self.acked.values())]
        if self.rng.random() < 0.5 and calm and self._judged_since_restart() >= 5:
            stage = str(self.rng.choice(calm))
            a.factors[stage] = a.factors.get(stage, 1.0) * 10.0  # a 10x night in A
            a.kind = f"overlap A 10x {stage}"
        b = self.spec("overlap B", start=timedelta(hours=3),
                      end=timedelta(hours=3, minutes=30))
        b_first = bool(self.rng.random() < 0.5)
        other = None
        if self.workdir is not None:
            where = self.workdir / f"overlap-{self.seed}-{self.day}"
            other = Driver(copy_local_store(self.driver.store, where), self.driver.base,
                           self.driver.settings, self.driver.pipeline)
        order = (b, a) if b_first else (a, b)
        runs = {spec.run_id: self.finish(spec, plain=False) for spec in order}
        if other is not None:
            again = {spec.run_id: other.run(spec) for spec in reversed(order)}
            for run_id, run in runs.items():
                diff = same_verdict(run, again[run_id])
                self._expect(not diff, f"{run.spec.kind} depends on which overlapping run "
                                       f"finished first: {diff}")
            shutil.rmtree(where, ignore_errors=True)
        ra, rb = runs[a.run_id], runs[b.run_id]
        self._expect(b.run_id not in ra.baseline_runs and a.run_id not in rb.baseline_runs,
                     "an overlapping run is in the other's baseline")
        if "10x" in a.kind:
            self._expect(ra.status == "regressed",
                         f"a 10x night overlapping a later run is stored {ra.status}")

    def _do_damage(self, name: str | None = None, for_good: bool | None = None) -> None:
        """Damage a judged night at any position of the replay window (its verdict table,
        tasks table, manifest or ``carried`` field: ``name``, default drawn), for tonight
        only or for good (``for_good``, default drawn): tonight is judged all the same, and
        names the night when it reads it (issue 56)."""
        window = [n for n in self.log if n.judged and n.spec.version == self.v
                  and n.run_id not in self.damaged][-60:]
        if not window:
            return self._do_plain()
        victim = window[int(self.rng.integers(len(window)))]
        name = name or str(self.rng.choice(["regression.csv", "tasks.csv", "manifest.json",
                                            "carried"]))
        for_good = bool(self.rng.random() < 0.5) if for_good is None else for_good
        restore = self.driver.damage(victim.run_id, name)
        self.ever_damaged.add(victim.run_id)
        if for_good:
            self.damaged[victim.run_id] = name
        try:
            run = self.finish(self.spec(f"damaged {name}"), plain=False)
        finally:
            if not for_good:
                restore()
        read = name in ("regression.csv", "manifest.json") and victim.spec.ended <= \
            run.spec.started and (self.accepted is None or victim.run_id >= self.accepted)
        if read and run.judged:
            self._expect(victim.run_id in skipped_of(run),
                         f"{name} of {victim.run_id} damaged, tonight does not name it: "
                         f"{skipped_of(run)}")

    def _do_cancelled(self) -> None:
        """A night where a task's worker left while it ran and the rerun was cancelled: a
        0-task row with empty quantiles in one stage (issue 56, defect 1)."""
        self.finish(self.spec("rerun cancelled",
                              cancelled=(str(self.rng.choice(STAGES)),)))

    def _end_every_episode(self, index: int) -> None:
        """An accept (of the night at ``index``) or a version bump ends every episode
        without an event: a flag on a later night belongs to a new one."""
        for ep_id in self.seen_at.keys() - self.closed_at.keys():
            self.closed_at[ep_id] = index

    def _do_version(self) -> None:
        self._end_every_episode(len(self.log) - 1)
        self.version += 1
        self.level = dict.fromkeys(STAGES, 1.0)
        self.watches.clear()
        self.drift.clear()
        self.blowup.clear()
        self.accepted = None
        self.chronic_regressed = 0  # a new version's episodes are its own
        run = self.finish(self.spec("version bump"))
        old = {n.run_id for n in self.log if n.spec.version != self.v}
        self._expect(not old & set(run.baseline_runs),
                     "a new version's baseline holds runs of the old version")

    # ------------------------------------------------------------ judging and checks
    def _counterfactual(self, spec: NightSpec) -> NightRun | None:
        if self.workdir is None:
            return None
        where = self.workdir / f"alone-{self.seed}-{self.day}"
        other = Driver(copy_local_store(self.driver.store, where), self.driver.base,
                       self.driver.settings, self.driver.pipeline)
        try:
            return other.run(spec)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    def finish(self, spec: NightSpec, plain: bool = True) -> NightRun:
        """Finish one night and check every invariant that tonight can break."""
        run = self.driver.run(spec)
        for event in run.events:
            episode = event.get("episode") or {}
            ep_id = str(episode.get("id"))
            self.episode_keys.setdefault(ep_id, episode_key(event))
            for name in (ep_id, *map(str, episode.get("aliases") or ())):
                self.seen_at.setdefault(name, len(self.log))
                if event.get("event", "").endswith((".cleared", ".resolved")):
                    self.closed_at.setdefault(name, len(self.log))
        self.log.append(run)
        self._check_agreement(run)
        self._check_windows(run)
        self._check_events(run)
        self._check_pages(run)
        if plain and run.judged:
            self._check_baseline(run)
            self._check_steps(run)
            self._check_chronic(run)
        if spec.failed:
            self._expect(run.status == "failed", f"a failed flow stored {run.status}")
        # no stored night keeps the pipeline unjudged: the store never goes down here
        self._expect(run.status != "unjudged",
                     f"tonight is unjudged: {run.manifest.get('unjudged_reason')}")
        return run

    def _expect(self, ok: bool, what: str) -> None:
        if ok:
            return
        night = self.log[-1] if self.log else None
        where = f"seed {self.seed} day {self.day}" + (f" run {night.run_id}" if night else "")
        self.violations.append(f"{where}: {what}")

    def _check_agreement(self, run: NightRun) -> None:
        """Stored manifest, ``check`` (judge_stored) and ``alerts`` (episodes_of) agree with
        what finish_run returned."""
        self._expect(run.manifest.get("status") == run.status,
                     f"stored status {run.manifest.get('status')} != returned {run.status}")
        if not run.judged:
            return
        again = self.driver.judge_again(run.run_id)
        regressed = again.judgement is not None and again.judgement.regressed
        self._expect(again.judgement is not None and regressed == run.result.regressed,
                     f"check --json says regressed={regressed} ({again.error}), the judge "
                     f"said {run.result.regressed}")
        if again.judgement is not None:
            named = sorted(s.run_id for s in getattr(again.judgement, "skipped", ()))
            self._expect(named == sorted(skipped_of(run)),
                         f"check names other unreadable nights {named} than tonight's "
                         f"manifest {skipped_of(run)}")
            ids = sorted(e.id for e in again.judgement.outcome.events)
            self._expect(ids == sorted(e.get("id", "") for e in run.events),
                         "check --json's events differ from the judge's")
        book, events = self.driver.episodes(run.spec.version)
        replayed = sorted(e.id for e in events if e.run_id == run.run_id)
        self._expect(replayed == sorted(e.get("id", "") for e in run.events),
                     f"alerts replays events {replayed} for tonight, the judge emitted "
                     f"{[e.get('event') for e in run.events]}")
        by_id = {e.id: e for e in book.episodes}
        open_keys = {e.key for e in book.open()}
        overlapped = any(n.spec.version == run.spec.version
                         and n.spec.started < run.spec.started < n.spec.ended
                         for n in self.log[:-1])
        for ep_id in run.failing_episodes:
            ep = by_id.get(ep_id)
            # tonight's judge did not see a night still running when it started; the state
            # folds that night too, and where it ended tonight's episode, tonight's flag
            # opened the same key anew
            renewed = overlapped and self.episode_keys.get(ep_id) in open_keys
            self._expect((ep is not None and ep.open) or renewed,
                         f"alerts does not hold the failing episode {ep_id} open")

    def _check_windows(self, run: NightRun) -> None:
        """Every replay window that ends tonight derives the same open episodes (each night
        stores the state its judge started from, and a replay starts from its first
        night's), and an episode open last night and tonight keeps its id."""
        if not run.judged:
            return
        version = run.spec.version
        full, _ = self.driver.episodes(version)
        ids = {e.key: e.id for e in full.open()}
        # a night still running when the small window's first night started is folded too:
        # load_nights reaches back for it (that night's stored state does not hold it)
        small, _ = self.driver.episodes(version, runs=SMALL_WINDOW)
        # an episode's count of nights is what the judges saw: a night damaged after later
        # nights stored their state still counts in those states (a window starts from
        # one), while the full replay leaves it out; one damaged while a night was judged
        # is missing from that night's state and back in the full replay once repaired.
        # The id and the state must agree whatever the damage (docs/alerts.md)
        damaged = {e.key for e in full.open()
                   if any(e.start_run <= r <= run.run_id for r in self.ever_damaged)}
        seen = {e.key: (e.id, e.state, None if e.key in damaged else e.nights)
                for e in small.open()}
        held = {e.key: (e.id, e.state, None if e.key in damaged else e.nights)
                for e in full.open()}
        self._expect(seen == held, f"alerts --runs {SMALL_WINDOW} holds other open "
                                   f"episodes than the full window: {seen} vs {held}")
        previous = self.open_ids.get(version, {})
        # a night that started earlier but landed later (an overlap) folds the key into its
        # own episode, which keeps the id paged before as an alias (alerts.adopt): ack and
        # resolve still find it by that id
        answers = {e.key: e.ids for e in full.open()}
        changed = {key: (previous[key], ids[key]) for key in previous.keys() & ids.keys()
                   if previous[key] not in answers[key]}
        self._expect(not changed, f"open episodes changed their ids overnight: {changed}")
        self.open_ids[version] = ids

    def _check_events(self, run: NightRun) -> None:
        """Acknowledged episodes emit no ``detected`` and fail nothing; every event carries
        its episode id."""
        for event in run.events:
            ep_id = (event.get("episode") or {}).get("id")
            self._expect(bool(ep_id), f"event {event.get('event')} carries no episode id")
            if event.get("event", "").endswith(".detected"):
                self._expect(ep_id not in self.acked,
                             f"acknowledged episode {ep_id} emitted detected")
        for ep_id in run.failing_episodes:
            self._expect(ep_id not in self.acked,
                         f"acknowledged episode {ep_id} failed the run")
        if run.spec.failed:
            self._expect(not run.events, "a failed flow emitted alert events")

    def _previous(self, run: NightRun) -> list[NightRun]:
        """Earlier nights of tonight's version that ended before it started, newest first."""
        return sorted((n for n in self.log[:-1] if n.spec.version == run.spec.version
                       and n.spec.ended <= run.spec.started and n.run_id < run.run_id),
                      key=lambda n: n.run_id, reverse=True)

    def _check_baseline(self, run: NightRun) -> None:
        """Which earlier nights tonight's time baseline must and must not hold."""
        baseline = set(run.baseline_runs)
        earlier = self._previous(run)
        statuses = {n.run_id: n for n in self.log}
        for run_id in baseline:
            night = statuses.get(run_id)
            self._expect(night is not None and night.spec.version == run.spec.version,
                         f"baseline holds {run_id}, not a judged night of this version")
            if night is None:
                continue
            self._expect(night.status != "failed" and night.status != "unjudged",
                         f"baseline holds {run_id}, stored {night.status}")
            if self.accepted and night.spec.version == self.v:
                self._expect(run_id >= self.accepted,
                             f"baseline holds {run_id}, older than accepted {self.accepted}")
            held_by = self._acknowledged_flags(night)
            coarse = {k[:2] for k in self.acked.values() if k[2] == "total_s"}
            if not held_by and night.time_flagged() & coarse:
                self.notes.append(f"day {self.day}: baseline holds {run_id}, flagged at an "
                                  "acknowledged key by another episode")
            self._expect(not held_by or run_id == self.accepted,
                         f"baseline holds {run_id}, flagged for acknowledged episode(s) "
                         f"{held_by}")
        judged = [n for n in earlier if n.judged][:2]
        if not judged:
            return
        newest = judged[0]
        if self._counts_for_time(newest, cleared_by=None):
            self._expect(newest.run_id in baseline,
                         f"the previous night {newest.run_id} ({newest.spec.kind}, "
                         f"{newest.status}, time unflagged) is not in tonight's baseline")
        if len(judged) == 2 and self._counts_for_time(judged[1], cleared_by=newest):
            what = "time unflagged" if not judged[1].time_flagged() else \
                f"its suspicion cleared by {newest.run_id}"
            self._expect(judged[1].run_id in baseline,
                         f"night {judged[1].run_id} ({judged[1].spec.kind}, "
                         f"{judged[1].status}, {what}) is not in tonight's baseline")

    def _acknowledged_flags(self, night: NightRun) -> list[str]:
        """The acknowledged time episodes that flagged ``night``: its key is flagged that
        night and the night lies in the episode's span, from the night that first carried
        its id to the night a cleared or resolved event named it. An ack given after the
        episode closed silenced nothing; a later episode of the same key is another one
        (a blip suspected and cleared there gives its night back)."""
        index = next(i for i, n in enumerate(self.log) if n.run_id == night.run_id)
        flagged = night.time_flagged()
        held = []
        for ep_id, key in self.acked.items():
            start, end = self.seen_at.get(ep_id), self.closed_at.get(ep_id)
            if key[2] != "total_s" or key[:2] not in flagged or start is None:
                continue
            if end is not None and end < self.acked_at.get(ep_id, 0):
                continue
            if start <= index and (end is None or index <= end):
                held.append(f"{ep_id} {key[0]}/{key[1]} days "
                            f"{self.log[start].spec.day}-"
                            f"{'open' if end is None else self.log[end].spec.day}")
        return held

    def _counts_for_time(self, night: NightRun, cleared_by: NightRun | None) -> bool:
        """Whether the model says ``night`` counts in later time baselines."""
        if not night.judged or (self.accepted and night.run_id < self.accepted) \
                or night.run_id in self.damaged:
            return False
        flagged = night.time_flagged()
        if not flagged:
            return True
        if cleared_by is None:
            return False
        suspected = {episode_key(e)[:2] for e in night.events_of("suspected")}
        cleared = {episode_key(e)[:2] for e in cleared_by.events_of("cleared")}
        return flagged <= suspected and flagged <= cleared and not night.failing_episodes

    def _check_steps(self, run: NightRun) -> None:
        """A step >= the threshold fails a run by its second plain night."""
        for watch in list(self.watches):
            watch.nights += 1
            key = f"{watch.stage}/{MAIN_PREFIX}"
            mine = {i for i, k in self.episode_keys.items() if k[:2] == (watch.stage,
                                                                          MAIN_PREFIX)}
            if run.status == "regressed" and (set(run.failing_episodes) & mine
                                              or key in run.result.failure_message):
                watch.failed = True
            if watch.nights >= 2:
                self.watches.remove(watch)
                if not watch.failed and not watch.exempt:
                    self._expect(False, f"a {watch.factor:.1f}x step of {watch.stage} (from "
                                        f"{watch.first_run}) failed no run by its second "
                                        f"night; {self._explain_step(run, watch.stage)}")

    def _explain_step(self, run: NightRun, stage: str) -> str:
        """What tonight's judge saw of ``stage``'s main prefix: its verdict row, and the
        baseline nights with the stage's level on each (for a step that failed nothing)."""
        rows = run.result.verdicts
        mine = rows[(rows["stage"] == stage) & (rows["prefix"] == MAIN_PREFIX)] \
            if not rows.empty else rows
        shown = [c for c in ("verdict", "ratio", "alert", "alert_reason", "share")
                 if c in mine.columns]
        by_run = {n.run_id: n for n in self.log}
        levels = {r: round(float(by_run[r].spec.factors.get(stage, 1.0)), 2)
                  if r in by_run else None for r in run.baseline_runs}
        return (f"tonight's row {mine[shown].to_dict(orient='records')}, level "
                f"{self.level.get(stage)}, baseline levels {levels}")

    def _check_chronic(self, run: NightRun) -> None:
        """A chronic near-OOM stage fails once per episode, not every night."""
        if not self.chronic:
            return
        # the nights failed by the chronic stages' headroom alone: a sudden near-OOM of
        # another stage beside it is a new episode and fails its night
        chronic = {(stage, "", "headroom") for stage in self.chronic}
        failing = {self.episode_keys.get(ep_id) for ep_id in run.failing_episodes}
        if run.status == "regressed" and failing and failing <= chronic:
            self.chronic_regressed += 1
            self._expect(self.chronic_regressed <= 1,
                         f"chronic near-OOM of {sorted(self.chronic)} failed "
                         f"{self.chronic_regressed} nights of one episode")

    def report(self, limit: int = 12) -> str:
        """The violations, the night log tail and the action counts, for an assertion."""
        lines = [f"{len(self.violations)} violation(s), seed {self.seed}, "
                 f"{len(self.log)} nights, actions {self.counts}"]
        lines += self.violations[:limit]
        lines += ["night log (last 30):", *[n.line() for n in self.log[-30:]]]
        lines += ["notes:", *self.notes[-10:]]
        return "\n".join(lines)

    # ------------------------------------------------------------ issue 56: paged ids
    # Overlapping nights that both regress, threshold changes while a suspicion is open,
    # stages absent for several nights; after every night: every id ever paged is
    # acknowledgeable, and is named when its episode is cleared or resolved.
    def _paging_actions(self) -> list[tuple[str, float]]:
        """The actions of this part, with weights (when no step is pending), times
        ``SIM_PAGING_WEIGHT`` (default 1: a run that exercises this part more)."""
        scale = float(os.environ.get("SIM_PAGING_WEIGHT", "1"))
        out = [("absent", 0.4)]
        if self._judged_since_restart() >= 5:
            out += [("overlap_regress", 0.4), ("threshold", 0.4)]
        return [(name, weight * scale) for name, weight in out]

    def _do_overlap_regress(self) -> None:
        """A 02:00-04:00 and B 03:00-03:30 both 10x on one stage: each judge cannot see the
        other and pages its own ids; both must fail, and every id must stay answerable."""
        calm = self._settled()
        if not calm:
            return self._do_plain()
        stage = str(self.rng.choice(calm))
        a = self.spec(f"overlap both 10x {stage}", end=timedelta(hours=4))
        b = self.spec(f"overlap both 10x {stage} B", start=timedelta(hours=3),
                      end=timedelta(hours=3, minutes=30))
        for spec in (a, b):
            spec.factors[stage] = spec.factors.get(stage, 1.0) * 10.0
        order = (b, a) if self.rng.random() < 0.5 else (a, b)
        acked = any(k[0] == stage for k in self.acked.values())
        runs = [self.finish(spec, plain=False) for spec in order]
        for run in runs:
            self._expect(acked or run.status == "regressed",
                         f"{run.spec.kind}: a 10x night of an overlapping pair is stored "
                         f"{run.status}")

    def _do_threshold(self) -> None:
        """A 2.5x night suspected (or failed) under the default threshold, then a 2.5x
        night under threshold 3: tonight's rule confirms, so it must not fail as
        "confirmed: still" a level below its threshold."""
        settled = self._settled()
        if not settled:
            return self._do_plain()
        stage = str(self.rng.choice(settled))
        first = self.spec(f"2.5x {stage}, threshold 2")
        first.factors[(stage, MAIN_PREFIX)] = first.factors.get((stage, MAIN_PREFIX),
                                                                1.0) * 2.5
        self.finish(first, plain=False)
        self.day += 1
        settings = self.driver.settings
        self.driver.settings = dataclasses.replace(settings, threshold=3.0)
        try:
            second = self.spec(f"2.5x {stage}, threshold 3")
            second.factors[(stage, MAIN_PREFIX)] = second.factors.get(
                (stage, MAIN_PREFIX), 1.0) * 2.5
            run = self.finish(second, plain=False)
        finally:
            self.driver.settings = settings
        for watch in self.watches:
            watch.exempt = watch.exempt or "threshold raised"
        rows = run.result.verdicts
        reasons = rows["alert_reason"].astype(str) if "alert_reason" in rows else []
        for reason in reasons:
            level = re.search(r"suspected (\d+(?:\.\d+)?)x", reason)
            self._expect(not (reason.startswith("confirmed: still") and level
                              and float(level.group(1)) < 3.0),
                         f"threshold 3 confirmed a suspicion below it: {reason}")

    def _do_absent(self) -> None:
        """A stage that does not run for 2-4 nights: its open episodes stay open (no
        cleared, no resolved), and keep their ids when it returns."""
        before = self.open_ids.get(self.v, {})
        watched = sorted({k[0] for k in before} & set(STAGES))  # an open episode's stage
        stage = str(self.rng.choice(watched if watched else list(STAGES)))
        for watch in self.watches:
            if watch.stage == stage:
                watch.exempt = watch.exempt or "stage absent"
        held = {i for k, i in before.items() if k[0] == stage}
        nights = int(self.rng.integers(2, 5))
        for n in range(nights):
            if n:
                self.day += 1
            run = self.finish(self.spec(f"{stage} absent", absent=(stage,)), plain=False)
            closed = {str((e.get("episode") or {}).get("id")) for kind in ("cleared",
                      "resolved") for e in run.events_of(kind)}
            self._expect(not closed & held, f"{stage} did not run, yet its episodes "
                                            f"{sorted(closed & held)} closed")

    def _settled(self) -> list[str]:
        """Stages at their level 1.0, not drifting or watched, that ran on each of the
        newest :data:`BASELINE_NIGHTS` nights (their baseline knows them), hold no open
        episode (a flag there opens a new episode) and were never acknowledged (kept so
        that a seed makes the same nights as in the runs recorded in docs/alerts.md; the
        baseline check itself holds out only an acknowledged episode's own nights)."""
        recent = self.log[-BASELINE_NIGHTS:]
        held = {k[0] for k in self.open_ids.get(self.v, {})}
        acked = {k[0] for k in self.acked.values()}
        return [s for s in self._free() if self.level[s] == 1.0 and s not in held | acked
                and not any(s in n.spec.absent for n in recent)]

    def _check_pages(self, run: NightRun) -> None:
        """Every id paged for this version since the accepted run (within the replay
        window) is acknowledgeable (``alerts`` finds it), and once its episode is cleared or
        resolved, a cleared or resolved event named it (by the next night, when an
        overlapping night's judge closed it unseen)."""
        for kind in ("suspected", "detected"):
            for event in run.events_of(kind):
                ep_id = str((event.get("episode") or {}).get("id"))
                self.pages.setdefault(ep_id, (run.spec.version, len(self.log) - 1))
        for kind in ("cleared", "resolved"):
            for event in run.events_of(kind):
                episode = event.get("episode") or {}
                self.closed_named.update(str(i) for i in (episode.get("id"),
                                                          *(episode.get("aliases") or ())))
        if not run.judged:
            return
        version = run.spec.version
        book, _ = self.driver.episodes(version)
        judged = [i for i, n in enumerate(self.log) if n.judged and n.spec.version == version]
        oldest = judged[-50] if len(judged) >= 50 else 0
        for ep_id, (ver, index) in self.pages.items():
            night = self.log[index]
            if ver != version or index < oldest or (
                    self.accepted and night.run_id <= self.accepted):
                continue
            episode = next((e for e in book.episodes
                            if ep_id in (e.id, *getattr(e, "aliases", ()))), None)
            self._expect(episode is not None,
                         f"id {ep_id} paged by {night.run_id} ({night.spec.kind}) matches no "
                         "episode: `ack` cannot answer it")
            # closed by tonight's fold unseen by tonight's judge (an overlapping night):
            # the next night announces it
            owed = episode is not None and episode.ended_run == book.last_run
            if episode is not None and not episode.open and not owed:
                self._expect(ep_id in self.closed_named,
                             f"id {ep_id} paged by {night.run_id}: its episode "
                             f"{episode.id} is {episode.state}, but no cleared or "
                             "resolved event named it")


def violation_kinds(violations: Iterable[str]) -> dict[str, int]:
    """Violations counted by what they say (the text after the location)."""
    out: dict[str, int] = {}
    for line in violations:
        what = line.split(": ", 1)[-1]
        what = " ".join(w for w in what.split() if not any(c.isdigit() for c in w))[:90]
        out[what] = out.get(what, 0) + 1
    return out

