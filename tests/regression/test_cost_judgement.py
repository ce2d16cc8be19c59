"""``cost_regression``: idle worker-hours judged like storage requests, through the real
judge and :func:`~prefect_dask_profiling.run.pipeline.finish_run` on a local store.

Nights are generated records (:meth:`RunRecord.from_snapshot`): one stage ``write`` of an
hour whose tasks compute 2,160 thread-seconds; on a calm night one single-thread worker holds
it (0.40 worker-hours idle, jittered by a few percent), on an idle night three more workers
stay for 54 of its 60 minutes (3.10 worker-hours idle, as in the issue). The task times are
the same, so time never regresses: only the idle verdict can fail a night.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression.judge import judge_stored
from prefect_dask_profiling.regression.rule import RegressionRule
from prefect_dask_profiling.run.pipeline import FinishResult, finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing.sketch import QuantileSketch

PIPELINE = "costly"
T0 = 1_000_000.0
HOUR = 3600.0
START = datetime(2026, 11, 1, 2, tzinfo=UTC)
TEXT = "stage write: 3.10 worker-hours idle, was 0.40"


def _task(compute_s: float) -> dict:
    sketch = QuantileSketch()
    for _ in range(40):
        sketch.add(compute_s / 40)
    return {"sketch": sketch.to_dict(), "stage": "write", "prefix": "store", "tasks": 40,
            "errors": 0, "reruns": 0,
            "compute_s": compute_s, "max_s": compute_s / 40, "p50_s": compute_s / 40,
            "p95_s": compute_s / 40, "nbytes": 0, "max_nbytes": 0,
            "transfer_s": 0.0, "disk_read_s": 0.0, "disk_write_s": 0.0,
            "first_start": T0 + 60, "last_stop": T0 + 60 + HOUR}


def _life(name: str, arrived: float, departed: float) -> dict:
    return {"worker": f"tcp://10.0.0.1:{4000 + int(name[1:])}", "name": name, "nthreads": 1,
            "memory_limit": 2**30, "arrived": arrived, "departed": departed,
            "start_known": True}


def night_record(idle: bool, jitter: float = 1.0) -> RunRecord:
    """A night: calm (0.40 worker-hours idle x ``jitter``) or idle (3.10)."""
    busy = HOUR - 0.4 * HOUR * jitter if not idle else 2160.0
    lives = [_life("w0", T0, T0 + 2 * 60 + HOUR)]
    if idle:  # the adaptive scale-down did not happen: 3 more workers stay 54 minutes
        lives += [_life(f"w{i}", T0 + 60, T0 + 60 + 3240.0) for i in (1, 2, 3)]
    return RunRecord.from_snapshot({"name": "t", "started": T0, "collected": T0 + 2 * 60 + HOUR,
                                    "tasks": [_task(busy)], "lifetimes": lives})


class Nights:
    """Finish generated nights one day apart on one store."""

    def __init__(self, tmp_path, cost_regression: str) -> None:
        self.store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
        self.settings = ProfilingOptions(on_regression="warn", check_options={"min_share": 0.0},
                                         cost_regression=cost_regression)
        self.day = 0
        self.jitter = iter([1.0, 0.96, 1.04, 0.98, 1.02] * 4)  # median 1: "was 0.40"

    def run(self, idle: bool = False) -> tuple[FinishResult, dict]:
        when = START + timedelta(days=self.day)
        self.day += 1
        ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="1",
                         started=when)
        record = night_record(idle, next(self.jitter))
        result = finish_run(self.store, record, ctx, [], self.settings,
                            ended=when + timedelta(hours=1), log_warnings=False)
        return result, self.store.read_manifest(PIPELINE, ctx.run_id)

    def baseline(self, nights: int = 5) -> None:
        for _ in range(nights):
            result, _ = self.run()
            assert result.status == "healthy", result.warnings


def test_warn_names_the_stage_and_never_fails(tmp_path) -> None:
    nights = Nights(tmp_path, "warn")
    nights.baseline()
    for _ in range(2):  # idle two nights in a row: informational every night
        result, manifest = nights.run(idle=True)
        assert not result.regressed and result.status == "healthy"
        [text] = manifest["cost"]["flagged"]
        assert text.startswith(TEXT) and "adaptive scale-down" in text
        assert manifest["cost"]["mode"] == "warn" and manifest["cost"]["failing"] == []
        assert any(w.startswith("idle grew (informational): " + TEXT) for w in result.warnings)
        assert not [s for s in manifest["signals"] if s["metric"] == "idle_hours"]
        assert manifest["outcome"]["failing"] == []
    from prefect_dask_profiling.prefect.artifacts import run_markdown

    markdown = run_markdown(result, {}, None)
    assert "(informational):**" in markdown and "fails the run" not in markdown


def test_fail_fails_on_the_confirmed_night(tmp_path) -> None:
    nights = Nights(tmp_path, "fail")
    nights.baseline()
    first, manifest = nights.run(idle=True)  # one night is never conclusive
    assert not first.regressed and first.status == "suspected"
    assert [s["alert"] for s in manifest["signals"] if s["metric"] == "idle_hours"] \
        == ["suspected"]
    assert any(w.startswith("idle grew (one night: the next run confirms or clears it): "
                            + TEXT) for w in first.warnings)
    second, manifest = nights.run(idle=True)
    assert second.regressed and second.status == "regressed"
    assert manifest["outcome"]["failing"] == ["write//idle_hours"]
    assert "idle resources: " + TEXT in manifest["outcome"]["message"]
    assert manifest["cost"]["failing"] == ["write/idle_hours"]
    [event] = [e for e in manifest["outcome"]["events"] if e["event"].endswith(".detected")]
    assert event["episode"]["metric"] == "idle_hours"
    assert event["episode"]["stage"] == "write"
    assert any(w.startswith("idle grew (fails the run): " + TEXT) for w in second.warnings)
    from prefect_dask_profiling.prefect.artifacts import run_markdown

    markdown = run_markdown(second, {}, None)
    assert "a confirmed idle regression fails the run" in markdown
    assert f"- {TEXT}" in markdown and "— **fails the run**" in markdown
    # ``check`` judges the stored night again to the same outcome (its rules are stored)
    again = judge_stored(nights.store, PIPELINE, manifest["run_id"])
    assert again.agrees and again.judgement.regressed
    assert again.judgement.rules.regression.cost_regression == "fail"


def test_a_one_night_blip_does_not_fail_and_gives_its_night_back(tmp_path) -> None:
    nights = Nights(tmp_path, "fail")
    nights.baseline()
    blip, blip_manifest = nights.run(idle=True)
    assert blip.status == "suspected" and not blip.regressed
    calm, manifest = nights.run()
    assert not calm.regressed and calm.status == "healthy"
    assert [e["event"].rsplit(".", 1)[1] for e in manifest["outcome"]["events"]] \
        == ["cleared"]
    # the cleared night counts in the baselines again
    after, manifest = nights.run()
    assert after.status == "healthy"
    assert blip_manifest["run_id"] in manifest["baseline"]["runs"]


def test_off_judges_nothing_and_bad_modes_are_refused(tmp_path) -> None:
    nights = Nights(tmp_path, "off")
    nights.baseline(3)
    result, manifest = nights.run(idle=True)
    assert not result.regressed and manifest["cost"]["flagged"] == []
    with pytest.raises(ValueError, match="cost_regression"):
        RegressionRule(cost_regression="loud")
    with pytest.raises(ValueError, match="cost_regression"):
        ProfilingOptions(cost_regression="loud")
    assert "cost_regression" not in RegressionRule().check_options()
