"""The ``io`` table of a run: storage requests per stage and process (rows from
:func:`~prefect_dask_profiling.timing.io_client.stage_deltas`; the flow process is
``process == "flow"``), and :func:`stage_io_metrics`, the pure per-stage view the judge and
the tables use.

A stage's figures are its **total** over every process (per kind of process beside them:
``workers_*``, ``flow_process_*``), and per-chunk figures divide the total, so a change in
how files are opened shows wherever the opening happens. A source's columns (``gdal_*``,
``s3fs_*``) exist only when it was loaded on some worker: absent, never zero."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from prefect_dask_profiling.environment import RasterStack


class ProcessIO(TypedDict, total=False):
    """Storage figures of one kind of process in a stage (absent figures left out)."""

    requests: int
    get: int
    head: int
    list: int
    bytes: int
    s3fs_requests: int
    s3fs_bytes: int


class StageIO(ProcessIO, total=False):
    """One stage's storage summary as the manifest keeps it (:func:`stage_io_summary`, the
    stage entry's ``io``): the totals, and per kind of process (``workers``,
    ``flow_process``) when the flow process was counted. Integral figures are ints, others
    rounded floats."""

    chunks: int
    requests_per_chunk: float
    bytes_per_chunk: float
    read_amplification: float
    workers: ProcessIO
    flow_process: ProcessIO
    requests_lower_bound: str


BASE_COLUMNS = ["stage", "worker", "chunks", "decoded_bytes"]
SOURCES = ("gdal", "s3fs")
REQUEST_METHODS = ("get", "head", "list")
METRICS = ("requests", "get", "head", "list", "bytes", "chunks", "requests_per_chunk",
           "bytes_per_chunk", "read_amplification", "s3fs_requests", "s3fs_bytes")
# kinds of process a stage's figures are split by: ``process`` column value -> name
PROCESSES = {"worker": "workers", "flow": "flow_process"}
SPLIT_FIGURES = ("requests", "get", "head", "list", "bytes", "s3fs_requests", "s3fs_bytes")
# GDAL_HTTP_MULTIRANGE=PARALLEL (GDAL's default) sends one HTTP request per merged range of
# a multi-range read, all at once, and logs the batch as one GET in its network statistics
# (VSICurlHandle::ReadMultiRange, port/cpl_vsil_curl.cpp): GDAL's count is then a lower bound
MULTIRANGE_OPTION = "GDAL_HTTP_MULTIRANGE"
LOWER_BOUND_NOTE = ("GDAL_HTTP_MULTIRANGE=PARALLEL: GDAL counts a batch of parallel range "
                    "requests as one GET, so GDAL's requests are a lower bound (bytes exact)")


def io_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The ``io`` table from stage delta rows (empty rows: an empty table with base columns)."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return pd.DataFrame(columns=BASE_COLUMNS)
    first = [c for c in BASE_COLUMNS if c in frame.columns]
    return frame[first + sorted(c for c in frame.columns if c not in BASE_COLUMNS)]


def has_source(io: pd.DataFrame, source: str) -> bool:
    """True when the table has ``source`` columns (``"gdal"`` or ``"s3fs"``)."""
    return f"{source}_bytes" in io.columns


def stage_io_metrics(io: pd.DataFrame) -> pd.DataFrame:
    """Per-stage storage metrics, summed over processes (pure).

    Parameters
    ----------
    io
        A run's ``io`` table (:func:`io_frame`; stored as ``io.csv``). Rows without a
        ``process`` (older tables) are workers'.

    Returns
    -------
    One row per stage that made GDAL requests, indexed by stage, with ``requests`` (GDAL
    GET + HEAD + LIST), ``get``, ``head``, ``list``, ``bytes`` (downloaded), ``chunks`` (the
    source chunks of reading prefixes, :mod:`~prefect_dask_profiling.timing.worker_io`),
    ``requests_per_chunk``, ``bytes_per_chunk``, ``read_amplification`` (bytes fetched /
    bytes of decoded pixels), and ``s3fs_requests``/``s3fs_bytes`` when s3fs was used: all
    totals over the workers and the flow process. ``workers_<figure>`` and
    ``flow_process_<figure>`` (:data:`SPLIT_FIGURES`) split them when the table has the flow
    process's rows. No GDAL columns: only the s3fs ones (or an empty frame).
    """
    if io is None or io.empty:
        return pd.DataFrame(columns=list(METRICS)).rename_axis("stage")
    numeric = _numeric(io)
    total = numeric.groupby("stage", sort=False).sum(min_count=1)
    out = _figures(io, total)
    if has_source(io, "gdal"):
        chunks = total["chunks"].where(total["chunks"] > 0)
        out["chunks"] = total["chunks"].where(out["requests"].notna())  # no GDAL: absent
        out["requests_per_chunk"] = out["requests"] / chunks
        out["bytes_per_chunk"] = out["bytes"] / chunks
        decoded = total["decoded_bytes"].where(total["decoded_bytes"] > 0)
        out["read_amplification"] = out["bytes"] / decoded
    if "process" in io.columns and (io["process"] == "flow").any():
        kinds = numeric.assign(process=io["process"].fillna("worker"))
        for kind, name in PROCESSES.items():
            part = kinds[kinds["process"] == kind].drop(columns=["process"])
            figures = _figures(io, part.groupby("stage", sort=False).sum(min_count=1))
            for figure in SPLIT_FIGURES:
                if figure in figures.columns:
                    out[f"{name}_{figure}"] = figures[figure].reindex(out.index)
    order = [c for c in METRICS if c in out.columns]
    out = out[order + [c for c in out.columns if c not in order]]
    out = out.replace([np.inf, -np.inf], np.nan)
    return out.rename_axis("stage")


def _numeric(io: pd.DataFrame) -> pd.DataFrame:
    """The table's numbers by stage (text columns other than ``stage`` dropped)."""
    numeric = io.drop(columns=[c for c in ("worker", "process") if c in io.columns])
    return numeric.apply(
        lambda c: pd.to_numeric(c, errors="coerce") if c.name != "stage" else c)


