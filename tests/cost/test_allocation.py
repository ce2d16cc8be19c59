"""Allocation (allocated / busy / idle resource-hours) and pricing on generated records."""

from __future__ import annotations

import random

import pytest

from prefect_dask_profiling.cost.allocation import (
    GIB,
    OUTSIDE,
    allocation,
    merge_windows,
)
from prefect_dask_profiling.cost.rates import CostRates, Rates, parse_cost
from prefect_dask_profiling.summary.record import RunRecord

T0 = 1_000_000.0


def _task(stage: str, start: float, stop: float, compute_s: float) -> dict:
    return {"stage": stage, "prefix": "work", "tasks": 1, "errors": 0, "reruns": 0,
            "compute_s": compute_s, "max_s": compute_s, "nbytes": 0, "max_nbytes": 0,
            "transfer_s": 0.0, "disk_read_s": 0.0, "disk_write_s": 0.0,
            "first_start": start, "last_stop": stop}


def _life(name: str, arrived: float, departed: float | None, nthreads: int = 2,
          memory_limit: int = 4 * GIB) -> dict:
    return {"worker": f"tcp://{name}", "name": name, "nthreads": nthreads,
            "memory_limit": memory_limit, "arrived": arrived, "departed": departed,
            "start_known": True}


def _record(tasks: list[dict], lives: list[dict], collected: float) -> RunRecord:
    return RunRecord.from_snapshot({"name": "t", "started": T0, "collected": collected,
                                    "tasks": tasks, "lifetimes": lives})


def test_stages_and_outside_add_up_to_the_run() -> None:
    # one worker from 0 to 100; three more from 20 to 60 (adaptive 1 -> 4 -> 1)
    lives = [_life("w0", T0, None)] + [_life(f"w{i}", T0 + 20, T0 + 60) for i in (1, 2, 3)]
    tasks = [_task("a", T0 + 10, T0 + 30, 12.0), _task("b", T0 + 40, T0 + 70, 30.0)]
    alloc = allocation(_record(tasks, lives, T0 + 100))
    a, b = alloc.stages
    assert (a.scope, b.scope) == ("a", "b")
    assert a.worker_s == pytest.approx(20 + 3 * 10)
    assert b.worker_s == pytest.approx(30 + 3 * 20)
    assert alloc.run.worker_s == pytest.approx(100 + 3 * 40)
    assert alloc.outside.scope == OUTSIDE
    assert a.worker_s + b.worker_s + alloc.outside.worker_s == pytest.approx(alloc.run.worker_s)
    assert alloc.overlap_worker_s == pytest.approx(0.0)
    assert a.thread_s == pytest.approx(2 * a.worker_s)
    assert a.gib_h == pytest.approx(4 * a.worker_s / 3600)
    assert a.busy_s == 12.0 and a.idle_s == pytest.approx(a.thread_s - 12.0)
    assert a.cost is None and "cost" not in alloc.to_dict()["run"]
    assert "rates" not in alloc.to_dict()
    # the stored layout (the manifest's ``allocation``)
    doc = alloc.to_dict()
    assert list(doc) == ["stages", "outside", "run", "overlap_worker_s", "workers"]
    assert list(doc["run"]) == ["scope", "start", "stop", "wall_s", "worker_s", "thread_s",
                                "gib_h", "busy_s", "idle_s", "idle_share"]
    assert list(doc["workers"][0]) == ["worker", "name", "nthreads", "memory_limit",
                                       "arrived", "departed", "resources"]


def test_random_runs_add_up() -> None:
    rng = random.Random(7)
    for _ in range(50):
        lives = []
        for i in range(rng.randint(1, 6)):
            start = T0 + rng.uniform(0, 50)
            stop = start + rng.uniform(1, 80) if rng.random() < 0.7 else None
            lives.append(_life(f"w{i}", start, stop, nthreads=rng.randint(1, 4)))
        cursor, tasks = T0 + rng.uniform(0, 10), []
        for k in range(rng.randint(1, 4)):  # disjoint stage windows
            stop = cursor + rng.uniform(1, 20)
            tasks.append(_task(f"s{k}", cursor, stop, 0.0))
            cursor = stop + rng.uniform(0, 5)
        alloc = allocation(_record(tasks, lives, T0 + 150))
        total = sum(s.worker_s for s in alloc.stages) + alloc.outside.worker_s
        assert total == pytest.approx(alloc.run.worker_s)
        threads = sum(s.thread_s for s in alloc.stages) + alloc.outside.thread_s
        assert threads == pytest.approx(alloc.run.thread_s)


