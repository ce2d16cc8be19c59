"""Regressions that explain themselves: bottleneck change and ranked context changes (pure)."""

from __future__ import annotations

import pytest

from prefect_dask_profiling.regression.explain import (
    context_changes,
    explain_stage,
    explain_verdicts,
)


def manifest(primary: str | None, value: float, *, tasks: int = 100, workers: int = 4,
             version: str = "v1", dask: str = "2026.8.0", mismatches=()) -> dict:
    stage = {"name": "read", "tasks": tasks, "task_s": 10.0}
    if primary:
        stage["diagnosis"] = {"primary": primary, "confidence": "high", "signals": [
            {"signal": "monitor.cpu_per_busy_thread", "source": "process CPU", "value": value,
             "op": ">=", "threshold": 0.6, "supports": True}]}
    return {"version": version, "source_hash": "abc", "workers": workers, "threads": workers,
            "environment": {"python": "3.11.7", "dask": dask, "mismatches": list(mismatches)},
            "stages": [stage]}


def test_a_changed_bottleneck_is_said_with_its_signal():
    base = [manifest("compute", 0.8) for _ in range(4)]
    out = explain_stage("read", manifest("io", 0.1), base, ratio=2.4)
    assert out["bottleneck"]["changed"] is True
    assert out["bottleneck"]["text"] == ("read 2.4× slower: was compute "
                                         "(monitor.cpu_per_busy_thread 0.8), now io "
                                         "(monitor.cpu_per_busy_thread 0.1)")
    assert "nothing recorded in the run context changed" in out["text"]


def test_context_changes_are_ranked_most_likely_first():
    base = [manifest("compute", 0.8) for _ in range(3)]
    now = manifest("compute", 0.8, tasks=400, workers=2, dask="2026.9.0",
                   mismatches=["numpy: client 2.4 vs workers 2.3"])
    changes = context_changes("read", now, base)
    whats = [c["what"] for c in changes]
    assert whats[0] == "tasks in stage read"  # 4x the data
    assert whats.index("workers") < whats.index("dask (client)")
    assert "version mismatch client/scheduler/workers" in whats
    out = explain_stage("read", now, base, ratio=3.0)
    assert out["bottleneck"]["changed"] is False
    assert out["text"].startswith("read 3.0× slower: still compute")


def test_old_runs_without_diagnoses_still_explain_context():
    base = [manifest(None, 0) for _ in range(2)]
    out = explain_stage("read", manifest("io", 0.1, version="v2"), base)
    assert out["bottleneck"] is None
    assert out["context"][0]["what"] == "flow version"
    assert explain_stage("read", manifest("io", 0.1), [])["text"] == \
        "no baseline runs to compare with"
    assert explain_stage("read", {"stages": "garbage"}, [None, 3])["bottleneck"] is None


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="manifest must be a dict"):
        explain_stage("read", None, [])
    with pytest.raises(ValueError, match="stage must be"):
        explain_stage("", {}, [])


def test_explain_verdicts_names_only_regressed_stages():
    import pandas as pd

    verdicts = pd.DataFrame([
        {"stage": "read", "prefix": "load", "verdict": "regression", "baseline_s": 2.0,
         "latest_s": 5.0},
        {"stage": "other", "prefix": "x", "verdict": "ok", "baseline_s": 1.0, "latest_s": 1.0}])
    out = explain_verdicts(verdicts, manifest("io", 0.1), [manifest("compute", 0.8)])
    assert list(out) == ["read"]
    assert out["read"]["text"].startswith("read 2.5× slower: was compute")
    assert explain_verdicts(verdicts.iloc[0:0], {}, []) == {}


# -- version mismatches: compared by roles, not by worker addresses -------------------------


def _versions(client, numpy_on_first_worker: str, port_offset: int) -> dict:
    """A real cluster's ``get_versions`` with one worker on another numpy, re-addressed."""
    import copy

    real = copy.deepcopy(client.get_versions(check=False))
    [info] = real["workers"].values()
    workers = {}
    for i in range(2):
        w = copy.deepcopy(info)
        if i == 0:
            w["packages"]["numpy"] = numpy_on_first_worker
        workers[f"tcp://10.0.0.{i + 1}:{40000 + port_offset + i}"] = w
    return {**real, "workers": workers}


