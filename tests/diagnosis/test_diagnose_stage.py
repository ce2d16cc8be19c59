"""Per-stage diagnoses from a real profiled run: the same classifier as the bench, fed from
the run record (task aggregates, worker CPU samples, memory, transfers)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from distributed import Client, LocalCluster, wait
from helpers.tiers import starts_processes

from prefect_dask_profiling import collect, install, stage, uninstall
from prefect_dask_profiling.diagnosis.stages import Diagnosis, diagnose_run, diagnose_stage

pytestmark = pytest.mark.slow


def wait_on_service(i: int) -> int:
    """A task that waits on a (simulated) remote service: 5 calls of 60 ms."""
    for _ in range(5):
        time.sleep(0.06)
    return i


def spin(steps: int) -> int:
    total = 0
    for i in range(steps):
        total = (total * 31 + i) % 1_000_003
    return total


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def record():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        name = install(client, sample_interval=0.25)
        try:
            with client.as_current(), stage("wait"):
                wait(client.map(wait_on_service, range(16)))
            with client.as_current(), stage("skew"):
                futures = client.map(spin, [20_000] * 24 + [3_000_000], pure=False)
                wait(futures)
            del futures
            yield collect(client, name)
        finally:
            uninstall(client, name)


def test_waiting_stage_is_io_with_process_cpu_evidence(record):
    d = diagnose_stage(record, "wait")
    assert d.primary == "io", d.note
    sources = {s["source"] for s in d.signals if s["supports"]}
    assert {"task records", "process CPU"} <= sources
    assert d.confidence in ("medium", "high")
    assert "threads per worker" in d.actions[0]


def test_one_long_task_stage_is_a_straggler_naming_its_prefix(record):
    d = diagnose_stage(record, "skew")
    assert d.primary == "straggler", d.note
    assert any(s["signal"] == "tasks.task_skew" and s["supports"] for s in d.signals)
    assert "spin" in d.actions[0]


def test_every_stage_is_diagnosed_and_round_trips_through_the_manifest(record):
    diagnoses, warnings = diagnose_run(record)
    assert set(diagnoses) == {"wait", "skew"} and warnings == []
    for name, d in diagnoses.items():
        stored = d.to_dict()
        assert {"primary", "secondary", "confidence", "signals"} <= set(stored)
        assert all({"signal", "source", "value"} <= set(s) for s in stored["signals"])
        assert Diagnosis.from_dict(stored) == d
        assert name in (d.stage,)


def test_old_and_odd_stored_diagnoses_still_load():
    assert Diagnosis.from_dict(None) is None  # a run stored before diagnoses existed
    assert Diagnosis.from_dict({}) is None
    d = Diagnosis.from_dict({"primary": "io", "future_key": 1}, stage="read")
    assert d.stage == "read" and d.confidence == "low" and d.signals == []
    assert d.summary().startswith("io (low")


def test_bad_input_is_a_clear_error(record):
    with pytest.raises(ValueError, match="stage 'nope' has no tasks.*wait"):
        diagnose_stage(record, "nope")
    with pytest.raises(ValueError, match="unknown bottleneck class.*'disk'"):
        diagnose_stage(record, "wait", classes=["disk"])


def test_a_record_without_samples_still_gets_a_verdict(record):
    import copy

    bare = copy.copy(record)
    bare.samples = record.samples.iloc[0:0]
    d = diagnose_stage(bare, "wait")
    assert not any(s["source"] == "process CPU" for s in d.signals)
    assert d.primary  # absent signals are skipped, never a crash


# -- wired into the end of a run: stored per stage, explained on a regression ---------------


def test_finish_stores_a_diagnosis_per_stage_and_explains_a_regression(record, tmp_path):
    import copy

    from prefect_dask_profiling.run.pipeline import finish_run
    from prefect_dask_profiling.store.manifest import RunContext
    from prefect_dask_profiling.store.runs import RunStore

    store = RunStore(str(tmp_path))
    env = {"python": "3.11.7", "dask": "2026.8.0", "mismatches": []}
    nights = iter(range(1, 10))

    def finish(rec, env_):
        # one run per night: ids order the runs even when the test runs within a second
        run_id = f"202611{next(nights):02d}T020000Z-abcdef"
        ctx = RunContext(run_id=run_id, pipeline="nightly", version="1")
        return finish_run(store, rec, ctx, [], env=env_)

    for _ in range(4):
        first = finish(record, env)
    stages = {s["name"]: s for s in first.manifest["stages"]}
    assert stages["wait"]["diagnosis"]["primary"] == "io"
    assert stages["skew"]["diagnosis"]["primary"] == "straggler"
    stored = store.read_manifest("nightly", first.run_id)
    assert {s["name"]: s["diagnosis"]["primary"] for s in stored["stages"]} == {
        "wait": "io", "skew": "straggler"}

    slow = copy.copy(record)  # the same work, 4x slower in the "wait" stage
    slow.tasks = record.tasks.copy()
    wait_rows = slow.tasks["stage"] == "wait"
    for col in ("compute_s", "p50_s", "p95_s", "max_s"):
        slow.tasks.loc[wait_rows, col] *= 4
    result = finish(slow, {**env, "dask": "2026.9.0"})
    assert result.regressed, result.verdicts
    why = result.manifest["explanations"]["wait"]
    assert why["bottleneck"]["now"] == "io" and why["bottleneck"]["was"] == "io"
    assert any(c["what"] == "dask (client)" for c in why["context"])
    assert "wait" in why["text"] and "slower" in why["text"]
    # shown in the summary artifact, the regression table, `show` and `check`
    from typer.testing import CliRunner

    from prefect_dask_profiling.cli import app
    from prefect_dask_profiling.prefect.artifacts import regression_rows, run_markdown

    markdown = run_markdown(result, {}, None)
    assert "| wait |" in markdown and "io (" in markdown and "Why wait regressed" in markdown
    rows = regression_rows(result)
    assert any(r["why"].startswith("wait ") for r in rows if r["verdict"] == "regression")
    shown = CliRunner().invoke(app, ["show", result.run_id, "--store", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "bottleneck wait: io (" in shown.stdout and "why wait: wait" in shown.stdout
    checked = CliRunner().invoke(app, ["check", "--run", result.run_id, "--store",
                                       str(tmp_path), "--json"])
    assert checked.exit_code == 1, checked.output  # regressed
    doc = json.loads(checked.stdout[checked.stdout.index("{"):])
    assert doc["explanations"]["wait"]["bottleneck"]["now"] == "io"
    old = CliRunner().invoke(app, ["show", first.run_id, "--store", str(tmp_path)])
    assert "bottleneck skew: straggler" in old.stdout


# -- transfers belong to the stage whose tasks received them ----------------------------------


def big_block(seed: int):
    import numpy as np

    return np.full(1_000_000, float(seed))  # 8 MB: a bandwidth-bound payload


def combine(a, b) -> float:
    return float(a.sum() + b.sum())


def idle_wait(i: int) -> int:
    time.sleep(0.2)
    return i


def small_block():
    import numpy as np

    return np.ones(1000)  # 8 KB


def slow_use(block, i: int) -> float:
    spin(300_000)
    return float(block.sum()) + i


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def moving_record():
    """Stage ``shuffle`` moves 8 MB payloads between two workers; stage ``quiet`` moves nothing
    and leaves one of the two workers idle (busy fraction about 0.5)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      host="127.0.0.1", dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        first, second = sorted(client.scheduler_info()["workers"])
        name = install(client, sample_interval=0.25)
        try:
            with client.as_current(), stage("shuffle"):
                pairs = [(client.submit(big_block, i, workers=[first], pure=False),
                          client.submit(big_block, -i, workers=[second], pure=False))
                         for i in range(3)]
                wait([client.submit(combine, a, b, workers=[first], pure=False)
                      for a, b in pairs])
            with client.as_current(), stage("quiet"):
                wait(client.map(idle_wait, range(6), workers=[first], pure=False))
            with client.as_current(), stage("light"):
                # a little transfer time: small inputs made on the other worker
                small = client.submit(small_block, workers=[second], pure=False)
                wait([client.submit(slow_use, small, i, workers=[first], pure=False)
                      for i in range(4)])
            del pairs, small
            yield collect(client, name)
        finally:
            uninstall(client, name)


