"""Every path inside a run store, built and parsed here and nowhere else (the layout is drawn
in docs/run-store.md: ``runs/``, ``reports/``, ``index/``, ``accepted/``, ``acks/``,
``fleet/``, ``live/``).

Index markers are partitioned by the month of their run id (``undated`` otherwise), so a
baseline lists only the newest months it needs; parsers also read the older unpartitioned
markers. Builders validate every name they put into a path; parsers return ``None`` (or a
reason) instead of raising, because a store holds whatever was written into it."""

from __future__ import annotations

import re
from typing import NamedTuple

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.errors import InvalidInput

RUNS = "runs"
REPORTS = "reports"
INDEX = "index"
ACCEPTED = "accepted"
ACKS = "acks"
FLEET = "fleet"
LIVE = "live"
LIVE_SUFFIX = ".json"
MANIFEST = "manifest.json"
REPORT_SUFFIX = ".html"
FLEET_PARTITION = "pipeline="
FLEET_MONTH = "month="  # a compacted month of a pipeline's fleet files
UNDATED = "undated"  # the index partition of run ids that do not start with a timestamp
_DATED = re.compile(r"(\d{4})(\d{2})\d{2}T")
_MONTH = re.compile(r"\d{4}-\d{2}")


class Marker(NamedTuple):
    """What an index marker's path says: the run, its version and status."""

    pipeline: str
    version: str
    run_id: str
    status: str


# ---------------------------------------------------------------------- building
def join(*parts: str) -> str:
    """``parts`` joined by ``/`` (empty parts dropped)."""
    return "/".join(p for p in parts if p)


def run_dir(pipeline: str, run_id: str) -> str:
    """``runs/<pipeline>/<run_id>``: the folder holding one run's record."""
    return join(RUNS, validate_name(pipeline, "pipeline"), validate_name(run_id, "run_id"))


def run_file(pipeline: str, run_id: str, name: str) -> str:
    """``runs/<pipeline>/<run_id>/<name>``: one file of a run's record."""
    return join(run_dir(pipeline, run_id), validate_name(name, "file name"))


def table_file(pipeline: str, run_id: str, table: str) -> str:
    """``runs/<pipeline>/<run_id>/<table>.csv``."""
    return run_file(pipeline, run_id, table_name(table))


def table_name(table: str) -> str:
    """``<table>.csv``: a table's file name in its run's folder (and in the manifest)."""
    return f"{validate_name(table, 'table name')}.csv"


def manifest_file(pipeline: str, run_id: str) -> str:
    """``runs/<pipeline>/<run_id>/manifest.json``: written last, it makes the run complete."""
    return run_file(pipeline, run_id, MANIFEST)


def pipeline_runs(pipeline: str) -> str:
    """``runs/<pipeline>``: the folder of every run of ``pipeline``."""
    return join(RUNS, validate_name(pipeline, "pipeline"))


def report_dir(pipeline: str, run_id: str) -> str:
    """``reports/<pipeline>/<run_id>``: one run's per-stage reports (swept as a whole)."""
    return join(REPORTS, validate_name(pipeline, "pipeline"), validate_name(run_id, "run_id"))


def report_file(pipeline: str, run_id: str, stage: str) -> str:
    """``reports/<pipeline>/<run_id>/<stage>.html``."""
    return join(report_dir(pipeline, run_id), validate_name(stage, "stage") + REPORT_SUFFIX)


def index_dir(pipeline: str | None = None, version: str | None = None) -> str:
    """``index``, ``index/<pipeline>`` or ``index/<pipeline>/<version>``."""
    if version is not None and pipeline is None:
        raise InvalidInput("an index folder of a version needs its pipeline")
    return join(INDEX, validate_name(pipeline, "pipeline") if pipeline is not None else "",
                validate_name(version, "version") if version is not None else "")


def index_partition(run_id: str) -> str:
    """The index partition of ``run_id``: ``YYYY-MM`` of its timestamp, else ``undated``."""
    match = _DATED.match(validate_name(run_id, "run_id"))
    return f"{match.group(1)}-{match.group(2)}" if match else UNDATED


def month_key(partition: str) -> str:
    """The run-id prefix a dated partition's runs start with (``2026-12`` -> ``202612``)."""
    return partition.replace("-", "")


