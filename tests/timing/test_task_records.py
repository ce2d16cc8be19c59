"""The task records the stage reports draw (:class:`TaskRecords`): a bounded buffer read by
its append counter, so a window ``[first, last)`` holds exactly its tasks, or an even sample
of them over its whole time with its longest, and says how many it shows."""

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
    [(counter, (key, worker, thread, startstops, status))] = _filled(5, 1).buffer
    assert (counter, key, worker, thread, status) == (0, "t-0", "w", 1, "OK")
    assert startstops[0]["action"] == "compute"


@pytest.mark.parametrize("first, last, size, after, keys", [
    # 10 records of one window, 3 kept: thinned to every 4th (the stride doubles until they
    # fit) and never replaced by later ones; the longest (t-9: 3 // 20 = 0 kept) aside
    (0, 10, 100, 10, ["t-0", "t-4", "t-8"]),
    (5, 10, 100, 10, ["t-8"]),
    (0, 10, 2, 8, ["t-0", "t-4"]),  # one page of 2: read on from t-8
    (9, 9, 100, 9, []),  # an empty window
    (9, 10, 100, 10, []),  # a window whose records were all thinned
])
def test_a_window_reads_exactly_its_records_still_held(first, last, size, after,
                                                       keys) -> None:
    records = _filled(3, 10)
    assert (records.index, records.limit, records.stride) == (10, 3, 4)
    got_after, page = records.page(first, last, size)
    assert got_after == after and _keys(page) == keys


def test_a_limit_of_zero_counts_but_keeps_nothing() -> None:
    records = _filled(0, 4)
    assert records.index == 4 and records.page(0, 4, 10) == (4, [])
    assert TaskRecords(-3).limit == 0


def test_compute_seconds_the_caller_summed_keep_the_same_records() -> None:
    """The plugin passes the compute seconds it summed for the aggregates; the records kept
    through the thinnings are those the buffer keeps when it sums them itself."""
    summed, told = TaskRecords(40), TaskRecords(40)
    for i in range(500):
        seconds = ((i * 7919) % 101) / 10
        kwargs = {"worker": "w", "thread": 1, "status": "OK",
                  "startstops": ({"action": "transfer", "start": 0.0, "stop": 50.0},
                                 {"action": "compute", "start": 0.0, "stop": seconds})}
        summed.add(f"t-{i}", kwargs)
        told.add(f"t-{i}", kwargs, seconds)
    assert summed.stride > 1 and summed.floor > 0  # it thinned, and kept stragglers
    assert list(told.buffer) == list(summed.buffer) and told.floor == summed.floor


def _timed(records: TaskRecords, prefix: str, seconds: list[float]) -> None:
    for i, s in enumerate(seconds):
        records.add(f"{prefix}-{i}", {"worker": "w", "thread": 1, "status": "OK",
                                      "startstops": ({"action": "compute", "start": 0.0,
                                                      "stop": s},)})


def test_a_window_of_a_million_tasks_is_sampled_over_its_whole_time() -> None:
    """Issue 58: 1M tasks through a 40k recorder: bounded, evenly spread from the first to
    about the last, the stragglers kept (on 5beef4d: the last 40k only, none before)."""
    records = TaskRecords(40_000)
    records.mark()
    seconds = [0.05] * 1_000_000
    for straggler in (3, 123_457, 999_000):
        seconds[straggler] = 3.0
    _timed(records, "t", seconds)
    after, page = records.page(0, records.index, 2_000_000)
    assert after == records.index == 1_000_000
    numbers = [int(key.rsplit("-", 1)[1]) for key, *_ in page]
    assert 20_000 <= len(page) <= 40_000
    assert numbers[0] == 0 and numbers[-1] >= 1_000_000 - 2 * records.stride
    gaps = {b - a for a, b in zip(numbers, numbers[1:], strict=False)}
    assert max(gaps) <= records.stride  # no part of the window is missing
    assert {3, 123_457, 999_000} <= set(numbers)  # every straggler is in the picture


def test_earlier_windows_leave_before_the_open_window_is_thinned() -> None:
    records = TaskRecords(10)
    records.mark()
    _timed(records, "a", [0.1] * 6)
    second = records.mark()
    _timed(records, "b", [0.1] * 8)  # 14 > 10: four of the first window's leave, oldest first
    assert records.stride == 1
    assert _keys(records.page(0, second, 100)[1]) == ["a-4", "a-5"]
    assert _keys(records.page(second, records.index, 100)[1]) == [f"b-{i}" for i in range(8)]
    _timed(records, "c", [0.1] * 4)  # the open window itself must now be thinned
    assert records.stride == 2 and records.page(0, second, 100)[1] == []
    assert len(records.buffer) <= 10


def test_a_finished_task_reads_its_stage_once(monkeypatch) -> None:
    """The records and the aggregates share one ``owner_stage`` look-up per finished task
    (it was read twice: once for the records, again for the aggregates)."""
    from types import SimpleNamespace

    from prefect_dask_profiling.timing import TaskTimings
    from prefect_dask_profiling.timing.scope import (
        RUN_ANNOTATION,
        STAGE_ANNOTATION,
        RunScope,
    )

    calls = []
    owner_stage = RunScope.owner_stage

    def counted(self, ts):
        calls.append(ts)
        return owner_stage(self, ts)

    monkeypatch.setattr(RunScope, "owner_stage", counted)
    plugin = TaskTimings("run", owner_client="client", sample_interval=0)
    plugin.tasks.records = TaskRecords(10)
    states = {key: SimpleNamespace(annotations={RUN_ANNOTATION: run, STAGE_ANNOTATION: "s"},
                                   prefix=SimpleNamespace(name=key[:1]), run_id=1,
                                   who_wants=None, waiters=None, state="memory")
              for key, run in (("a-1", "run"), ("b-1", "another run"))}
    plugin.scope.scheduler = SimpleNamespace(tasks=states)
    for key in states:
        plugin.transition(key, "processing", "memory", worker="w", stimulus_id="s",
                          startstops=({"action": "compute", "start": 1.0, "stop": 2.0},))
    assert len(calls) == 2  # one a finished task, its own run's or not
    assert plugin.tasks.records.index == 1  # another run's task is neither recorded
    assert {(r["stage"], r["prefix"]): r["tasks"] for r in plugin.snapshot()["tasks"]} == {
        ("s", "a"): 1}  # nor counted