def test_a_stage_that_moved_nothing_gets_no_run_wide_transfer_figures(moving_record):
    from prefect_dask_profiling.diagnosis.stages import stage_signals

    assert moving_record.transfers["bytes"].sum() >= 3 * 8e6  # the run did move payloads
    # the stage that did all of the run's receiving owns the run's transfer log
    alone = dataclasses.replace(moving_record, tasks=moving_record.tasks[
        moving_record.tasks["stage"] != "light"])
    moved = stage_signals(alone, "shuffle")
    assert moved["transfer.mb_per_transfer"] >= 0.5
    assert moved["transfer.mb_moved"] >= 8.0
    quiet = stage_signals(moving_record, "quiet")
    assert quiet["transfer.mb_moved"] == 0.0 and quiet["transfer.mb_per_transfer"] == 0.0
    d = diagnose_stage(moving_record, "quiet")
    assert d.primary != "transfer", d.note
    assert "transfer" not in (d.secondary or "")


def test_a_stage_with_a_little_transfer_time_gets_no_run_wide_payload_size(moving_record):
    """Issue 35: the read stage was transfer (low) on the run's 4.49 MB per transfer with 1%
    of its time in transfers. A stage that did part of the run's receiving has no payload
    size of its own in the record: it gets none, and transfer cannot be chosen under the
    floor of its transfer share."""
    from prefect_dask_profiling.diagnosis.classify import MIN_TRANSFER_SHARE
    from prefect_dask_profiling.diagnosis.stages import stage_signals

    light = stage_signals(moving_record, "light")
    assert light["tasks.transfer_share"] > 0  # it did receive a little
    assert "transfer.mb_per_transfer" not in light and "transfer.mb_moved" not in light
    shuffle = stage_signals(moving_record, "shuffle")  # no longer the only receiver
    assert "transfer.mb_per_transfer" not in shuffle
    for name in ("light", "quiet"):
        d = diagnose_stage(moving_record, name)
        assert d.primary != "transfer", d.note
    assert light["tasks.transfer_share"] < 1  # and below the floor it is ruled out:
    gate = classify_light(light)["scores"]["transfer"]["gate"]
    assert light["tasks.transfer_share"] >= MIN_TRANSFER_SHARE or "under the floor" in gate


def classify_light(signals: dict) -> dict:
    from prefect_dask_profiling.diagnosis.classify import classify

    return classify(signals)