def partition_start(run_id: str) -> str:
    """A name no run id of ``run_id``'s partition sorts before: ``202602`` for
    ``20260216T020000Z-3faee9``; ``run_id`` itself when it has no timestamp. A listing of
    run folders from there covers the whole month of ``run_id`` (and what follows)."""
    partition = index_partition(run_id)
    return run_id if partition == UNDATED else month_key(partition)


def is_partition(name: str) -> bool:
    """Whether ``name`` is an index partition folder (``YYYY-MM`` or ``undated``)."""
    return name == UNDATED or bool(_MONTH.fullmatch(name))


def index_partition_dir(pipeline: str, version: str, partition: str) -> str:
    """``index/<pipeline>/<version>/<partition>``: one month's markers."""
    if not is_partition(partition):
        raise InvalidInput(f"not an index partition: {partition!r}")
    return join(index_dir(pipeline, version), partition)


def index_marker(pipeline: str, version: str, run_id: str, status: str) -> str:
    """``index/<pipeline>/<version>/<YYYY-MM>/<run_id>.<status>``: lists a run without
    reading it."""
    return join(index_dir(pipeline, version), index_partition(run_id),
                f"{validate_name(run_id, 'run_id')}.{validate_name(status, 'status')}")


def flat_index_marker(pipeline: str, version: str, run_id: str, status: str) -> str:
    """``index/<pipeline>/<version>/<run_id>.<status>``: where stores written before the
    partitions keep a run's marker (read, never written)."""
    return join(index_dir(pipeline, version),
                f"{validate_name(run_id, 'run_id')}.{validate_name(status, 'status')}")


def accepted_dir(pipeline: str, version: str) -> str:
    """``accepted/<pipeline>/<version>``."""
    return join(ACCEPTED, validate_name(pipeline, "pipeline"), validate_name(version, "version"))


def accepted_marker(pipeline: str, version: str, run_id: str) -> str:
    """``accepted/<pipeline>/<version>/<run_id>``: the baseline restarts at that run."""
    return join(accepted_dir(pipeline, version), validate_name(run_id, "run_id"))


def ack_dir(pipeline: str, version: str) -> str:
    """``acks/<pipeline>/<version>``."""
    return join(ACKS, validate_name(pipeline, "pipeline"), validate_name(version, "version"))


def ack_marker(pipeline: str, version: str, target: str) -> str:
    """``acks/<pipeline>/<version>/<target>``: one acknowledgement, ``target`` an episode id
    (``ep-…``) or a run id."""
    return join(ack_dir(pipeline, version), validate_name(target, "ack target"))


def fleet_dir(pipeline: str | None = None) -> str:
    """``fleet`` or ``fleet/pipeline=<pipeline>`` (a Hive partition of the Parquet view)."""
    if pipeline is None:
        return FLEET
    return join(FLEET, FLEET_PARTITION + validate_name(pipeline, "pipeline"))


def fleet_file(pipeline: str, run_id: str) -> str:
    """``fleet/pipeline=<pipeline>/<run_id>.parquet``."""
    return join(fleet_dir(pipeline), f"{validate_name(run_id, 'run_id')}.parquet")


def fleet_month_file(pipeline: str, month: str) -> str:
    """``fleet/pipeline=<pipeline>/month=<YYYY-MM>.parquet``: the month's runs in one file."""
    if not _MONTH.fullmatch(month):
        raise InvalidInput(f"not a month (YYYY-MM): {month!r}")
    return join(fleet_dir(pipeline), f"{FLEET_MONTH}{month}.parquet")


def parse_fleet_file(name: str) -> tuple[str, str] | None:
    """What a file of a fleet partition holds: ``("month", "YYYY-MM")`` for a compacted
    month, ``("run", run_id)`` for one run's file, else ``None``."""
    stem, dot, suffix = name.rpartition(".")
    if not dot or suffix != "parquet":
        return None
    if stem.startswith(FLEET_MONTH):
        month = stem[len(FLEET_MONTH):]
        return ("month", month) if _MONTH.fullmatch(month) else None
    return ("run", stem) if valid_names(stem) else None


