"""The task records the stage reports draw (:class:`TaskRecords`): a bounded buffer read by
its append counter, so a window ``[first, last)`` holds exactly its tasks or says what left."""

from __future__ import annotations

import pytest

from prefect_dask_profiling.timing.tasks import TaskRecords


def _filled(limit: int, n: int) -> TaskRecords:
    records = TaskRecords(limit)
    for i in range(n):
        records.add(f"t-{i}", {"worker": "w", "thread": 1,
                               "startstops": ({"action": "compute", "start": i, "stop": i + 1},),
                               "status": "OK"})
    return records


def _keys(page: list) -> list[str]:
    return [record[0] for record in page]


def test_a_record_holds_what_the_task_stream_draws() -> None:
    [(key, worker, thread, startstops, status)] = _filled(5, 1).buffer
    assert (key, worker, thread, status) == ("t-0", "w", 1, "OK")
    assert startstops[0]["action"] == "compute"


@pytest.mark.parametrize("first, last, size, oldest, keys", [
    (0, 10, 100, 7, ["t-7", "t-8", "t-9"]),  # the first 7 left: never replaced by later ones
    (8, 10, 100, 7, ["t-8", "t-9"]),
    (7, 10, 2, 7, ["t-7", "t-8"]),  # one page of 2
    (9, 9, 100, 7, []),  # an empty window
    (0, 5, 100, 7, []),  # a window whose records all left
])
def test_a_window_reads_exactly_its_records_still_held(first, last, size, oldest,
                                                       keys) -> None:
    records = _filled(3, 10)
    assert (records.index, records.limit) == (10, 3)
    got_oldest, page = records.page(first, last, size)
    assert got_oldest == oldest and _keys(page) == keys


def test_a_limit_of_zero_counts_but_keeps_nothing() -> None:
    records = _filled(0, 4)
    assert records.index == 4 and records.page(0, 4, 10) == (4, [])
    assert TaskRecords(-3).limit == 0
