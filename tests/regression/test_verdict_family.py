"""A verdict family added from one file: the ``tasks`` family, defined and registered here.

It judges the task count per stage (the manifest's ``stages[].tasks``) against the nights
that count in its own baseline; a count is no timing noise, so one night is conclusive. No
package file names it: registered on the one registry for the test
(:meth:`~prefect_dask_profiling.regression.families.Registry.registered`), it is judged by the
real :func:`~prefect_dask_profiling.run.pipeline.finish_run`, stored in the manifest (its part,
its signals, its table), shown in the run's markdown and by ``dask-profiling check``, and
emits its own event.

Nights are generated records (:meth:`RunRecord.from_snapshot`): one stage ``write`` of 40
tasks computing the same seconds every night; tonight it runs 400 tasks in those seconds,
so time does not move and only the new family can fail the night.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.prefect.artifacts import run_markdown
from prefect_dask_profiling.prefect.events import event_payload, findings
from prefect_dask_profiling.regression import alerts
from prefect_dask_profiling.regression.families import REGISTRY, StageFamily
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.run.pipeline import FinishResult, finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id
from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing.sketch import QuantileSketch

PIPELINE = "counted"
T0 = 1_000_000.0
START = datetime(2026, 11, 1, 2, tzinfo=UTC)
EVENT = "dask-profiling.tasks.detected"


class TaskCountFamily(StageFamily):
    """``tasks-regression`` when a stage ran ``threshold`` times its baseline's median task
    count (at least ``min_history`` baseline nights)."""

    name: ClassVar[str] = "tasks"
    metrics: ClassVar[dict[str, str | None]] = {"task_count": "tasks"}
    baseline: ClassVar[str | None] = "tasks"
    table: ClassVar[str | None] = "task_verdicts"
    json_key: ClassVar[str] = "task_verdicts"
    event: ClassVar[str | None] = EVENT
    flags: ClassVar[tuple[str, ...]] = ("tasks-regression",)
    settings: ClassVar[tuple[str, ...]] = ("threshold", "min_history", "history")
    title: ClassVar[str | None] = "Task counts grew"
    columns: ClassVar[tuple[str, ...]] = ("stage", "metric", "verdict", "baseline", "latest",
                                          "ratio", "n_history")
    policy: ClassVar[tuple[tuple[str, tuple[str, ...], bool], ...]] = (
        ("task_count", ("tasks-regression",), True),)

    def history_size(self, rules: Rules) -> int:
        return rules.regression.history

    def threshold(self, metric: str, rule: RegressionRule) -> float | None:
        return rule.threshold

    def judge_rows(self, manifests: tuple[Mapping[str, Any], ...],
                   tonight: Mapping[str, Any], rule: RegressionRule) -> pd.DataFrame:
        past = [_counts(m) for m in manifests]
        rows = []
        for stage, count in _counts(tonight).items():
            seen = [p[stage] for p in past if stage in p]
            base = float(np.median(seen)) if seen else float("nan")
            ratio = count / base if seen and base > 0 else float("nan")
            flagged = len(seen) >= rule.min_history and ratio >= rule.threshold
            rows.append({"stage": stage, "metric": "task_count",
                         "verdict": "tasks-regression" if flagged else "ok",
                         "baseline": base, "latest": float(count), "ratio": ratio,
                         "n_history": len(seen)})
        return pd.DataFrame(rows, columns=list(self.columns))

    def line(self, row: Any) -> str:
        return f"{row.stage}: {row.latest:.0f} tasks, was {row.baseline:.0f}"

    def describe(self, rows: pd.DataFrame) -> str:
        return "task counts: " + "; ".join(
            f"{r.stage} {r.ratio:.1f}x" for r in rows.itertuples(index=False))


def _counts(manifest: Mapping[str, Any]) -> dict[str, int]:
    """The task count of each stage of a manifest (or of tonight's context)."""
    return {str(s["name"]): int(s["tasks"]) for s in manifest.get("stages") or []
            if isinstance(s, Mapping) and s.get("tasks") is not None}


def night_record(tasks: int) -> RunRecord:
    """One stage ``write`` of ``tasks`` tasks computing 600 s in all (the same every night)."""
    sketch = QuantileSketch()
    for _ in range(tasks):
        sketch.add(600.0 / tasks)
    task = {"sketch": sketch.to_dict(), "stage": "write", "prefix": "store", "tasks": tasks,
            "errors": 0, "reruns": 0, "compute_s": 600.0, "max_s": 600.0 / tasks,
            "p50_s": 600.0 / tasks, "p95_s": 600.0 / tasks, "nbytes": 0, "max_nbytes": 0,
            "transfer_s": 0.0, "disk_read_s": 0.0, "disk_write_s": 0.0,
            "first_start": T0 + 60, "last_stop": T0 + 660}
    life = {"worker": "tcp://10.0.0.1:4000", "name": "w0", "nthreads": 1,
            "memory_limit": 2**30, "arrived": T0, "departed": T0 + 720, "start_known": True}
    return RunRecord.from_snapshot({"name": "t", "started": T0, "collected": T0 + 720,
                                    "tasks": [task], "lifetimes": [life]})


@pytest.fixture
def family() -> Iterator[TaskCountFamily]:
    with REGISTRY.registered(TaskCountFamily()) as registered:
        yield registered
    assert "tasks" not in REGISTRY and "task_count" not in alerts.FAMILIES


def finish(store: RunStore, day: int, tasks: int) -> FinishResult:
    when = START + timedelta(days=day)
    ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="1", started=when)
    return finish_run(store, night_record(tasks), ctx, [],
                      ProfilingOptions(on_regression="warn", check_options={"min_share": 0.0}),
                      ended=when + timedelta(minutes=12), log_warnings=False)


