"""The run manifest: the small JSON document that makes a stored run complete.

Built from the run record, its summary and utilisation, the stages' reports and the
environment; written last by :meth:`~prefect_dask_profiling.store.runs.RunStore.write_run`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Required, TypedDict, cast

import pandas as pd

from prefect_dask_profiling._util import json_clean, validate_name
from prefect_dask_profiling.environment import Environment
from prefect_dask_profiling.environment import environment as environment  # re-exported
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.errors import DamagedRecord
from prefect_dask_profiling.store.tables import totals_of
from prefect_dask_profiling.summary.io import StageIO
from prefect_dask_profiling.summary.memory import StageMemory
from prefect_dask_profiling.timing.types import ChunksVsBlocks as ChunksVsBlocks  # re-exported

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import Incident

SCHEMA_VERSION = 1
# Index statuses. ``unjudged``: the run is stored but its verdict could not be computed.
STATUSES = ("healthy", "regressed", "suspected", "failed", "incomplete", "unjudged",
            "acknowledged")
# Keys a stored manifest must have to be read back.
MANIFEST_REQUIRED = ("schema_version", "run_id", "pipeline", "version", "status", "files")
# Manifest keys copied into a run's index marker (readable without opening the run).
INDEX_FIELDS = ("run_id", "pipeline", "version", "status", "state", "regressed", "started",
                "ended", "wall_s", "source_hash", "flow_run_id", "flow_run_name", "attempt")


class FileEntry(TypedDict):
    """Size and checksum of one stored file of a run (checked when it is read back)."""

    size: int
    sha256: str


class DeliveryReport(TypedDict):
    """What :meth:`Delivery.deliver_pending` did with files earlier runs left in the spool.

    ``delivered``/``left`` count files; ``runs`` are the run ids whose manifest was
    delivered, ``pipelines`` the pipeline of each; ``note`` says why files were left (store
    down, out of time, busy), if any.
    """

    delivered: int
    left: int
    runs: list[str]
    pipelines: dict[str, str]
    seconds: float
    note: str | None
    warnings: list[str]


class Baseline(TypedDict):
    """The runs a verdict compared against (the manifest's ``baseline``)."""

    runs: list[str]
    version: str
    note: str


class Utilisation(TypedDict):
    """Task seconds over thread seconds, for the run and per stage (``None``: unknown)."""

    run: float | None
    stages: dict[str, float | None]


class StageReport(TypedDict):
    """Where a stage's stored performance report is and what it shows (a stage entry's
    ``report``): ``tasks`` ran in the stage's report window, ``shown`` of them are drawn
    (``truncated`` when Dask's task stream had dropped some); ``spooled`` when the report
    waits in the local spool; ``renderer``: ``"flow"`` (drawn in the flow process) or
    ``"dask"`` (by Dask on the scheduler)."""

    location: str
    size: int
    tasks: int
    shown: int
    truncated: bool
    spooled: bool
    renderer: str


class ManifestExtra(TypedDict, total=False):
    """The manifest keys the steps of a run's end add (``run.pipeline.RunEnd.manifest_extra``)."""

    incidents: list[Incident]
    finish_seconds: dict[str, float]
    spool_delivery: DeliveryReport
    history_read: dict[str, str]  # at (ISO), when ("run start" or "finish"), why (re-read)
    # per stage, outside stages, run (cost.allocation.RunAllocation.to_dict); rates if priced
    allocation: dict[str, Any]
    # an unjudged run's streak: nights in a row unjudged, the cause, the command, blind or not
    # (regression.blind.Blindness.to_json)
    unjudged: dict[str, object]


class Manifest(ManifestExtra, total=False):
    """The manifest document of one stored run (``manifest.json``, plain JSON).

    ``files`` and ``totals`` (the tasks table's totals per prefix, absent in runs stored
    before them) are added by the store when the run is written; steps of the run's end may add
    further keys (``finish_seconds``, ``spool_delivery``, ...), which readers ignore.
    """

    schema_version: Required[int]
    run_id: Required[str]
    pipeline: Required[str]
    version: Required[str]
    status: Required[str]
    files: dict[str, FileEntry]
    totals: dict[str, list]
    state: str
    regressed: bool
    unjudged_reason: str | None
    source_hash: str | None
    flow_run_id: str | None
    flow_run_name: str | None
    attempt: int | None  # the flow run's attempt (Prefect's run_count: 1, then each retry)
    deployment: str | None
    baseline: Baseline
    started: str
    ended: str
    wall_s: float | None
    workers: int
    threads: int
    utilisation: Utilisation
    stages: list[dict[str, Any]]  # each a StageInfo.__dict__ (old runs lack later keys)
    environment: Environment
    warnings: list[str]


class IndexMarker(TypedDict):
    """A run's index marker: the manifest fields a listing shows (:data:`INDEX_FIELDS`),
    each ``None`` when the manifest lacks it."""

    run_id: str
    pipeline: str
    version: str
    status: str
    state: str | None
    regressed: bool | None
    started: str | None
    ended: str | None
    wall_s: float | None
    source_hash: str | None
    flow_run_id: str | None
    flow_run_name: str | None
    attempt: int | None


class LocalWork(TypedDict):
    """Dask work of a stage that ran on local threads of the flow process, not on the
    cluster, so the profile did not record it (see docs/stages.md)."""

    tasks: int
    seconds: float
    computes: int


@dataclass
class StageInfo:
    """One stage as the manifest lists it.

    A name opened several times (a ``with stage("process"):`` inside a loop) is one entry:
    ``windows`` counts its openings, its totals and its report cover all of them.
    """

    name: str
    wall_s: float = 0.0
    tasks: int = 0
    task_s: float = 0.0
    # location, size, tasks (the stage ran), shown (in the report), truncated, spooled and
    # renderer ("flow": drawn in the flow process, "dask": by Dask on the scheduler)
    report: StageReport | None = None
    note: str | None = None
    # the stage's bottleneck verdict (diagnosis.stages.Diagnosis.to_dict: stage, primary,
    # secondary, confidence, signals...); absent in old runs
    diagnosis: dict[str, Any] | None = None
    windows: int = 1
    local_work: LocalWork | None = None
    # storage requests of the stage summed over workers (summary.io.stage_io_summary);
    # None when no storage source was counted
    io: StageIO | None = None
    # Dask chunks read against the files' internal blocks (timing.io_client.chunks_against_
    # blocks); None when the stage read no files through GDAL
    chunks_vs_blocks: ChunksVsBlocks | None = None
    # peak / start / added bytes, headroom, spilled bytes... (summary.memory.StageMemory);
    # absent in old runs, start_bytes / added_bytes absent in runs before issue 35
    memory: StageMemory | None = None
    # worker-, thread- and GiB-hours allocated, busy and idle seconds, idle share and, when
    # priced, cost (cost.allocation.Allocation.to_dict); absent in runs before issue 37
    allocation: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunKey:
    """Which run: the identity that crosses from the run's end to the judge and back."""

    run_id: str
    pipeline: str
    version: str

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> RunKey:
        """The run a manifest names."""
        return cls(str(doc["run_id"]), str(doc["pipeline"]), str(doc["version"]))


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
    # which attempt of the flow run this is (Prefect's ``flow_run.run_count``: 1, then 2...
    # for each retry); every attempt is a run of its own, with the same flow_run_id
    attempt: int | None = None
    started: datetime = field(default_factory=lambda: datetime.now(UTC))

    @property
    def key(self) -> RunKey:
        """Its identity (:class:`RunKey`)."""
        return RunKey(self.run_id, self.pipeline, self.version)


def status_for(state: str, regressed: bool, judged: bool = True,
               suspected: bool = False, acknowledged: bool = False) -> str:
    """Index status of a run from the flow's final state and the verdict.

    A run that completed but whose verdict could not be computed is ``unjudged``: it is
    kept out of every baseline and ``dask-profiling check`` fails for it. A judged run with
    a suspected regression that did not fail it is ``suspected``: out of baselines too. A
    judged run that only acknowledged episodes would have failed is ``acknowledged``: told
    apart from a healthy run in ``runs`` and the fleet view.
    """
    if state not in ("COMPLETED", "FAILED") or (state == "FAILED" and not regressed):
        return "failed" if state != "UNKNOWN" else "incomplete"
    if not judged:
        return "unjudged"
    if regressed:
        return "regressed"
    return "acknowledged" if acknowledged else ("suspected" if suspected else "healthy")


def build_manifest(ctx: RunContext, *, state: str, regressed: bool,
                   utilisation: pd.DataFrame, stages: list[StageInfo], workers: int,
                   threads: int, env: Environment, warnings: list[str],
                   baseline: Baseline | None = None,
                   ended: datetime | None = None, judged: bool = True,
                   unjudged_reason: str | None = None, suspected: bool = False,
                   acknowledged: bool = False) -> Manifest:
    """The manifest document (``files`` is added by the store)."""
    ended = ended or datetime.now(UTC)
    util: Utilisation = {"run": None, "stages": {}}
    for scope, row in utilisation.iterrows():
        value = row["utilisation"]
        if scope == "run":
            util["run"] = value
        else:
            util["stages"][scope] = value
    return cast(Manifest, json_clean({
        "schema_version": SCHEMA_VERSION,
        "run_id": ctx.run_id, "pipeline": ctx.pipeline, "version": ctx.version,
        "source_hash": ctx.source_hash, "flow_run_id": ctx.flow_run_id,
        "flow_run_name": ctx.flow_run_name, "attempt": ctx.attempt,
        "deployment": ctx.deployment,
        "state": state, "status": status_for(state, regressed, judged, suspected,
                                                     acknowledged),
        "regressed": regressed,
        "unjudged_reason": None if judged else unjudged_reason,
        "baseline": baseline or {"runs": [], "version": ctx.version, "note": "no check ran"},
        "started": ctx.started.isoformat(), "ended": ended.isoformat(),
        "wall_s": (ended - ctx.started).total_seconds(),
        "workers": workers, "threads": threads, "utilisation": util,
        "stages": [s.__dict__ for s in stages],
        "environment": env, "warnings": warnings,
    }))


# ---------------------------------------------------------------------- stored form
def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (the checksum kept for every stored file)."""
    return hashlib.sha256(data).hexdigest()


def dump(doc: Any) -> bytes:
    """``doc`` as the indented JSON bytes the store writes."""
    return json.dumps(json_clean(doc), indent=2).encode()


def complete_manifest(pipeline: str, run_id: str, manifest: Manifest | Mapping[str, Any],
                      files: dict[str, bytes]) -> Manifest:
    """``manifest`` with its defaults filled in, ``files`` (size and sha256 of each) and
    ``totals`` (the tasks table's stage, prefix, tasks and total_s, which is all a drift
    series reads of the run: one request per run instead of two; see
    :func:`~prefect_dask_profiling.store.tables.totals_of`).

    ``ValueError`` when it names another run or pipeline, another schema, or an unknown
    status.
    """
    if not isinstance(manifest, dict):
        raise InvalidInput("manifest must be a dict")
    doc = dict(manifest)
    for key, value in (("pipeline", pipeline), ("run_id", run_id)):
        if doc.setdefault(key, value) != value:
            raise InvalidInput(f"manifest {key} {doc[key]!r} differs from {value!r}")
    if doc.setdefault("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise InvalidInput(f"manifest schema_version must be {SCHEMA_VERSION}")
    validate_name(doc.setdefault("version", "unknown"), "version")
    if doc.setdefault("status", "incomplete") not in STATUSES:
        raise InvalidInput(f"manifest status must be one of {', '.join(STATUSES)}, "
                           f"got {doc['status']!r}")
    doc.setdefault("state", "UNKNOWN")
    doc.setdefault("warnings", [])
    doc["files"] = {name: {"size": len(data), "sha256": sha256(data)}
                    for name, data in files.items()}
    tasks = files.get(layout.table_name("tasks"))
    totals = totals_of(tasks) if tasks is not None else None
    if totals is None:
        doc.pop("totals", None)  # readers of the history read tasks.csv
    else:
        doc["totals"] = totals
    return cast(Manifest, json_clean(doc))


def marker_doc(manifest: Manifest) -> IndexMarker:
    """The body of a run's index marker: the manifest fields a listing may show."""
    return cast(IndexMarker, {k: manifest.get(k) for k in INDEX_FIELDS})


def parse_manifest(data: bytes, pipeline: str, run_id: str, where: str) -> Manifest:
    """The manifest stored as ``data`` at ``where``; ``DamagedRecord`` naming ``where`` if it
    is not UTF-8 JSON, not a manifest, of another schema, incomplete or of another run."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise DamagedRecord(f"{where} is not valid JSON ({reason})") from None
    if not isinstance(doc, dict) or "schema_version" not in doc:
        raise DamagedRecord(f"{where} is not a dask-profiling manifest (no schema_version)")
    if doc["schema_version"] != SCHEMA_VERSION:
        raise DamagedRecord(f"{where} has schema_version {doc['schema_version']!r}; this "
                         f"version of dask-profiling reads {SCHEMA_VERSION}")
    missing = [k for k in MANIFEST_REQUIRED if k not in doc]
    if missing:
        raise DamagedRecord(f"{where} lacks {', '.join(missing)}")
    if doc["run_id"] != run_id or doc["pipeline"] != pipeline:
        raise DamagedRecord(f"{where} belongs to run {doc['run_id']!r} of pipeline "
                         f"{doc['pipeline']!r}")
    if not isinstance(doc["files"], dict):
        raise DamagedRecord(f"{where} has a malformed 'files' entry")
    if doc["status"] not in STATUSES or not isinstance(doc["version"], str):
        raise DamagedRecord(f"{where} has an unknown status {doc['status']!r} or a malformed "
                         "version")
    return cast(Manifest, doc)


def is_provisional(data: bytes) -> bool:
    """Whether stored manifest bytes are the provisional manifest a run writes before its
    verdict (status ``unjudged``, reason ``verdict pending``): its final one may replace it."""
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("status") == "unjudged" and doc.get(
        "unjudged_reason") == "verdict pending"
