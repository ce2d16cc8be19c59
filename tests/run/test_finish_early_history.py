"""The history read while the run computes: used when it is still the run's, read again
when it is not (another store or rules, runs delivered from the spool) or its read failed.

Records come from a real LocalCluster, stores are real local folders.
"""

from __future__ import annotations

from concurrent.futures import Future

from helpers.run_records import record_stages

from prefect_dask_profiling.options import ProfilingOptions
from prefect_dask_profiling.regression.judge import load_history
from prefect_dask_profiling.run.pipeline import (
    DEFAULT_OPTIONS,
    EarlyHistory,
    finish_run,
    read_history_early,
)
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id

PIPELINE = "nightly"


def new_ctx() -> RunContext:
    return RunContext(run_id=new_run_id(), pipeline=PIPELINE, version="1")


def seeded(tmp_path, record, runs: int = 4) -> RunStore:
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    for _ in range(runs):
        assert finish_run(store, record, new_ctx(), []).judged
    return store


def test_the_early_history_judges_the_run_as_a_read_at_finish_would(inproc_client, tmp_path):
    record = record_stages(inproc_client, {"read": 200, "reduce": 200})
    store = seeded(tmp_path, record)
    ctx, settings = new_ctx(), DEFAULT_OPTIONS
    early = read_history_early(RunStore(store.url), ctx, settings.rules)
    fresh = load_history(store, ctx.key, settings.rules)
    result = finish_run(store, record, ctx, [], settings, early_history=early)
    assert result.judged
    read = result.manifest["history_read"]
    assert read == {"at": early.started, "when": "run start"}
    assert list(result.judgement.baseline_runs) == list(fresh.baseline.runs)
    assert len(fresh.baseline.runs) == 4
    stored = store.read_manifest(PIPELINE, ctx.run_id)
    assert stored["history_read"]["when"] == "run start"
    assert stored["baseline"]["runs"] == list(fresh.baseline.runs)


def test_a_run_stored_after_the_early_read_is_not_in_its_baseline(inproc_client, tmp_path):
    """The history is the one as of the run's start: an overlapping run of the pipeline that
    finished first is not in it (two overlapping runs never judge each other)."""
    record = record_stages(inproc_client, {"read": 200})
    store = seeded(tmp_path, record, runs=3)
    ctx, settings = new_ctx(), DEFAULT_OPTIONS
    early = read_history_early(RunStore(store.url), ctx, settings.rules)
    early.future.result()
    other = finish_run(store, record, new_ctx(), [], settings)  # finished during ours
    result = finish_run(store, record, ctx, [], settings, early_history=early)
    assert result.manifest["history_read"]["when"] == "run start"
    assert other.run_id not in result.judgement.baseline_runs
    assert len(result.judgement.baseline_runs) == 3


def failed_read(ctx: RunContext, store: RunStore, settings: ProfilingOptions) -> EarlyHistory:
    future: Future = Future()
    future.set_exception(OSError("the store did not answer at the run's start"))
    return EarlyHistory(location=store.url, run=ctx.key, rules=settings.rules, started="then",
                        future=future)


def test_an_early_read_that_failed_is_read_again_at_finish(inproc_client, tmp_path):
    record = record_stages(inproc_client, {"read": 200})
    store = seeded(tmp_path, record, runs=2)
    ctx, settings = new_ctx(), DEFAULT_OPTIONS
    result = finish_run(store, record, ctx, [], settings,
                        early_history=failed_read(ctx, store, settings))
    assert result.judged and len(result.judgement.baseline_runs) == 2
    assert result.manifest["history_read"]["when"] == "finish"
    assert "why" not in result.manifest["history_read"]


def test_an_early_history_of_other_rules_or_store_is_read_again(inproc_client, tmp_path):
    record = record_stages(inproc_client, {"read": 200})
    store = seeded(tmp_path, record, runs=3)
    ctx = new_ctx()
    narrow = ProfilingOptions(history=1)
    early = read_history_early(RunStore(store.url), ctx, narrow.rules)
    result = finish_run(store, record, ctx, [], early_history=early)
    read = result.manifest["history_read"]
    assert read["when"] == "finish" and read["why"] == "read for other rules"
    assert len(result.judgement.baseline_runs) == 3  # not the one run the early read took
    elsewhere = seeded(tmp_path / "other", record, runs=1)
    ctx = new_ctx()
    early = read_history_early(elsewhere, ctx, DEFAULT_OPTIONS.rules)
    result = finish_run(store, record, ctx, [], early_history=early)
    assert result.manifest["history_read"]["why"] == "read for another store or run"
    assert len(result.judgement.baseline_runs) == 4  # the 3 and the run judged above


def test_runs_delivered_from_the_spool_since_the_early_read_make_it_read_again(
        inproc_client, tmp_path):
    """A run spooled by an earlier night (store down) is delivered when this run finishes:
    the history read at this run's start lacks it, so it is read again."""
    record = record_stages(inproc_client, {"read": 200})
    blocked = tmp_path / "store"
    blocked.write_text("a file where the store's folder should be")
    spool = tmp_path / "spool"
    first = finish_run(RunStore(str(blocked), spool_dir=spool), record, new_ctx(), [],
                       DEFAULT_OPTIONS)
    assert list(spool.iterdir())  # kept in the spool
    blocked.unlink()
    store = RunStore(str(blocked), spool_dir=spool)
    ctx = new_ctx()
    early = read_history_early(RunStore(store.url, spool_dir=tmp_path / "other-spool"), ctx,
                               DEFAULT_OPTIONS.rules)
    assert not early.future.result().baseline.runs
    result = finish_run(store, record, ctx, [], early_history=early)
    assert result.manifest["spool_delivery"]["pipelines"] == {first.run_id: PIPELINE}
    read = result.manifest["history_read"]
    assert read["when"] == "finish"
    assert read["why"] == "runs of the pipeline delivered from the spool since"
