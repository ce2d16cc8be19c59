"""``cost=`` on the runner: refused at construction naming the key, carried by duplicate()
and pickling (no cluster, no Prefect server)."""

from __future__ import annotations

import pickle

import pytest

from prefect_dask_profiling.cost.rates import CostRates, Rates
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner


@pytest.mark.parametrize(("cost", "key"), [
    ({"worker_hour": -0.1}, "worker_hour"),
    ({"thread_hour": "1"}, "thread_hour"),
    ({"per_core": 1}, "per_core"),
    ({"workers": {"gpu-*": {"worker_hour": -2}}}, "workers.gpu-*.worker_hour"),
    ({"workers": {"gpu-*": {"worker_hour": 1}}, "worker_hour": 1}, "not both"),
    (0.12, "cost must be a mapping"),
])
def test_bad_cost_is_refused_at_construction(cost: object, key: str) -> None:
    with pytest.raises(ValueError) as info:
        ProfiledDaskTaskRunner(cost=cost)  # type: ignore[arg-type]
    assert key in str(info.value)


def test_cost_survives_duplicate_and_pickling() -> None:
    runner = ProfiledDaskTaskRunner(cost={"worker_hour": 0.12, "gib_hour": 0.01})
    expected = CostRates(default=Rates(worker_hour=0.12, gib_hour=0.01))
    assert runner.profiling.cost == expected
    assert runner.duplicate().profiling.cost == expected
    assert pickle.loads(pickle.dumps(runner)).profiling.cost == expected
    assert ProfiledDaskTaskRunner().profiling.cost is None


def test_cost_regression_is_checked_at_construction() -> None:
    assert ProfiledDaskTaskRunner().profiling.cost_regression == "warn"
    assert ProfiledDaskTaskRunner(cost_regression="off").duplicate().profiling \
        .cost_regression == "off"
    with pytest.raises(ValueError, match="cost_regression"):
        ProfiledDaskTaskRunner(cost_regression="loud")


def test_cluster_rules_are_matched_against_the_runners_cluster_class() -> None:
    cost = {"clusters": {"LocalCluster": {"worker_hour": 0.1}}}
    assert ProfiledDaskTaskRunner(cost=cost).profiling.cost.cluster == "LocalCluster"
    runner = ProfiledDaskTaskRunner(cluster_class="distributed.deploy.spec.SpecCluster",
                                    cost=cost)
    assert runner.profiling.cost.cluster == "SpecCluster"
    assert runner.duplicate().profiling.cost.cluster == "SpecCluster"
    assert pickle.loads(pickle.dumps(runner)).profiling.cost.cluster == "SpecCluster"
    assert ProfiledDaskTaskRunner(address="tcp://10.0.0.1:8786", cost=cost) \
        .profiling.cost.cluster is None
    # rates without cluster rules are left as given
    assert ProfiledDaskTaskRunner(cost={"worker_hour": 1}).profiling.cost.cluster is None
