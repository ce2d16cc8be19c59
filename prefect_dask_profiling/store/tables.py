"""A run's tables as stored: CSV bytes out, checked DataFrames back in."""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import pandas as pd

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.store.errors import DamagedRecord
from prefect_dask_profiling.store.layout import MANIFEST

TASKS_COLUMNS = ["stage", "prefix", "tasks", "total_s", "p50_s", "p95_s", "gb_out"]
# The tasks columns that are empty by design where no task run was timed (a prefix whose
# only runs were reruns, then cancelled): the writer stores no made-up quantile.
QUANTILE_COLUMNS = ("p50_s", "p95_s")
# The columns of a run's tasks table its manifest repeats as ``totals``: what reading a
# history (the drift series) needs of each run, so that it costs one request per run.
TOTALS_COLUMNS = ["stage", "prefix", "tasks", "total_s"]
# Columns read back as text whatever they hold (a stage named "1" stays "1").
NAME_COLUMNS = ("stage", "prefix", "alert", "alert_reason", "worker", "host", "source",
                "destination", "scope", "verdict", "cause")


def encode_files(tables: dict[str, pd.DataFrame],
                 extra_files: dict[str, bytes | str] | None) -> dict[str, bytes]:
    """The run's files by name: each table as ``<name>.csv``, then the extra files.

    ``ValueError`` for a table that is not a DataFrame, an unsafe name, or a name clashing
    with a table or the manifest.
    """
    files: dict[str, bytes] = {}
    for name, frame in tables.items():
        validate_name(name, "table name")
        if not isinstance(frame, pd.DataFrame):
            raise InvalidInput(f"table {name!r} must be a pandas DataFrame")
        files[f"{name}.csv"] = frame.to_csv(index=False).encode()
    for name, data in (extra_files or {}).items():
        validate_name(name, "file name")
        if name == MANIFEST or name in files:
            raise InvalidInput(f"file name {name!r} clashes with a table or the manifest")
        files[name] = data.encode() if isinstance(data, str) else bytes(data)
    return files


def decode_table(data: bytes, name: str, where: str) -> pd.DataFrame:
    """The table stored as ``data`` at ``where``; ``DamagedRecord`` naming ``where`` if damaged.

    Damaged means: not UTF-8, not CSV, empty, or (for ``tasks``) missing columns or holding
    non-numeric, missing or infinite numbers.
    """
    try:
        frame = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=[""],
                            dtype={c: str for c in NAME_COLUMNS}, encoding="utf-8")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError,
            ValueError, TypeError) as exc:
        raise DamagedRecord(f"{where} is not a valid CSV table ({first_line(exc)})") from None
    if name == "tasks":
        check_tasks(frame, where)
    return frame


def check_tasks(frame: pd.DataFrame, where: str) -> None:
    """``DamagedRecord`` unless ``frame`` has the tasks columns with finite numbers.

    The quantiles (:data:`QUANTILE_COLUMNS`) may be empty: the writer leaves them so for a
    prefix with no timed task run (only reruns, then cancelled; a record without sketches).
    Present, they must be finite like every other number.
    """
    missing = [c for c in TASKS_COLUMNS if c not in frame.columns]
    if missing:
        raise DamagedRecord(f"{where} lacks column(s) {', '.join(missing)}")
    if not len(frame):
        return
    numbers = TASKS_COLUMNS[2:]
    for column in numbers:
        if not pd.api.types.is_numeric_dtype(frame[column]):
            raise DamagedRecord(f"{where} has non-numeric values in column {column}")
    values = frame[numbers].to_numpy(dtype=float)
    optional = np.array([c in QUANTILE_COLUMNS for c in numbers])
    finite = (np.isfinite(values) | (np.isnan(values) & optional)).all(axis=0)
    if not finite.all():
        column = numbers[int(np.argmin(finite))]
        raise DamagedRecord(f"{where} has missing or infinite values in column {column}")


def totals_of(data: bytes) -> dict[str, list] | None:
    """The ``totals`` a manifest carries for the tasks table stored as ``data``: its
    :data:`TOTALS_COLUMNS` as lists, the values :func:`decode_table` reads back from ``data``.

    ``None`` when JSON would not give back the same table: an empty or damaged one, or one
    with a missing stage or prefix (read back as ``NaN``). Readers then read the table.
    """
    try:
        frame = decode_table(data, "tasks", "tasks.csv")[TOTALS_COLUMNS]
    except DamagedRecord:
        return None
    if frame.empty or frame[["stage", "prefix"]].isna().to_numpy().any():
        return None
    return {column: frame[column].tolist() for column in TOTALS_COLUMNS}


def decode_totals(totals: Any, where: str) -> pd.DataFrame:
    """The :data:`TOTALS_COLUMNS` of a run's tasks table from the ``totals`` its manifest
    at ``where`` carries (:func:`totals_of`), as :func:`decode_table` would give them.

    ``DamagedRecord`` naming ``where`` unless ``totals`` holds a list per column, all of the
    same non-zero length, text names and finite numbers.
    """
    columns = [totals.get(c) for c in TOTALS_COLUMNS] if isinstance(totals, dict) else []
    if not columns or not all(isinstance(c, list) and c for c in columns) \
            or len({len(c) for c in columns}) != 1:
        raise DamagedRecord(f"{where} has malformed totals (not one list per column of "
                            f"{', '.join(TOTALS_COLUMNS)}, all of one length)")
    names, numbers = columns[:2], columns[2:]
    if not all(isinstance(v, str) for c in names for v in c) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for c in numbers for v in c):
        raise DamagedRecord(f"{where} has totals that are not names and finite numbers")
    return pd.DataFrame({"stage": pd.Series(names[0], dtype=str),
                         "prefix": pd.Series(names[1], dtype=str),
                         "tasks": pd.Series(numbers[0]), "total_s": pd.Series(numbers[1])})


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type name if empty), at most 300 characters."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