def _run_env(versions: dict) -> dict:
    from prefect_dask_profiling.environment import version_mismatches

    return {"python": "3.11.7", "dask": "2026.8.0", "mismatches": version_mismatches(versions)}


def test_a_long_standing_mismatch_is_not_new_when_worker_addresses_change(inproc_client):
    base = [manifest("compute", 0.8) for _ in range(3)]
    for night, b in enumerate(base):  # the same mismatch, workers at new addresses each night
        b["environment"] = _run_env(_versions(inproc_client, "1.26.4", port_offset=night * 7))
    now = manifest("compute", 0.8)
    now["environment"] = _run_env(_versions(inproc_client, "1.26.4", port_offset=99))
    assert now["environment"]["mismatches"], "the test needs a mismatch"
    assert not any("tcp://" in m for m in now["environment"]["mismatches"])
    assert context_changes("read", now, base) == []
    # a real change (another version on that worker) is new, and says what it was
    now["environment"] = _run_env(_versions(inproc_client, "1.25.0", port_offset=99))
    [change] = context_changes("read", now, base)
    assert change["what"] == "version mismatch client/scheduler/workers"
    assert change["now"].startswith("numpy: ") and "1.25.0 on workers" in change["now"]
    assert "1.26.4 on workers" in change["was"]


def test_mismatches_stored_with_addresses_compare_with_the_stable_form(inproc_client):
    from prefect_dask_profiling.environment import mismatch_detail, mismatch_key

    versions = _versions(inproc_client, "1.26.4", port_offset=0)
    [detail] = mismatch_detail(versions)  # the pre-fix text, with addresses
    assert "worker tcp://10.0.0.1:40000" in detail
    base = [manifest("compute", 0.8, mismatches=[detail])]  # a run stored before the fix
    now = manifest("compute", 0.8)
    now["environment"] = _run_env(_versions(inproc_client, "1.26.4", port_offset=5))
    assert context_changes("read", now, base) == []
    [line] = now["environment"]["mismatches"]
    assert mismatch_key(line) == line == mismatch_key(detail)
    assert mismatch_key("versions not collected: OSError") == "versions not collected: OSError"


def test_a_slower_stage_that_spilled_says_so():
    from prefect_dask_profiling.regression.explain import explain_stage

    def run(spilled, peak, incidents=()):
        return {"version": "1", "stages": [{"name": "reduce", "tasks": 10, "memory": {
            "workers": 2, "peak_bytes": peak, "spilled_bytes": spilled,
            "memory_limit": 8 * 2**30, "headroom": 0.5}}], "incidents": list(incidents)}

    baselines = [run(0, 2 * 2**30) for _ in range(3)]
    tonight = run(int(3.1 * 2**30), int(2.1 * 2**30), [
        {"kind": "suspected OOM", "stages": ["reduce"], "worker": "tcp://w"}])
    text = explain_stage("reduce", tonight, baselines, ratio=2.6)["text"]
    assert text.startswith("reduce 2.6× slower: 3.1 GiB spilled, was 0")
    assert "1 suspected OOM" in text and "peak memory" not in text
    quiet = explain_stage("reduce", run(0, 2 * 2**30), baselines, ratio=2.6)
    assert quiet["memory"] == "" and "spilled" not in quiet["text"]


def test_gdal_data_set_or_unset_is_no_change_but_a_request_option_is():
    """Where GDAL finds its data files depends on when rasterio entered its environment in
    the worker, not on the night: it is never named as a change (a regressed NDVI night
    named "GDAL_DATA ... -> unset"); a request-shaping option still is."""
    def night(**options: str) -> dict:
        doc = manifest("compute", 0.8)
        doc["environment"]["raster"] = {"gdal": "3.10.3", "options": options}
        return doc

    base = [night(GDAL_DATA="/venv/rasterio/gdal_data", GDAL_HTTP_MULTIRANGE="PARALLEL")
            for _ in range(4)]
    whats = [c["what"] for c in context_changes("read", night(GDAL_HTTP_MULTIRANGE="SERIAL"),
                                                base)]
    assert whats == ["GDAL_HTTP_MULTIRANGE"], whats
