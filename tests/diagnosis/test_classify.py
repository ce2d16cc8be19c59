"""The classifier on generated signal sets: each class, gates, disagreement, missing data."""

from __future__ import annotations

import math

import pytest

from prefect_dask_profiling.diagnosis.classify import (
    CLASSES,
    MIN_SOURCES,
    RULES,
    SOURCES,
    check_classes,
    classify,
    evaluate,
    threshold_table,
)

# A quiet baseline: nothing stands out (no class reaches two agreeing sources).
NEUTRAL = {
    "fine.cpu_fraction": 0.5, "fine.overhead_share": 0.1,
    "fine.network_share": 0.05, "fine.disk_share": 0.0,
    "tasks.typical_s": 0.05, "tasks.busy_fraction": 0.55, "tasks.transfer_share": 0.05,
    "tasks.disk_share": 0.0, "tasks.worker_skew": 1.1, "tasks.task_skew": 1.3,
    "tasks.tail_fraction": 0.05,
    "scheduler.overhead_ratio": 0.1, "scheduler.loop_busy": 0.1,
    "transfer.mb_per_transfer": 0.01, "transfer.wait_fraction": 0.02,
    "worker.cpu_demand": 0.4, "worker.seconds_per_task_skew": 1.1,
    "monitor.cpu_per_busy_thread": 0.5, "monitor.cpu_imbalance": 1.1,
    "memory.spilled_peak_mb": 0.0, "memory.managed_peak_fraction": 0.1, "proc.write_mb": 0.5,
    "calibration.min_index": 0.95,
}

PROTOTYPES = {
    "compute": {"fine.cpu_fraction": 0.9, "tasks.busy_fraction": 0.9,
                "worker.cpu_demand": 0.95, "monitor.cpu_per_busy_thread": 0.95},
    "io": {"fine.cpu_fraction": 0.05, "tasks.busy_fraction": 0.9,
           "monitor.cpu_per_busy_thread": 0.1, "host.external_share": 0.95},
    "scheduler": {"tasks.typical_s": 0.0004, "tasks.busy_fraction": 0.1,
                  "scheduler.overhead_ratio": 3.0, "scheduler.loop_busy": 0.8,
                  "fine.overhead_share": 0.7},
    "transfer": {"transfer.mb_per_transfer": 8.0, "transfer.wait_fraction": 0.7,
                 "fine.network_share": 0.8, "tasks.transfer_share": 0.7,
                 "tasks.busy_fraction": 0.2, "host.dask_share": 0.9},
    "straggler": {"tasks.worker_skew": 4.0, "tasks.tail_fraction": 0.4,
                  "worker.seconds_per_task_skew": 3.5, "calibration.min_index": 0.4,
                  "monitor.cpu_imbalance": 3.0},
    "spill": {"memory.spilled_peak_mb": 300.0, "memory.managed_peak_fraction": 0.85,
              "fine.disk_share": 0.3, "tasks.disk_share": 0.2, "proc.write_mb": 400.0},
}


def signals(*overrides: dict) -> dict:
    out = dict(NEUTRAL)
    for o in overrides:
        out.update(o)
    return out


def test_neutral_baseline_names_nothing_with_confidence():
    verdict = classify(NEUTRAL)
    assert verdict["confidence"] == "low"
    assert any("no class has" in d for d in verdict["disagreements"])


@pytest.mark.parametrize("klass", CLASSES)
def test_each_prototype_is_classified_with_three_distinct_sources(klass):
    verdict = classify(signals(PROTOTYPES[klass]))
    assert verdict["primary"] == klass, verdict["note"]
    assert verdict["confidence"] == "high"
    supporting = [e for e in verdict["signals"] if e["supports"]]
    assert len({e["source"] for e in supporting}) >= MIN_SOURCES
    assert verdict["agreeing_sources"] == len(verdict["sources"]) >= MIN_SOURCES
    for e in verdict["signals"]:  # every signal states its value, threshold and source
        assert {"signal", "source", "value", "op", "threshold", "supports"} <= set(e)
        assert e["source"] in SOURCES
    assert len(verdict["actions"]) >= 3


def test_low_cpu_with_busy_threads_is_io_not_compute():
    # ~1% CPU while threads sit in tasks: waiting on storage, not computing
    s = signals({"fine.cpu_fraction": 0.01, "tasks.busy_fraction": 0.95,
                 "monitor.cpu_per_busy_thread": 0.02, "worker.cpu_demand": 0.02,
                 "scheduler.overhead_ratio": 0.001})
    verdict = classify(s)
    assert verdict["primary"] == "io"
    assert "compute" not in (verdict["primary"], verdict["secondary"])
    assert "threads per worker" in verdict["actions"][0]
    assert verdict["scores"]["compute"]["gate"]  # no CPU evidence: compute ruled out


def test_compute_needs_cpu_evidence():
    s = {"tasks.busy_fraction": 0.95, "worker.cpu_demand": 0.9}  # no CPU-per-task signal
    verdict = classify(s)
    assert verdict["primary"] != "compute"
    assert "was measured" in verdict["scores"]["compute"]["gate"]


def test_gil_contention_is_not_io():
    # two threads per worker, thread-cpu low, but the process keeps one core busy
    s = signals(PROTOTYPES["io"], {"host.external_share": None,
                                   "monitor.cpu_per_busy_thread": 0.35,
                                   "monitor.busy_process_cores": 0.95,
                                   "monitor.threads_per_worker": 2})
    verdict = classify(s)
    assert verdict["primary"] != "io"
    assert any("GIL" in d for d in verdict["disagreements"])


