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


# -- what the rules were not tuned on (issue 22) ---------------------------------------------


def test_busy_threads_without_off_cpu_evidence_are_not_io():
    # a short compute stage before the counters existed: busy threads and nothing else
    verdict = classify({"tasks.busy_fraction": 0.93, "tasks.typical_s": 0.1})
    assert verdict["primary"] == "undetermined"
    assert "none of" in verdict["scores"]["io"]["gate"]


def test_tiny_tasks_without_the_schedulers_load_are_not_scheduler_bound():
    verdict = classify({"tasks.typical_s": 0.0002, "tasks.busy_fraction": 0.05})
    assert verdict["primary"] != "scheduler"
    assert "scheduler.loop_busy" in verdict["scores"]["scheduler"]["gate"]


def waiting_straggler(**extra: float) -> dict:
    """One task that waits on storage sets the wall; the other threads sat idle."""
    return {"tasks.busy_fraction": 0.3, "tasks.longest_share": 0.9, "tasks.task_skew": 70.0,
            "tasks.tail_fraction": 0.45, "monitor.cpu_per_busy_thread": 0.05,
            "monitor.threads_per_worker": 2, "monitor.busy_process_cores": 0.05,
            "monitor.cpu_imbalance": 1.6, "fine.cpu_fraction": 0.05,
            "context.straggler": "task prefix read (longest task 70.0x its prefix's p95)",
            **extra}


def test_a_straggler_that_waits_leads_and_names_io_beside_it():
    """Issue 35: one task that waits sets the wall while the other threads idle; the fix is
    to split or rebalance it, so the straggler leads and io is said beside it."""
    verdict = classify(waiting_straggler())
    assert verdict["primary"] == "straggler", verdict["note"]
    assert verdict["secondary"] == "io"
    said = [d for d in verdict["disagreements"] if d.startswith("io-bound is also")]
    assert said and "one task spans 90% of the stage's wall" in said[0]
    assert "io's fix could remove about 86%" in said[0]
    assert verdict["confidence"] == "medium"
    assert "split" in verdict["actions"][0] or "straggler" in verdict["actions"][0]
    assert any("threads per worker" in a for a in verdict["actions"])  # io's actions next


@pytest.mark.parametrize("extra", [
    {"tasks.longest_share": 0.45},  # the long task spans less than half the wall
    {"tasks.task_skew": 3.0},  # every task is long: no outlier (and no straggler at all)
])
def test_a_waiting_stage_without_a_wall_setting_straggler_stays_io(extra):
    from prefect_dask_profiling.diagnosis.classify import straggler_wall_share

    verdict = classify(waiting_straggler(**{"tasks.busy_fraction": 0.8, **extra}))
    assert verdict["primary"] == "io", verdict["note"]
    share = straggler_wall_share(waiting_straggler(**extra))
    assert share is None or share < 0.5


def test_the_read_stage_of_issue_35_is_not_transfer_bound():
    # the stored read stage: 4.49 MB per transfer (the run's mean), 1% of its time receiving
    read = {"transfer.mb_per_transfer": 4.49, "tasks.transfer_share": 0.01,
            "tasks.busy_fraction": 0.45, "monitor.cpu_per_busy_thread": 0.55}
    verdict = classify(read)
    assert verdict["primary"] != "transfer", verdict["note"]
    assert "under the floor 0.1" in verdict["scores"]["transfer"]["gate"]
    # the same stage with a third of its time receiving can be transfer-bound
    moving = classify({**read, "tasks.transfer_share": 0.4})
    assert moving["primary"] == "transfer" and not moving["scores"]["transfer"]["gate"]


@pytest.mark.parametrize(("klass", "below", "floor_signal"), [
    ("transfer", {"tasks.transfer_share": 0.05, "fine.network_share": 0.05},
     "tasks.transfer_share"),
    ("spill", {"memory.spilled_peak_mb": 0.5}, "memory.spilled_peak_mb"),
    ("compute", {"fine.cpu_fraction": 0.2, "monitor.cpu_per_busy_thread": None},
     "fine.cpu_fraction"),
])
def test_a_class_below_its_floor_is_never_chosen(klass, below, floor_signal):
    from prefect_dask_profiling.diagnosis.classify import FLOORS

    strong = signals(PROTOTYPES[klass])
    assert classify(strong)["primary"] == klass
    weak = classify({**strong, **below})
    assert weak["primary"] != klass, weak["note"]
    assert f"{floor_signal} = " in weak["scores"][klass]["gate"]
    assert floor_signal in FLOORS[klass].signals and FLOORS[klass].why


def test_no_transfer_verdict_without_a_measured_transfer_share():
    s = {k: v for k, v in PROTOTYPES["transfer"].items()
         if k not in ("tasks.transfer_share", "fine.network_share")}
    verdict = classify(s)
    assert verdict["primary"] != "transfer"
    assert "was measured" in verdict["scores"]["transfer"]["gate"]


