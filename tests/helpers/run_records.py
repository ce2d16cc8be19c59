"""Real run records for tests of what happens after collection (finishing, store, drift),
and what a store left in the local spool.

One in-process LocalCluster per test session records a small staged job; tests reuse it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import dask.array as da
from distributed import Client

from prefect_dask_profiling import collect, install, stage, uninstall
from prefect_dask_profiling.summary import RunRecord

TIMES = ["compute_s", "p50_s", "p95_s", "max_s"]


def record_stages(client: Client, sizes: dict[str, int]) -> RunRecord:
    """Run one small array job per stage (``{stage: n}`` for an n × 200 array) and collect it.

    The times of a prefix are then the same in every stage (:func:`evened`).

    Each stage's array has a name of its own: two stages of the same size would otherwise
    build the same keys, and where the first stage's results were still held when the second
    was submitted, the scheduler reused them — the second stage then recorded only its
    aggregate (no ``sum`` prefix), and a night built from it could not show a step there."""
    name = install(client)
    try:
        for stage_name, n in sizes.items():
            with client.as_current(), stage(stage_name):
                (da.ones((n, 200), chunks=(50, 50), name=f"ones-{stage_name}") * 2
                 ).sum().compute()
        return evened(collect(client, name))
    finally:
        uninstall(client, name)


def evened(record: RunRecord) -> RunRecord:
    """The record with each prefix's times the same in every stage: the smallest recorded.

    The stages run the same job, and their tasks take microseconds: beside a CPU hog one
    task held off the CPU for tens of milliseconds made one stage's share of the run a
    sixtieth of its twin's, so a generated step of it stayed under the rule's ``min_share``
    and fairly failed nothing, against what the simulation expected of it (seed 11).
    """
    tasks = record.tasks.copy()
    tasks[TIMES] = tasks.groupby("prefix")[TIMES].transform("min")
    return replace(record, tasks=tasks)


# The recorded job takes milliseconds; nightly prefixes take seconds (the rule's floors are
# 0.1 s of spread): a generated night's seconds are the record's times this factor.
SECONDS = 200.0


def scaled(record: RunRecord, factors: dict[str, float] | None = None) -> RunRecord:
    """The record with its task seconds times :data:`SECONDS`, and each stage's times its
    factor: a generated night whose verdicts are known in advance."""
    tasks = record.tasks.copy()
    tasks[TIMES] = tasks[TIMES] * SECONDS
    for stage_name, factor in (factors or {}).items():
        rows = tasks["stage"] == stage_name
        tasks.loc[rows, TIMES] = tasks.loc[rows, TIMES] * factor
    return replace(record, tasks=tasks)


def spooled(spool: Path) -> dict[str, bytes]:
    """``{path relative to the store root: bytes}`` of everything waiting in the spool."""
    out = {}
    for key_dir in spool.iterdir() if spool.is_dir() else ():
        for path in key_dir.rglob("*"):
            if path.is_file() and path.name != "store.json" and not path.name.endswith(".part"):
                out[path.relative_to(key_dir).as_posix()] = path.read_bytes()
    return out
