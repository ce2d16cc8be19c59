"""Issue 56: every paged episode can be acknowledged and resolved; tonight's rules confirm.

Each test drives the real ``finish_run`` (its three seams, ``night_sim.Driver``) on a real
local-folder store with the smallest sequence of generated nights that shows one defect
(defects 4 and 8, and item 9's stage-absent and acknowledged-status defects). A night runs
02:00-03:00 UTC on its day unless it says otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest
from night_sim import Driver, NightRun, NightSpec
from run_records import record_stages

from prefect_dask_profiling.finishing import FinishSettings
from prefect_dask_profiling.store.runs import RunStore

pytestmark = pytest.mark.slow  # generated nights through finish_run: > 10 s a test


@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


def driver(record, tmp_path, store: RunStore | None = None, threshold: float = 2.0,
           **rule) -> Driver:
    """A driver on ``tmp_path``'s store (or ``store``) judging with ``rule``."""
    store = store or RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    return Driver(store, record, FinishSettings(threshold=threshold, check_options=rule))


def quiet(day: int, seed: int = 0, **kwargs) -> NightSpec:
    """A healthy night: every prefix within +-5% of its level, times ``factors``."""
    rng = np.random.default_rng(5600 + day + seed)
    factors = {(s, p): rng.uniform(0.95, 1.05) for s in ("read", "reduce")
               for p in ("sum", "sum-partial")}
    extra = kwargs.pop("factors", {})
    return NightSpec(day=day, kind=kwargs.pop("kind", "quiet"),
                     factors={**factors, **extra}, **kwargs)


def lines(runs: list[NightRun]) -> str:
    return "\n".join(r.line() for r in runs)


# ---------------------------------------------------------------------- defect 8
def test_confirmation_uses_tonights_threshold(record, tmp_path):
    """A 2.5x night is suspected under threshold 2; the threshold then goes to 3. The next
    2.5x night is no regression under tonight's rule: it clears the suspicion instead of
    failing as "confirmed: still 2.50x" (and the night after passes the same way)."""
    drive = driver(record, tmp_path, confirm="always")
    runs = [drive.run(quiet(d)) for d in range(6)]
    runs.append(drive.run(quiet(6, factors={"read": 2.5}, kind="2.5x, threshold 2")))
    assert runs[-1].status == "suspected", lines(runs)
    raised = driver(record, tmp_path, drive.store, threshold=3.0, confirm="always")
    runs += [raised.run(quiet(d, factors={"read": 2.5}, kind="2.5x, threshold 3"))
             for d in (7, 8)]
    assert [r.status for r in runs[-2:]] == ["healthy", "healthy"], lines(runs)
    assert runs[-2].events_of("cleared"), lines(runs)
