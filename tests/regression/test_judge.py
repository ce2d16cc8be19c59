"""The one judgement of a night (``regression/judge.py``): finish, check and drift agree.

Nights are finished through :func:`finish_run` on records derived from one real record (a
real in-process LocalCluster): each night scales the recorded task seconds per stage, so the
verdicts are known in advance. ``dask-profiling check --json`` then judges each stored run
again, as a user would, and must find the outcome the run stored.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from helpers.run_records import record_stages, scaled
from typer.testing import CliRunner

import prefect_dask_profiling.run.pipeline as finishing
from prefect_dask_profiling.cli import app
from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression.baseline import Baseline
from prefect_dask_profiling.regression.drift import drifted
from prefect_dask_profiling.regression.judge import History, Tonight, judge
from prefect_dask_profiling.regression.judged import FamilyRead
from prefect_dask_profiling.regression.rule import DriftRule, RegressionRule, Rules
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.manifest import RunContext, RunKey
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPELINE = "nightly"
LOOSE = {"min_seconds": 0.0, "min_share": 0.0}


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def night(store: RunStore, record, when: datetime, settings: ProfilingOptions | None = None,
          **kwargs):
    ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="1", started=when)
    kwargs.setdefault("ended", when + timedelta(hours=1))
    return finish_run(store, record, ctx, [],
                      settings or ProfilingOptions(on_regression="warn", check_options=LOOSE),
                      **kwargs)


def check(store: RunStore, *args: str):
    out = CliRunner().invoke(app, ["check", "--store", store.url, *args, "--json"])
    assert out.exit_code in (0, 1, 5), out.output
    return out.exit_code, json.loads(out.stdout)


@pytest.mark.slow  # > 10 s
def test_every_stored_run_is_judged_again_to_its_stored_outcome(record, tmp_path, monkeypatch):
    """Healthy, regressed, failed, custom-rule and unjudged nights: ``check`` agrees with
    what each run stored (the rules it was judged with are read back from its manifest)."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    rng = np.random.default_rng(7)
    results = []
    for n in range(6):  # a healthy baseline
        results.append(night(store, scaled(record, {"read": 1 + rng.uniform(-.1, .1)}),
                             start + timedelta(days=n)))
    slow = scaled(record, {"read": 4.0})
    # the strict night before the regressed one: after it, it would confirm what the
    # regressed night only suspected (a small prefix, by its timing) and count as regressed
    strict = ProfilingOptions(on_regression="warn", threshold=5.0, check_options=LOOSE)
    strict_night = night(store, slow, start + timedelta(days=6), strict)  # 4x < 5x: healthy
    results.append(night(store, slow, start + timedelta(days=7)))  # regressed
    results.append(night(store, slow, start + timedelta(days=8),
                         error=RuntimeError("the flow body failed")))  # failed: never counts
    results.append(strict_night)
    monkeypatch.setattr(finishing, "STEPS", [(n, s) for n, s in finishing.STEPS
                                             if n != "history"])
    unjudged = night(store, scaled(record), start + timedelta(days=9))
    monkeypatch.undo()
    assert [r.status for r in results] == ["healthy"] * 6 + ["regressed", "failed", "healthy"]
    assert unjudged.status == "unjudged"
    for result in results:
        code, data = check(store, "--run", result.run_id)
        assert data["agrees"] and data["regressed"] == result.regressed, data
        assert code == (1 if result.regressed else 0)
        assert data["rules"] == result.manifest["rules"]
    assert data["rules"]["regression"]["threshold"] == 5.0  # the strict night's own rules
    code, data = check(store, "--run", results[-1].run_id, "--threshold", "2")
    assert code == 1 and data["regressed"]  # told otherwise, check judges otherwise
    code, data = check(store, "--run", unjudged.run_id)
    assert code == 5 and data["status"] == "unjudged" and not data["agrees"]  # not looked