def test_one_thread_per_worker_says_what_cannot_be_told_apart():
    s = signals(PROTOTYPES["io"], {"host.external_share": None,
                                   "monitor.threads_per_worker": 1})
    verdict = classify(s)
    assert verdict["primary"] == "io"
    assert any("cannot tell" in d for d in verdict["disagreements"])


def test_one_long_task_is_a_straggler_named_by_prefix():
    s = signals({"tasks.task_skew": 60.0, "tasks.tail_fraction": 0.45,
                 "monitor.cpu_imbalance": 3.0,
                 "context.straggler": "task prefix read-tile (longest task 60.0x its p95)"})
    verdict = classify(s)
    assert verdict["primary"] == "straggler"
    assert verdict["confidence"] == "medium"  # task records + process CPU: two sources
    assert "read-tile" in verdict["actions"][0]


def test_three_views_of_the_same_transfers_are_one_source():
    # fine metrics network, transfer log and task-record transfer intervals time the same
    # gather-dep events: one source, however many rules hold
    s = signals({"transfer.mb_per_transfer": 8.0, "transfer.wait_fraction": 0.7,
                 "fine.network_share": 0.8, "tasks.transfer_share": 0.7,
                 "tasks.busy_fraction": 0.8})
    verdict = classify(s)
    assert verdict["scores"]["transfer"]["supporting_sources"] == ["transfer log"]
    assert verdict["primary"] != "transfer" or verdict["confidence"] == "low"


def test_two_views_of_the_same_disk_events_are_one_source():
    s = signals({"memory.spilled_peak_mb": 50.0, "fine.disk_share": 0.3,
                 "tasks.disk_share": 0.3})
    verdict = classify(s)
    assert sorted(verdict["scores"]["spill"]["supporting_sources"]) == [
        "disk events", "memory samples"]
    assert verdict["confidence"] != "high"


def test_tiny_messages_are_not_transfer_bound():
    s = signals(PROTOTYPES["scheduler"], PROTOTYPES["transfer"],
                {"transfer.mb_per_transfer": 0.05, "tasks.busy_fraction": 0.1})
    verdict = classify(s)
    assert verdict["primary"] == "scheduler"
    assert any("transfer-bound" in d and "necessary condition" in d
               for d in verdict["disagreements"])


def test_no_spill_is_never_spill_bound():
    s = signals(PROTOTYPES["spill"], {"memory.spilled_peak_mb": 0.0})
    assert classify(s)["primary"] != "spill"


def test_two_specific_bottlenecks_lower_confidence_and_say_so():
    verdict = classify(signals(PROTOTYPES["transfer"], PROTOTYPES["spill"]))
    assert verdict["primary"] in ("spill", "transfer")
    assert verdict["confidence"] in ("medium", "low")
    other = "transfer" if verdict["primary"] == "spill" else "spill"
    assert verdict["secondary"] == other
    assert any(f"{other}-bound is also supported" in d for d in verdict["disagreements"])
    assert "disagree" in verdict["note"]


def test_contradicting_signal_within_primary_is_listed():
    s = signals(PROTOTYPES["compute"], {"fine.cpu_fraction": 0.45})
    verdict = classify(s)
    assert verdict["primary"] == "compute"
    assert any(d.startswith("fine.cpu_fraction") for d in verdict["disagreements"])


def test_compute_alongside_a_straggler_is_compatible_not_a_contradiction():
    verdict = classify(signals(PROTOTYPES["compute"], PROTOTYPES["straggler"]))
    assert verdict["primary"] == "straggler"
    assert verdict["secondary"] == "compute"
    assert verdict["compatible"]
    assert verdict["confidence"] == "high"


def test_missing_and_non_finite_signals_are_skipped():
    s = {k: None for k in NEUTRAL}
    s["tasks.busy_fraction"] = math.nan
    s["fine.cpu_fraction"] = math.inf
    assert evaluate(s) == []
    verdict = classify(s)
    assert verdict["primary"] == "undetermined"
    assert verdict["confidence"] == "low"
    assert verdict["actions"]  # still says what to do next


def test_actions_are_filled_from_context():
    s = signals(PROTOTYPES["straggler"], {"context.slow_worker": "tcp://10.0.0.9:1234"})
    assert "tcp://10.0.0.9:1234" in classify(s)["actions"][0]


def test_unknown_class_and_bad_signals_are_clear_errors():
    with pytest.raises(ValueError, match="unknown bottleneck class.*'disk'.*known: spill"):
        classify(NEUTRAL, classes=["compute", "disk"])
    with pytest.raises(ValueError, match="signals must be a dict"):
        classify([("fine.cpu_fraction", 1.0)])
    assert check_classes("io, compute") == ("io", "compute")
    verdict = classify(signals(PROTOTYPES["io"]), classes="compute,scheduler")
    assert verdict["primary"] != "io"


def test_every_rule_names_a_known_class_and_source():
    for rule in RULES:
        assert rule.klass in CLASSES
        assert rule.source in SOURCES
        assert rule.op in (">=", "<=")
        assert rule.why and rule.meaning
    for klass in CLASSES:  # each class can reach three distinct sources
        assert len({r.source for r in RULES if r.klass == klass}) >= MIN_SOURCES
    table = threshold_table()
    assert all(f"`{r.signal}`" in table for r in RULES)


def test_cpu_from_samples_without_run_queue_wait_is_flagged():
    s = signals(PROTOTYPES["io"], {"monitor.cpu_wait_measured": 0, "host.external_share": None})
    verdict = classify(s)
    assert verdict["primary"] == "io"
    assert any("CPU used, not CPU waited for" in d for d in verdict["disagreements"])