def _figures(io: pd.DataFrame, total: pd.DataFrame) -> pd.DataFrame:
    """Request and byte figures of the sources in ``io`` from per-stage sums (pure)."""
    out = pd.DataFrame(index=total.index)
    if has_source(io, "gdal"):
        for method in REQUEST_METHODS:
            out[method] = total[f"gdal_{method}"]
        out["requests"] = out[list(REQUEST_METHODS)].sum(axis=1, min_count=1)
        out["bytes"] = total["gdal_bytes"]
    if has_source(io, "s3fs"):
        out["s3fs_requests"] = total[[f"s3fs_{m}" for m in REQUEST_METHODS]].sum(
            axis=1, min_count=1)
        out["s3fs_bytes"] = total["s3fs_bytes"]
    return out


def stage_io_summary(io: pd.DataFrame, stage: str) -> StageIO | None:
    """One stage's metrics as plain JSON values (for the manifest's stage entry), or None."""
    return stage_io_summaries(io).get(stage)


def stage_io_summaries(io: pd.DataFrame) -> dict[str, StageIO]:
    """:func:`stage_io_summary` of every stage that has one, from one pass over the table.

    ``{requests, get, ..., chunks, requests_per_chunk, ...}`` (totals) and, when the flow
    process was counted, ``workers`` and ``flow_process``: ``{requests, get, head, list,
    bytes, s3fs_requests, s3fs_bytes}`` of each (absent figures left out).
    """
    out: dict[str, StageIO] = {}
    for stage, row in stage_io_metrics(io).iterrows():
        values: dict[str, Any] = {}  # built by column name, then the declared keys
        for name, value in row.items():
            if pd.isna(value):
                continue
            value = round(float(value), 3) if isinstance(value, float) and not float(
                value).is_integer() else int(value)
            part = next((p for p in PROCESSES.values() if str(name).startswith(f"{p}_")),
                        None)
            if part is None:
                values[str(name)] = value
            else:
                values.setdefault(part, {})[str(name).removeprefix(f"{part}_")] = value
        if values:
            out[str(stage)] = cast(StageIO, values)
    return out


