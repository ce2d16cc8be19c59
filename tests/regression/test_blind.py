"""The unjudged streak (regression.blind): generated status sequences and a real local store."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from prefect_dask_profiling.regression.blind import (
    BLIND_AFTER_NIGHTS,
    JUDGEABLE,
    blindness,
    unjudged_streak,
)
from prefect_dask_profiling.store.manifest import RunKey
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, new_run_id

STATUSES = sorted(JUDGEABLE | {"failed", "incomplete"})


@given(st.lists(st.sampled_from(STATUSES), max_size=40))
def test_the_streak_counts_leading_unjudged_nights_and_skips_failed_ones(statuses):
    completed = [s for s in statuses if s in JUDGEABLE]
    expected = next((i for i, s in enumerate(completed) if s != "unjudged"), len(completed))
    assert unjudged_streak(statuses) == expected


def put(store: RunStore, day: int, status: str) -> str:
    run_id = new_run_id(datetime(2026, 11, day, 2, tzinfo=UTC))
    tasks = pd.DataFrame([{"stage": "s", "prefix": "p", "tasks": 1, "total_s": 1.0,
                           "p50_s": 1.0, "p95_s": 1.0, "gb_out": 0.0}], columns=TASKS_COLUMNS)
    store.write_run("blind", run_id, {"tasks": tasks},
                    {"version": "1", "status": status,
                     "state": "FAILED" if status == "failed" else "COMPLETED"})
    return run_id


def test_a_stored_history_gives_tonights_streak(tmp_path):
    store = RunStore(str(tmp_path / "store"))
    for day, status in enumerate(["healthy", "unjudged", "failed", "unjudged"], start=1):
        put(store, day, status)
    tonight = new_run_id(datetime(2026, 11, 9, 2, tzinfo=UTC))
    blind = blindness(store, RunKey(tonight, "blind", "1"), "history unavailable: 503")
    assert blind.streak == 3 and blind.alerting and BLIND_AFTER_NIGHTS <= 3
    assert "3 nights in a row" in blind.message("blind", "1")
    assert blind.fix == f"dask-profiling check --pipeline blind --run {tonight}"
    first_night = new_run_id(datetime(2026, 11, 1, 1, tzinfo=UTC))  # before every night
    assert blindness(store, RunKey(first_night, "blind", "1"), None).streak == 1


def test_a_store_that_cannot_list_counts_tonight_alone(tmp_path):
    store = RunStore(str(tmp_path / "none"))
    blind = blindness(store, RunKey(new_run_id(), "blind", "1"), "store down")
    assert blind.streak == 1 and not blind.alerting