@pytest.mark.slow  # > 10 s
def test_check_and_drift_commands_see_drift(record, tmp_path):
    """A night that failed for drift (no one-night regression) fails ``check`` too."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    for n in range(11):
        result = night(store, scaled(record, {"read": 1.12 ** n}), start + timedelta(days=n))
    assert result.regressed and result.judgement.flagged_rows("time").empty
    assert not drifted(result.judgement.drift, failing_only=True).empty
    failing = [f"{r.stage}/{r.prefix}" for r in
               drifted(result.judgement.drift, failing_only=True).itertuples()]
    assert failing and all(name.startswith("read/") for name in failing)
    code, data = check(store, "--run", result.run_id)
    assert code == 1 and data["agrees"] and data["drift"]["failing"] == failing
    out = CliRunner().invoke(app, ["drift", "--store", store.url, "--json"])
    assert out.exit_code == 1, out.output
    assert json.loads(out.stdout)["failing"] is True


@pytest.mark.slow  # > 10 s
def test_a_threshold_below_the_drift_ratio_lowers_it_instead_of_switching_drift_off(
        record, tmp_path):
    rules = Rules.from_options(threshold=1.3)
    assert rules.drift.min_ratio == 1.3 and rules.regression.threshold == 1.3
    assert Rules(RegressionRule(threshold=3.0), DriftRule(min_ratio=1.8)).drift.min_ratio == 1.8
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    settings = ProfilingOptions(on_regression="warn", threshold=1.3, check_options=LOOSE)
    for n in range(11):
        result = night(store, scaled(record, {"read": 1.06 ** n}), start + timedelta(days=n),
                       settings)
    assert not any("step failed" in w for w in result.warnings), result.warnings
    assert not drifted(result.judgement.drift).empty  # 1.06^10 = 1.8x: drift at threshold 1.3
    out = CliRunner().invoke(app, ["drift", "--store", store.url, "--threshold", "1.3"])
    assert out.exit_code in (0, 1, 5), out.output  # a verdict, never "this is a bug" (exit 3)


def test_overlapping_runs_are_each_judged_as_themselves():
    """Tonight's drift rows are tonight's, even when another run of the pipeline started
    later (and so sorts after it by ``started``)."""
    days = [datetime(2026, 11, d, 2, tzinfo=UTC).isoformat() for d in range(1, 12)]
    rows = [{"run_id": f"r{d:02d}", "started": days[d], "stage": "read", "prefix": "load",
             "tasks": 10, "total_s": 10.0 * 1.12 ** d} for d in range(10)]
    series = pd.DataFrame(rows)
    later = pd.DataFrame([{"run_id": "r99", "started": days[10], "stage": "read",
                           "prefix": "load", "tasks": 10, "total_s": 30.0}])
    history = History(Baseline(series[["run_id", "stage", "prefix", "tasks", "total_s"]],
                               [f"r{d:02d}" for d in range(10)], "1"),
                      {"drift": FamilyRead(pd.concat([series, later], ignore_index=True))})
    tonight = Tonight(RunKey("r10", PIPELINE, "1"), started=days[9],
                      summary=pd.DataFrame([{"stage": "read", "prefix": "load", "tasks": 10,
                                             "total_s": 31.0}]))
    judgement = judge(tonight, history, Rules.from_options(check_options=LOOSE))
    [row] = judgement.drift.to_dict("records")
    assert row["latest_s"] == 31.0 and row["series"][-1] == 31.0
    assert row["verdict"] == "drift"


def test_a_failing_fleet_step_reaches_the_manifest(record, tmp_path, monkeypatch):
    def broken(end) -> None:
        raise OSError("fleet view unwritable")

    monkeypatch.setattr(finishing, "FINAL", [("fleet", broken)])
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    result = night(store, scaled(record), datetime.now(UTC))
    manifest = store.read_manifest(PIPELINE, result.run_id)
    assert any("fleet step failed" in w and "unwritable" in w for w in manifest["warnings"])


class FinalWriteFails(RunStore):
    """A store whose final write raises, once told to (a bug or a store error escaping the
    store)."""

    broken = False

    def complete_run(self, *args, **kwargs):
        if self.broken:
            raise PermissionError("403 Forbidden at the final write")
        return super().complete_run(*args, **kwargs)


def test_a_final_write_that_raises_keeps_the_judgement(record, tmp_path):
    """The verdict survives: the caller still fails the flow on it (issue 19, item 1)."""
    store = FinalWriteFails(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    start = datetime(2026, 11, 1, 2, tzinfo=UTC)
    for n in range(4):
        night(store, scaled(record), start + timedelta(days=n))
    store.broken = True
    result = night(store, scaled(record, {"read": 5.0}), start + timedelta(days=4))
    assert result.regressed and result.judgement is not None
    assert "read/" in result.failure_message
    assert any("final write" in w and "403" in w for w in result.warnings)