def test_a_straggler_that_computes_stays_a_straggler():
    verdict = classify(waiting_straggler(**{"monitor.cpu_per_busy_thread": 0.97,
                                            "fine.cpu_fraction": 0.95}))
    assert verdict["primary"] == "straggler", verdict["note"]
    assert "monitor.cpu_per_busy_thread" in verdict["scores"]["io"]["gate"]


def test_of_two_fitting_classes_the_larger_expected_effect_leads():
    # transfer (threads receive 70% of the time) against the scheduler (20% overhead)
    both = signals(PROTOTYPES["transfer"], PROTOTYPES["scheduler"],
                   {"scheduler.overhead_ratio": 0.25, "tasks.busy_fraction": 0.2})
    verdict = classify(both)
    assert verdict["effects"]["transfer"] == pytest.approx(0.7)
    assert verdict["effects"]["scheduler"] == pytest.approx(0.2)
    assert verdict["primary"] == "transfer" and verdict["secondary"] == "scheduler"
    # the same evidence with the scheduler's cost far larger: the scheduler leads
    heavy = classify({**both, "scheduler.overhead_ratio": 9.0, "tasks.transfer_share": 0.35,
                      "fine.network_share": 0.35})
    assert heavy["primary"] == "scheduler" and heavy["secondary"] == "transfer"
    assert any("transfer-bound is also supported" in d and "scheduler's about 80%" in d
               for d in heavy["disagreements"])


def test_a_class_without_an_effect_estimate_is_ranked_by_its_evidence():
    verdict = classify(signals(PROTOTYPES["transfer"], PROTOTYPES["spill"]))
    assert verdict["effects"]["spill"] is None
    assert verdict["primary"] == "spill"  # 3 sources against transfer's 2, most specific


@pytest.mark.parametrize(("klass", "extra", "effect"), [
    ("io", {"tasks.busy_fraction": 0.9, "monitor.cpu_per_busy_thread": 0.2}, 0.72),
    ("io", {"tasks.busy_fraction": 0.2, "tasks.longest_share": 0.8,
            "fine.cpu_fraction": 0.5}, 0.4),
    ("straggler", {"tasks.busy_fraction": 0.3, "tasks.longest_share": 0.8}, 0.7),
    ("straggler", {"tasks.busy_fraction": 0.9, "tasks.tail_fraction": 0.25}, 0.25),
    ("scheduler", {"scheduler.overhead_ratio": 3.0}, 0.75),
    ("scheduler", {"scheduler.overhead_ratio": 3.0, "tasks.busy_fraction": 0.5}, 0.5),
    ("transfer", {"tasks.transfer_share": 0.4}, 0.4),
    ("spill", {"fine.disk_share": 0.3}, None),
    ("compute", {"tasks.busy_fraction": 0.9}, None),
    ("io", {"tasks.busy_fraction": 0.9}, None),
])
def test_expected_effect_is_the_share_of_the_wall_its_fix_could_remove(klass, extra, effect):
    from prefect_dask_profiling.diagnosis.classify import expected_effect

    value = expected_effect(klass, extra)
    assert value == (None if effect is None else pytest.approx(effect))


def test_storage_requests_are_a_distinct_source_for_io():
    s = {"tasks.busy_fraction": 0.9, "monitor.cpu_per_busy_thread": 0.1,
         "storage.fetched_share": 0.98}
    verdict = classify(s)
    assert verdict["primary"] == "io"
    assert verdict["sources"] == ["process CPU", "storage requests", "task records"]
    assert verdict["confidence"] == "high"
    # fetched bytes alone do not make a stage io: the CPU still decides
    busy = classify({**s, "monitor.cpu_per_busy_thread": 0.95})
    assert busy["primary"] == "compute"


def test_a_tiny_task_preempted_on_a_loaded_host_is_no_straggler():
    from prefect_dask_profiling.diagnosis.signals import task_signals

    # 2,000 tasks of 1 ms on two one-thread workers over 2 s; one was preempted for 20 ms
    stream, t = [], 0.0
    for i in range(2000):
        d = 0.021 if i == 700 else 0.001
        stream.append({"key": f"tiny-{i}", "worker": f"w{i % 2}",
                       "startstops": [{"action": "compute", "start": t, "stop": t + d}]})
        t += 0.002 if i % 2 else 0.0
    batches = [{"start": 0.0, "end": t, "wall_s": t}]
    out = task_signals(stream, batches, threads=2, workers=["w0", "w1"])
    assert out["tasks.task_skew"] is None  # 20 ms of a 2 s wall is immaterial
    assert out["tasks.longest_share"] == pytest.approx(0.021 / t)
    # an outlier that sets a short batch's wall is skew
    few = [{"key": f"tiny-{i}", "worker": f"w{i % 2}",
            "startstops": [{"action": "compute", "start": 0.0,
                            "stop": 0.05 if i == 0 else 0.001}]} for i in range(20)]
    short = task_signals(few, [{"start": 0.0, "end": 0.06, "wall_s": 0.06}], 2, ["w0", "w1"])
    assert short["tasks.task_skew"] >= 5