def test_a_family_from_one_test_file_is_judged_stored_shown_checked_and_emitted(
        family, tmp_path) -> None:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    for day in range(4):
        calm = finish(store, day, 40)
        assert calm.status == "healthy", calm.warnings
    assert set(calm.judgement.tasks["verdict"]) == {"ok"}  # judged against 3 nights

    result = finish(store, 4, 400)
    # judged: time did not move, the new family fails the night on its own
    assert set(result.judgement.verdicts["verdict"]) == {"ok"}
    assert result.regressed and result.status == "regressed"
    assert result.judgement.outcome.failing == (("write", "", "task_count"),)
    assert result.judgement.outcome.message == "task counts: write 10.0x"

    # stored: its manifest part, its signal and its table, beside the built-in families'
    manifest = store.read_manifest(PIPELINE, result.run_id)
    assert manifest["tasks"] == {"flagged": ["write: 400 tasks, was 40"]}
    assert {"drift", "memory", "requests", "cost"} <= set(manifest)
    [signal] = [s for s in manifest["signals"] if s["metric"] == "task_count"]
    assert signal["alert"] == "regression" and signal["ratio"] == 10.0
    assert "task_verdicts.csv" in manifest["files"]
    table = store.read_table(PIPELINE, result.run_id, "task_verdicts")
    assert table[["stage", "verdict"]].values.tolist() == [["write", "tasks-regression"]]

    # shown: the run's markdown
    markdown = run_markdown(result, {}, None)
    assert "**Task counts grew:**\n\n- write: 400 tasks, was 40" in markdown

    # emitted: its own event, failing the flow, with the episode's id
    found = findings(result)
    assert set(found) == {EVENT}
    payload = event_payload(result, found[EVENT], {}, None, fails=True)
    [row] = payload["prefixes"]
    assert row["verdict"] == "tasks-regression" and row["episode"] == \
        result.judgement.outcome.episodes[0]

    # checked: the stored night judged again agrees, in words and as JSON
    out = CliRunner().invoke(app, ["check", "--store", store.url, "--run", result.run_id,
                                   "--json"])
    assert out.exit_code == 1, out.output
    data = json.loads(out.stdout)
    assert data["agrees"] and data["tasks"]["flagged"] == ["write: 400 tasks, was 40"]
    assert [r["verdict"] for r in data["task_verdicts"]] == ["tasks-regression"]
    said = CliRunner().invoke(app, ["check", "--store", store.url, "--run", result.run_id])
    assert said.exit_code == 1 and "task counts: write 10.0x" in said.stdout
    assert "flagged (tasks): write: 400 tasks, was 40" in said.stdout

    # the regressed night stays out of the family's baseline: the next night has the 4 calm
    after = finish(store, 5, 40)
    assert after.status == "healthy"
    assert after.judgement.tasks[["verdict", "n_history"]].values.tolist() == [["ok", 4]]


def test_the_registry_refuses_a_taken_name_and_forgets_a_test_family(family) -> None:
    with pytest.raises(Exception, match="new name"):
        REGISTRY.register(TaskCountFamily())
    assert REGISTRY.names()[:5] == ("time", "drift", "memory", "requests", "cost")
    assert REGISTRY.names()[-1] == "tasks" and alerts.FAMILIES["task_count"] == "tasks"
