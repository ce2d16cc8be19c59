"""How a run ends in ``finish_run``: the flow's final state decides, a failed final write
warns once (issue 33, defects 8 and 11).

Nights are finished through :func:`finish_run` on records derived from one real record (a
real in-process LocalCluster) whose task seconds are scaled per stage, so the verdict of
each night is known in advance.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
from helpers.run_records import record_stages, scaled

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.prefect.events import findings
from prefect_dask_profiling.run.pipeline import finish_run
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPELINE = "ending"
LOOSE = ProfilingOptions(check_options={"min_seconds": 0.0, "min_share": 0.0})
START = datetime(2026, 11, 1, 2, tzinfo=UTC)


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def night(store: RunStore, record, n: int, **kwargs):
    when = START + timedelta(days=n)
    ctx = RunContext(run_id=new_run_id(when), pipeline=PIPELINE, version="1", started=when)
    kwargs.setdefault("ended", when + timedelta(hours=1))  # nights that do not overlap
    return finish_run(store, record, ctx, [], LOOSE, **kwargs)


def healthy_history(store: RunStore, record, nights: int = 4) -> None:
    for n in range(nights):
        assert night(store, scaled(record), n).status == "healthy"


@pytest.mark.parametrize("state", ["FAILED", "CRASHED", "CANCELLED", "RUNNING"])
def test_a_flow_whose_final_state_is_not_completed_is_never_regressed(record, tmp_path,
                                                                       state):
    """The runner's exit path: Prefect caught the flow's exception, so ``error`` is None and
    only the final state says the flow failed (``RUNNING``: an attempt that Prefect will
    retry). A 5x slower night is stored ``failed``, its flagged prefixes do not count and no
    detection event would be emitted."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    healthy_history(store, record)
    result = night(store, scaled(record, {"read": 5.0}), 5, state=state)
    assert not result.regressed
    assert result.status == "failed"
    assert findings(result) == {}  # no regression.detected (nor any other detection)
    manifest = store.read_manifest(PIPELINE, result.run_id)
    assert (manifest["status"], manifest["state"], manifest["regressed"]) == (
        "failed", state, False)
    # and it stays out of the next night's baseline, which still judges a slow night
    later = night(store, scaled(record, {"read": 5.0}), 6)
    assert later.regressed and result.run_id not in later.manifest["baseline"]["runs"]


def test_a_completed_final_state_is_judged(record, tmp_path):
    """The same slow night with ``state="COMPLETED"`` (a flow that forgot ``finish()`` and
    completed) is judged as usual."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    healthy_history(store, record)
    result = night(store, scaled(record, {"read": 5.0}), 5, state="COMPLETED")
    assert result.regressed and result.status == "regressed"


def test_the_attempt_is_in_the_manifest_and_the_index(record, tmp_path):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    ctx = RunContext(run_id=new_run_id(START), pipeline=PIPELINE, version="1", started=START,
                     flow_run_id="0" * 32, attempt=2)
    result = finish_run(store, scaled(record), ctx, [], LOOSE,
                        ended=START + timedelta(hours=1))
    assert store.read_manifest(PIPELINE, result.run_id)["attempt"] == 2
    [marker] = (tmp_path / "store" / "index" / PIPELINE).rglob(f"{result.run_id}.*")
    listed = json.loads(marker.read_text())  # a listing shows it without the manifest
    assert listed["attempt"] == 2 and listed["flow_run_id"] == "0" * 32


class FinalWriteFails(RunStore):
    """A store whose final write raises (a bug or a store error escaping the store)."""

    broken = False

    def complete_run(self, *args, **kwargs):
        if self.broken:
            raise PermissionError("403 Forbidden at the final write")
        return super().complete_run(*args, **kwargs)


@pytest.mark.parametrize("log_warnings", [True, False], ids=["logs", "caller-logs"])
def test_a_failed_final_write_warns_once(record, tmp_path, caplog, log_warnings):
    """Once in the result's warnings; logged once by ``finish_run`` (or, with
    ``log_warnings=False``, left to the caller, which logs the result's warnings)."""
    store = FinalWriteFails(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    store.broken = True
    with caplog.at_level(logging.DEBUG):
        result = night(store, scaled(record), 0, **({} if log_warnings else
                                                    {"log_warnings": False}))
    about = [w for w in result.warnings if "final write" in w]
    assert len(about) == 1 and "403" in about[0], result.warnings
    logged = [r for r in caplog.records
              if "final write" in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(logged) == (1 if log_warnings else 0), [r.getMessage() for r in logged]