def live_dir(pipeline: str) -> str:
    """``live/<pipeline>``: the current estimates of the pipeline's runs in progress."""
    return join(LIVE, validate_name(pipeline, "pipeline"))


def live_file(pipeline: str, run_id: str) -> str:
    """``live/<pipeline>/<run_id>.json``: one run's current ETA, replaced while it runs and
    removed when it ends (not part of the run's record)."""
    return join(live_dir(pipeline), validate_name(run_id, "run_id") + LIVE_SUFFIX)


# ---------------------------------------------------------------------- parsing
def valid_names(*names: str) -> bool:
    """Whether every one of ``names`` is a safe path segment (no exception)."""
    try:
        for name in names:
            validate_name(name, "name")
    except ValueError:
        return False
    return True


def parse_marker(rel: str, statuses: tuple[str, ...]) -> Marker | str:
    """The :class:`Marker` at ``rel`` (``index/<pipeline>/<version>/<YYYY-MM>/<run_id>.<status>``
    or, as written before the partitions, without ``<YYYY-MM>/``), or why ``rel`` is not one
    (a one-line reason)."""
    parts = rel.split("/")
    if len(parts) not in (4, 5) or parts[0] != INDEX:
        return f"not at {INDEX}/<pipeline>/<version>/<YYYY-MM>/<run_id>.<status>"
    pipeline, version, name = parts[1], parts[2], parts[-1]
    run_id, _, status = name.rpartition(".")
    if len(parts) == 5 and (not valid_names(run_id) or parts[3] != index_partition(run_id)):
        return f"in partition {parts[3]!r}, not in its run's month"
    if status not in statuses:
        return f"unknown status {status!r}"
    if not valid_names(pipeline, version, run_id):
        return "invalid pipeline, version or run id"
    return Marker(pipeline, version, run_id, status)


def parse_report(rel: str) -> tuple[str, str] | None:
    """``(pipeline, run_id)`` of a file below ``reports/<pipeline>/<run_id>/``, else ``None``."""
    parts = rel.split("/")
    if len(parts) < 4 or parts[0] != REPORTS or not valid_names(parts[1], parts[2]):
        return None
    return parts[1], parts[2]


def parse_accepted(rel: str) -> tuple[str, str, str] | None:
    """``(pipeline, version, run_id)`` of ``accepted/<pipeline>/<version>/<run_id>``."""
    parts = rel.split("/")
    if len(parts) != 4 or parts[0] != ACCEPTED or not valid_names(*parts[1:]):
        return None
    return parts[1], parts[2], parts[3]


def parse_ack(rel: str) -> tuple[str, str, str] | None:
    """``(pipeline, version, target)`` of an ack marker path, else ``None``."""
    parts = rel.split("/")
    if len(parts) == 4 and parts[0] == ACKS and valid_names(*parts[1:]):
        return parts[1], parts[2], parts[3]
    return None


def parse_live(rel: str) -> tuple[str, str] | None:
    """``(pipeline, run_id)`` of ``live/<pipeline>/<run_id>.json``, else ``None``."""
    parts = rel.split("/")
    if len(parts) != 3 or parts[0] != LIVE or not parts[2].endswith(LIVE_SUFFIX):
        return None
    run_id = parts[2].removesuffix(LIVE_SUFFIX)
    return (parts[1], run_id) if valid_names(parts[1], run_id) else None


def run_of(rel: str) -> tuple[str, str] | None:
    """The ``(pipeline, run_id)`` whose record ``rel`` belongs to (run file or index marker).

    Reports are not part of a run's record: they may be uploaded in any order.
    """
    parts = rel.split("/")
    if parts[0] == RUNS and len(parts) >= 4:
        return parts[1], parts[2]
    if parts[0] == INDEX and len(parts) in (4, 5):
        return parts[1], parts[-1].rpartition(".")[0]
    return None


def write_rank(rel: str) -> int:
    """Order in which files of a run must reach the store: reports and other files (0),
    tables (1), the manifest (2), index markers last (3) — so a listed run is complete."""
    parts = rel.split("/")
    if parts[0] == INDEX:
        return 3
    if parts[0] == RUNS and parts[-1] == MANIFEST:
        return 2
    return 1 if parts[0] == RUNS else 0