def test_overlapping_stages_say_how_much_they_share() -> None:
    lives = [_life("w0", T0, T0 + 100)]
    tasks = [_task("a", T0 + 10, T0 + 50, 0.0), _task("b", T0 + 40, T0 + 60, 0.0)]
    alloc = allocation(_record(tasks, lives, T0 + 100))
    assert alloc.overlap_worker_s == pytest.approx(10.0)
    total = sum(s.worker_s for s in alloc.stages) + alloc.outside.worker_s
    assert total - alloc.overlap_worker_s == pytest.approx(alloc.run.worker_s)


def test_four_workers_waiting_on_one_task_are_mostly_idle() -> None:
    lives = [_life(f"w{i}", T0, T0 + 100, nthreads=1) for i in range(4)]
    tasks = [_task("wait", T0 + 10, T0 + 40, 30.0)]
    (row,) = allocation(_record(tasks, lives, T0 + 100)).stages
    assert row.idle_share == pytest.approx(0.75)


def test_a_record_without_lifetimes_allocates_nothing() -> None:
    alloc = allocation(_record([_task("a", T0, T0 + 1, 1.0)], [], T0 + 5))
    assert alloc.run.worker_s == 0 and alloc.run.idle_share is None


def test_prices_per_worker_name_pattern() -> None:
    lives = [_life("gpu-1", T0, T0 + 3600, nthreads=1), _life("cpu-1", T0, T0 + 3600),
             _life("odd", T0, T0 + 3600)]
    rates = parse_cost({"workers": {"gpu-*": {"worker_hour": 3.0},
                                    "cpu-*": {"thread_hour": 0.5, "gib_hour": 0.25}}})
    alloc = allocation(_record([_task("a", T0, T0 + 3600, 1.0)], lives, T0 + 3600), rates)
    assert alloc.run.cost == pytest.approx(3.0 + 2 * 0.5 + 4 * 0.25)
    assert alloc.run.unpriced_worker_s == pytest.approx(3600)
    assert alloc.unpriced_workers == ["odd"]
    assert alloc.to_dict()["rates"]["text"].startswith("workers 'gpu-*': 3 USD per worker-hour")


def test_one_rate_for_every_worker() -> None:
    rates = parse_cost({"worker_hour": 0.12, "currency": "EUR"})
    assert rates == CostRates(default=Rates(worker_hour=0.12), currency="EUR")
    assert rates.describe() == "0.12 EUR per worker-hour"
    alloc = allocation(_record([_task("a", T0, T0 + 1800, 1.0)],
                               [_life("w", T0, T0 + 3600)], T0 + 3600), rates)
    assert alloc.stages[0].cost == pytest.approx(0.06)
    assert alloc.run.cost == pytest.approx(0.12)