def requests_lower_bound(raster: RasterStack | None) -> str | None:
    """:data:`LOWER_BOUND_NOTE` when some worker's effective ``GDAL_HTTP_MULTIRANGE`` is
    ``PARALLEL`` (GDAL's default) and not every worker counted the requests of its
    parallel batches (``ranges_counted``), else None (pure).

    ``raster`` is the run's raster stack (``environment.raster``): options the workers
    disagree on are joined by `` | ``, so one worker on ``PARALLEL`` flags the run.
    """
    if not isinstance(raster, dict) or raster.get("ranges_counted"):
        return None
    value = (raster.get("options") or {}).get(MULTIRANGE_OPTION)
    modes = {v.strip().upper() for v in str(value or "").split("|")}
    return LOWER_BOUND_NOTE if "PARALLEL" in modes else None


def mark_lower_bound(summaries: dict[str, StageIO], raster: RasterStack | None) -> None:
    """Note :func:`requests_lower_bound` on every stage with GDAL requests (in place).

    Why here, not in the counters: GDAL's statistics do not say how many HTTP requests a
    parallel batch was, so the flag comes from the options the workers ran with.
    """
    note = requests_lower_bound(raster)
    if note is None:
        return
    for io in summaries.values():
        if io.get("requests"):
            io["requests_lower_bound"] = note


def io_text(io: StageIO | None) -> str:
    """One stage's storage summary (:func:`stage_io_summary`) as a short line; "" without.

    E.g. ``"56 requests (GET 56), 1.1 per chunk, 1.1 MB, read amplification 0.33x"``;
    ``", 8 in the flow process"`` is added when the flow process made some of them;
    ``"at least"`` leads when the requests are a lower bound (:func:`requests_lower_bound`).
    """
    if not isinstance(io, dict) or not io.get("requests"):  # no GDAL, or no GDAL request
        extra = io.get("s3fs_requests") if isinstance(io, dict) else None
        return f"s3fs {int(extra)} requests" if extra else ""
    methods = ", ".join(f"{m.upper()} {int(io[m])}" for m in REQUEST_METHODS if io.get(m))
    flow = (io.get("flow_process") or {}).get("requests")
    least = "at least " if io.get("requests_lower_bound") else ""
    parts = [f"{least}{int(io['requests'])} requests" + (f" ({methods})" if methods else "")
             + (f" of which {int(flow)} in the flow process" if flow else "")]
    if io.get("requests_per_chunk") is not None:
        parts.append(f"{io['requests_per_chunk']:.2g} per chunk")
    parts.append(f"{io.get('bytes', 0) / 1e6:.3g} MB")
    if io.get("read_amplification") is not None:
        parts.append(f"read amplification {io['read_amplification']:.2g}x")
    if io.get("s3fs_requests"):
        parts.append(f"s3fs {int(io['s3fs_requests'])} requests")
    return ", ".join(parts)


def raster_text(raster: RasterStack | None) -> str:
    """The workers' raster stack (``environment.raster``) as one line; "" without."""
    if not isinstance(raster, dict):
        return ""
    versions = ", ".join(f"{k} {raster[k]}" for k in ("gdal", "rasterio", "libcurl")
                         if raster.get(k))
    options = raster.get("options") or {}
    shown = ", ".join(f"{k}={v}" for k, v in options.items()
                      if k.startswith(("GDAL_", "CPL_", "VSI_")))
    return versions + (f"; options: {shown}" if shown else "")