@pytest.mark.parametrize(("cost", "named"), [
    ({"worker_hour": -1}, "'worker_hour'"),
    ({"worker_hour": "cheap"}, "'worker_hour'"),
    ({"worker_hour": True}, "'worker_hour'"),
    ({"cpu_hour": 1.0}, "'cpu_hour'"),
    ({"workers": {"a*": {"worker_hour": float("nan")}}}, "workers.a*.worker_hour"),
    ({"workers": {"a*": {"core_hour": 1}}}, "core_hour"),
    ({"workers": {"a*": 1.0}}, "'a*'"),
    ({"workers": {}}, "'workers'"),
    ({"resources": {"GPU": {"worker_hour": -2.9}}}, "resources.GPU.worker_hour"),
    ({"resources": {"GPU": {"gpu_hour": 1}}}, "gpu_hour"),
    ({"resources": ["GPU"]}, "'resources'"),
    ({"clusters": {"FargateCluster": {"worker_hour": "0.05"}}},
     "clusters.FargateCluster.worker_hour"),
    ({"clusters": {"": {"worker_hour": 1}}}, "'clusters'"),
    ({"clusters": {"*": {"worker_hour": 1}}, "worker_hour": 1}, "not both"),
    ({"gpus": {"*": {"worker_hour": 1}}}, "'gpus'"),
    ({}, "at least one rate"),
    ({"currency": ""}, "'currency'"),
    ("0.12", "mapping"),
])
def test_bad_rates_are_refused_naming_the_key(cost: object, named: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_cost(cost)  # type: ignore[arg-type]
    assert named in str(info.value)


def _priced(lives: list[dict], cost: dict, cluster: str | None = None):
    rates = parse_cost(cost)
    rates = rates.with_cluster(cluster) if cluster is not None else rates
    return rates, allocation(_record([_task("a", T0, T0 + 3600, 1.0)], lives, T0 + 3600),
                             rates)


def test_prices_by_resource_tag_then_name_then_cluster_class() -> None:
    gpu = {**_life("w-1", T0, T0 + 3600, nthreads=1), "resources": {"GPU": 1.0}}
    none = {**_life("w-2", T0, T0 + 3600), "resources": {"GPU": 0}}  # 0 does not count
    big = _life("big-1", T0, T0 + 3600)
    cost = {"resources": {"GPU": {"worker_hour": 2.9}},
            "workers": {"big-*": {"worker_hour": 1.0}},
            "clusters": {"Fargate*": {"worker_hour": 0.05}}}
    rates, alloc = _priced([gpu, none, big], cost, cluster="FargateCluster")
    # first match wins: the GPU tag before the name, the name before the cluster class
    assert alloc.run.cost == pytest.approx(2.9 + 0.05 + 1.0)
    assert alloc.unpriced_workers == [] and rates.warnings([("w-1", {"GPU": 1})]) == [
        "cost: workers 'big-*', clusters 'Fargate*' matched no worker "
        "(cluster class 'FargateCluster')"]
    assert alloc.to_dict()["rates"]["cluster"] == "FargateCluster"
    assert alloc.to_dict()["rates"]["text"] == (
        "resources 'GPU': 2.9 USD per worker-hour; workers 'big-*': 1 USD per worker-hour; "
        "clusters 'Fargate*': 0.05 USD per worker-hour")
    # on another cluster class the cluster rule matches nothing: those workers unpriced
    rates, alloc = _priced([gpu, none, big], cost, cluster="LocalCluster")
    assert alloc.run.cost == pytest.approx(2.9 + 1.0)
    assert alloc.unpriced_workers == ["w-2"]
    assert alloc.run.unpriced_worker_s == pytest.approx(3600)
    [unpriced, unused] = rates.warnings([("w-1", gpu["resources"]), ("w-2", {"GPU": 0}),
                                         "big-1"])
    assert unpriced.startswith("cost: no rate (") and unpriced.endswith(
        "matches worker(s) w-2: they are not priced, the run's cost leaves them out")
    assert unused == ("cost: clusters 'Fargate*' matched no worker "
                      "(cluster class 'LocalCluster')")


def test_records_before_resource_tags_and_unbound_cluster_rules() -> None:
    old = _life("w-1", T0, T0 + 3600)  # a lifetime recorded before resources were
    rates, alloc = _priced([old], {"resources": {"GPU": {"worker_hour": 2.9}}})
    assert alloc.unpriced_workers == ["w-1"] and alloc.run.cost == 0.0
    # cluster rules with no cluster known (the runner connected to an address)
    rates, alloc = _priced([old], {"clusters": {"*": {"worker_hour": 0.12}}})
    assert rates.cluster is None and alloc.unpriced_workers == ["w-1"]
    assert parse_cost({"worker_hour": 1.0}).warnings(["w"]) == []


def test_merge_windows() -> None:
    assert merge_windows([(5, 6), (0, 2), (1, 3), (7, 7)]) == [(0, 3), (5, 6)]
