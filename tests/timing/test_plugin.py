"""TaskTimings on real LocalClusters: agreement with Dask's task stream, stages, wrappers,
errors, shared clusters, worker churn, and the plugin's own robustness and memory bound."""

from __future__ import annotations

import gc
import importlib
import os
import pickle
import signal
import sys
import threading
import time
import tracemalloc
from collections import defaultdict

import cloudpickle
import dask
import dask.array as da
import numpy as np
import pytest
from dask.utils import key_split
from distributed import (
    Client,
    LocalCluster,
    get_client,
    get_task_stream,
    wait,
    worker_client,
)
from distributed.worker import thread_state
from helpers.tiers import starts_processes

import prefect_dask_profiling.timing.client as timing_client
from prefect_dask_profiling import (
    collect,
    install,
    stage,
    summarise,
    uninstall,
    utilisation,
)
from prefect_dask_profiling.stages import running_task_annotations
from prefect_dask_profiling.timing import TaskTimings
from prefect_dask_profiling.timing.client import snapshot
from prefect_dask_profiling.timing.plugin import DEFAULT_STAGE, PARENT_ANNOTATION
from prefect_dask_profiling.timing.sketch import DEFAULT_ALPHA
from prefect_dask_profiling.timing.tasks import WrapperWait

pytestmark = pytest.mark.timeout(180)


# -- work run on the workers (importable by the spawned worker processes) ----------------


def slowinc(x: int, delay: float = 0.0) -> int:
    time.sleep(delay)
    return x + 1


def double(block):
    return block * 2


def fail(x: int) -> int:
    raise ValueError(f"boom {x}")


def inc_a(x: int) -> int:
    return x + 1


def inc_b(x: int) -> int:
    return x + 2


def wrapper(n: int, inner_stage: str | None = None, delay: float = 0.05) -> int:
    """A task that computes a collection inside (it secedes while it waits)."""
    with worker_client() as client:
        if inner_stage is None:
            return sum(client.gather(client.map(slowinc, range(n), delay=delay, pure=False)))
        with stage(inner_stage):
            return sum(client.gather(client.map(slowinc, range(n), delay=delay, pure=False)))


def busy(seconds: float) -> None:
    """Keep this thread busy for ``seconds`` (own work of known duration)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def tagged_wrapper(n: int, delay: float, own: float, mode: str) -> int:
    """A wrapper that tags its inner work with its own key, as the Prefect runner's copy does.

    ``mode``: ``"wait"`` blocks in ``wait()`` without seceding, ``"secede"`` uses
    ``worker_client``, ``"fail"`` waits on inner tasks that raise.
    """
    tags = {PARENT_ANNOTATION: thread_state.key}
    inherited = running_task_annotations().get("stage")
    if inherited:
        tags["stage"] = inherited
    busy(own)
    with dask.annotate(**tags):
        if mode == "secede":
            with worker_client() as client:
                total = sum(client.gather(client.map(slowinc, range(n), delay=delay,
                                                     pure=False)))
        else:
            client = get_client()
            func = fail if mode == "fail" else slowinc
            futures = client.map(func, range(n), pure=False)
            wait(futures)
            total = sum(f.result() for f in futures)  # raises for "fail"
    busy(own)
    return total


# -- fixtures ---------------------------------------------------------------------------


def _local_cluster(n_workers: int, threads: int) -> LocalCluster:
    return LocalCluster(n_workers=n_workers, threads_per_worker=threads, processes=True,
                        dashboard_address=":0", host="127.0.0.1")


@pytest.fixture(scope="module")
@starts_processes("a LocalCluster of worker processes")
def cluster():
    with _local_cluster(2, 2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as client:
        yield client


def _n_tasks(dask_scheduler) -> int:
    """Tasks still held or to run; erred ones a worker-side client still holds do not count."""
    return sum(ts.state != "erred" for ts in dask_scheduler.tasks.values())


def _settle(client, timeout: float = 30.0) -> None:
    """Wait until the previous test's work has finished on the scheduler."""
    deadline = time.monotonic() + timeout
    while client.run_on_scheduler(_n_tasks) and time.monotonic() < deadline:
        time.sleep(0.05)


def _removed(cluster, name: str, timeout: float = 10.0) -> bool:
    """Whether plugin ``name`` leaves the (in-process) scheduler within ``timeout``."""
    deadline = time.monotonic() + timeout
    while name in cluster.scheduler.plugins and time.monotonic() < deadline:
        time.sleep(0.02)
    return name not in cluster.scheduler.plugins


@pytest.fixture
def run(client):
    """A fresh cluster-scope plugin for one test."""
    _settle(client)
    name = install(client, sample_interval=0.2)
    yield name
    uninstall(client, name)


def _counts(record, table: str = "tasks") -> dict[tuple[str, str], int]:
    frame = getattr(record, table)
    return {(s, p): int(n) for s, p, n in zip(frame["stage"], frame["prefix"], frame["tasks"],
                                              strict=True)}


# -- agreement with Dask's own record ----------------------------------------------------


def _mixed_workload(client) -> None:
    x = da.random.RandomState(1).random((800, 800), chunks=200)
    y = ((x @ x.T) + x.mean(axis=0)).std()
    z = x.rechunk((300, 100)).sum(axis=1)
    dask.compute(y, z)
    client.gather(client.map(slowinc, range(40), pure=False))
    client.submit(slowinc, 1, key="plainstr-1").result()
    client.submit(slowinc, 2, key=("tuplekey", 2)).result()


def test_agrees_with_the_task_stream(client, run) -> None:
    with get_task_stream(client=client) as stream:
        _mixed_workload(client)
    record = collect(client, run)
    durations: dict[str, list[float]] = defaultdict(list)
    for row in stream.data:
        compute = sum(s["stop"] - s["start"] for s in row["startstops"]
                      if s["action"] == "compute")
        durations[key_split(row["key"])].append(compute)
    table = summarise(record, by="prefix").set_index("prefix")

    assert {p: len(d) for p, d in durations.items()} == table["tasks"].to_dict()
    assert {"plainstr", "tuplekey", "slowinc", "random_sample"} <= set(table.index)
    stream_total = sum(sum(d) for d in durations.values())
    assert table["total_s"].sum() == pytest.approx(stream_total, rel=0.01)
    for prefix, values in durations.items():
        for q, column in ((0.5, "p50_s"), (0.95, "p95_s")):
            low = np.quantile(values, q, method="lower")
            high = np.quantile(values, q, method="higher")
            value = table.loc[prefix, column]
            assert low * (1 - DEFAULT_ALPHA) <= value <= high * (1 + DEFAULT_ALPHA), prefix
    assert record.internal_errors == 0 and record.warnings == []
    assert record.orchestration.empty
    assert not record.samples.empty and len(record.workers) == 2
    util = utilisation(record)
    assert 0 < util.loc["run", "utilisation"] <= 1.05


# -- stages ---------------------------------------------------------------------------------


def test_same_function_in_two_stages_with_futures_and_arrays(client, run) -> None:
    with stage("first"):
        first = client.map(slowinc, range(8), delay=0.01)
        wait(first)
        da.ones((400, 400), chunks=100).map_blocks(double).sum().compute()
    # ``first`` is still alive: Dask's span for the shared "slowinc" TaskGroup stays "first"
    with stage("second"):
        second = client.map(slowinc, range(100, 108), delay=0.01)
        wait(second)
        da.ones((400, 800), chunks=100).map_blocks(double).sum().compute()
    del first, second
    # the ETA takes a stage close's counts from its snapshot: the same as the plugin's read
    _settle(client)
    read = timing_client.task_counts(client, run)
    assert timing_client.counts_of(snapshot(client, run)) == read
    assert read["first"]["slowinc"] == 8 and read["second"]["slowinc"] == 8
    counts = _counts(collect(client, run))
    assert counts[("first", "slowinc")] == 8
    assert counts[("second", "slowinc")] == 8
    array = {stage_: sum(n for (s, p), n in counts.items() if s == stage_ and p != "slowinc")
             for stage_ in ("first", "second")}
    # 16 blocks then 32 blocks, plus reductions: the second stage has more array tasks
    assert array["first"] >= 16 and array["second"] >= 32 and array["second"] > array["first"]
    assert {s for s, _ in counts} == {"first", "second"}


def test_lazy_graph_belongs_to_the_stage_that_computes_it(client, run) -> None:
    with stage("build"):
        lazy = (da.random.RandomState(2).random((300, 300), chunks=100) * 2).sum()
    with stage("compute"):
        lazy.compute()
    record = collect(client, run)
    assert set(record.tasks["stage"]) == {"compute"}
    assert record.stages == ["compute"]
    assert list(utilisation(record).index) == ["run", "compute"]


def test_the_cluster_size_comes_with_the_snapshot(client, run) -> None:
    """Workers and threads are read by the plugin with its snapshot (no round trip of
    their own); a snapshot of an earlier plugin without them is completed by asking."""
    cluster_size, snapshot = timing_client.cluster_size, timing_client.snapshot
    nthreads = client.nthreads()
    expected = (len(nthreads), sum(nthreads.values()))
    snap = snapshot(client, run)
    assert snap["cluster"] == {"workers": expected[0], "threads": expected[1]}
    assert cluster_size(client, snap) == expected
    del snap["cluster"]
    assert cluster_size(client, snap) == expected
    record = collect(client, run)
    assert (record.n_workers, record.threads) == expected


def test_erred_and_keyed_tasks(client, run) -> None:
    with stage("bad"):
        futures = client.map(fail, range(3))
        wait(futures)
        assert all(f.status == "error" for f in futures)
    with stage("keys"):
        client.submit(slowinc, 1, key="strkey-1").result()
        client.submit(slowinc, 2, key=("tupkey", 0)).result()
    table = summarise(collect(client, run)).set_index(["stage", "prefix"])
    # one rule for every column: erred runs are counted in tasks and their seconds in
    # total_s; errors says how many of those runs failed
    assert table.loc[("bad", "fail"), "errors"] == 3
    assert table.loc[("bad", "fail"), "tasks"] == 3
    assert table.loc[("bad", "fail"), "total_s"] > 0
    assert table.loc[("keys", "strkey"), "tasks"] == 1
    assert table.loc[("keys", "tupkey"), "tasks"] == 1


def test_wrapper_tasks_are_orchestration(client, run) -> None:
    with stage("outer"):
        futures = client.map(wrapper, [8] * 4, inner_stage=None, pure=False)
        assert client.gather(futures) == [sum(range(1, 9))] * 4
    record = collect(client, run)
    assert _counts(record, "orchestration") == {("outer", "wrapper"): 4}
    table = summarise(record)
    assert "wrapper" not in set(table["prefix"])
    assert table.set_index(["stage", "prefix"]).loc[(DEFAULT_STAGE, "slowinc"), "tasks"] == 32
    util = utilisation(record)
    assert util.loc["run", "utilisation"] <= 1.05
    # counting the wrappers as compute would have double-counted a large share
    assert record.orchestration["compute_s"].sum() > 0.5 * record.tasks["compute_s"].sum()


def test_stage_inside_a_worker_task(client, run) -> None:
    with stage("outer"):
        assert client.submit(wrapper, 5, inner_stage="inner", pure=False).result() == 15
    record = collect(client, run)
    assert _counts(record) == {("inner", "slowinc"): 5}
    assert _counts(record, "orchestration") == {("outer", "wrapper"): 1}


# -- wrappers that tag their inner work: own work vs waiting ---------------------------------


def _interval(row: dict) -> tuple[float, float]:
    spans = [(a["start"], a["stop"]) for a in row["startstops"] if a["action"] == "compute"]
    return min(a for a, _ in spans), max(b for _, b in spans)


def _live_wrappers(dask_scheduler, name: str) -> int:
    return len(dask_scheduler.plugins[name].tasks.wrappers)


@pytest.mark.parametrize("mode", ["wait", "secede"])
def test_tagged_wrapper_is_split_into_own_work_and_waiting(client, run, mode) -> None:
    n, delay, own = 6, 0.3, 0.2
    with get_task_stream(client=client) as stream, stage("outer"):
        assert client.submit(tagged_wrapper, n, delay, own, mode, pure=False).result() == 21
    record = collect(client, run)
    assert _counts(record) == {("outer", "slowinc"): n, ("outer", "tagged_wrapper"): 1}
    assert _counts(record, "orchestration") == {("outer", "tagged_wrapper"): 1}
    [wrapper] = [r for r in stream.data if key_split(r["key"]) == "tagged_wrapper"]
    start, stop = _interval(wrapper)
    inner = [_interval(r) for r in stream.data if key_split(r["key"]) == "slowinc"]
    inner_span = max(b for _, b in inner) - min(a for a, _ in inner)
    own_s = float(record.tasks.loc[record.tasks["prefix"] == "tagged_wrapper", "compute_s"].sum())
    waited = float(record.orchestration["compute_s"].sum())
    assert own_s + waited == pytest.approx(stop - start, abs=1e-6)
    assert waited >= inner_span - 0.05 and own_s >= 2 * own * 0.9
    assert utilisation(record).loc["outer", "utilisation"] <= 1.05
    assert client.run_on_scheduler(_live_wrappers, name=run) == 0  # state released


def test_failing_inner_work_closes_the_wait_and_counts_the_error(client, run) -> None:
    future = client.submit(tagged_wrapper, 3, 0.0, 0.1, "fail", pure=False)
    wait(future)
    assert future.status == "error"
    record = collect(client, run)
    tasks = record.tasks.set_index("prefix")
    orchestration = record.orchestration.set_index("prefix")
    assert tasks.loc["fail", "tasks"] == 3 and tasks.loc["fail", "errors"] == 3
    assert tasks.loc["tagged_wrapper", ["tasks", "errors"]].tolist() == [1, 1]
    assert orchestration.loc["tagged_wrapper", ["tasks", "errors"]].tolist() == [1, 1]
    assert tasks.loc["tagged_wrapper", "compute_s"] >= 0.1 * 0.9  # the loop before it raised
    assert client.run_on_scheduler(_live_wrappers, name=run) == 0


def test_wrapper_wait_merges_overlapping_batches() -> None:
    wait_ = WrapperWait()
    wait_.arrived(2, 10.0)
    wait_.arrived(1, 11.0)  # a second batch while the first still runs
    for t in (12.0, 13.0, 14.0):
        wait_.done(t)
    wait_.done(99.0)  # more completions than arrivals are ignored
    wait_.arrived(1, 20.0)
    assert wait_.total() == pytest.approx(4.0)  # the open batch has not completed yet
    wait_.done(21.5)
    assert wait_.total() == pytest.approx(5.5) and wait_.pending == 0


def test_unknown_parent_creates_no_state(client, run) -> None:
    with dask.annotate(**{PARENT_ANNOTATION: "no-such-wrapper-1"}):
        client.gather(client.map(slowinc, range(4), pure=False))
    record = collect(client, run)
    assert _counts(record) == {(DEFAULT_STAGE, "slowinc"): 4}
    assert record.orchestration.empty and record.internal_errors == 0
    assert client.run_on_scheduler(_live_wrappers, name=run) == 0


# -- the seceded-task listener validates before it records -----------------------------------


def _send_long_running(dask_scheduler, key, worker, run_id) -> None:
    dask_scheduler.stream_handlers["long-running"](
        key=key, worker=worker, run_id=run_id, compute_duration=None, stimulus_id="test")


def _processing(dask_scheduler, key):
    ts = dask_scheduler.tasks.get(key)
    if ts is None or ts.processing_on is None:
        return None
    return ts.processing_on.address, ts.run_id


def _wait_processing(client, key: str) -> tuple[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = client.run_on_scheduler(_processing, key=key)
        if found is not None:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{key} never started")


def _seceded(dask_scheduler, name: str) -> dict:
    return dict(dask_scheduler.plugins[name].seceded)


def _mark(dask_scheduler, name: str, key, run_id) -> None:
    dask_scheduler.plugins[name].seceded[key] = run_id


def test_stale_long_running_messages_are_not_recorded(client, run) -> None:
    client.run_on_scheduler(_send_long_running, key="ghost-1", worker="tcp://127.0.0.1:9",
                            run_id=1)
    stale = client.submit(slowinc, 1, delay=0.5, key="stale-1")
    marked = client.submit(slowinc, 2, delay=0.5, key="marked-1")
    worker, run_id = _wait_processing(client, "stale-1")
    client.run_on_scheduler(_send_long_running, key="stale-1", worker=worker,
                            run_id=run_id + 1000)
    other = next(w for w in client.nthreads() if w != worker)
    client.run_on_scheduler(_send_long_running, key="stale-1", worker=other, run_id=run_id)
    worker_m, run_id_m = _wait_processing(client, "marked-1")
    client.run_on_scheduler(_send_long_running, key="marked-1", worker=worker_m,
                            run_id=run_id_m)
    assert client.run_on_scheduler(_seceded, name=run) == {"marked-1": run_id_m}
    client.gather([stale, marked])
    record = collect(client, run)
    assert _counts(record) == {(DEFAULT_STAGE, "stale"): 1}
    assert _counts(record, "orchestration") == {(DEFAULT_STAGE, "marked"): 1}
    assert client.run_on_scheduler(_seceded, name=run) == {}


def test_a_rerun_does_not_inherit_an_earlier_runs_mark(client, run) -> None:
    future = client.submit(slowinc, 1, delay=0.5, key="again-1")
    _, run_id = _wait_processing(client, "again-1")
    client.run_on_scheduler(_mark, name=run, key="again-1", run_id=run_id - 1)
    future.result()
    record = collect(client, run)
    assert _counts(record) == {(DEFAULT_STAGE, "again"): 1}
    assert record.orchestration.empty


# -- robustness -----------------------------------------------------------------------------


def _break_stats(dask_scheduler, name: str) -> None:
    def broken(stage, key, ts, table):
        raise RuntimeError("forced failure in _stats_in")

    dask_scheduler.plugins[name].tasks._stats_in = broken  # every task's aggregates


def test_internal_errors_are_counted_not_raised(client, run) -> None:
    client.run_on_scheduler(_break_stats, name=run)
    futures = client.map(slowinc, range(20), pure=False)
    assert client.gather(futures) == list(range(1, 21))
    assert da.ones(100, chunks=10).sum().compute() == 100
    record = collect(client, run)
    assert record.internal_errors >= 20
    assert any("internal error" in w and "forced failure" in w for w in record.warnings)
    assert record.tasks.empty


def test_malformed_transitions_never_raise() -> None:
    plugin = TaskTimings("direct", sample_interval=0)  # no scheduler, keys it does not know
    plugin.transition("x-1", "processing", "memory", startstops=({"action": "compute"},),
                      worker="w", stimulus_id="s")
    plugin.transition(("x", 2), "processing", "memory", startstops="nonsense", stimulus_id="s")
    plugin.transition("x-3", "processing", "erred", startstops=None, stimulus_id="s")
    plugin.transition(None, "processing", "memory", stimulus_id="s")
    plugin.transition("x-4", "released", "waiting")
    snap = plugin.snapshot()
    assert snap["internal_errors"] == 2 and "AttributeError" in snap["last_error"]
    counts = {(r["stage"], r["prefix"]): (r["tasks"], r["errors"]) for r in snap["tasks"]}
    assert counts == {(DEFAULT_STAGE, "x"): (1, 1), (DEFAULT_STAGE, "Other"): (1, 0)}


def test_cancelled_task_is_not_a_rerun(client, run) -> None:
    future = client.submit(slowinc, 1, delay=2.0, pure=False)
    deadline = time.monotonic() + 30
    while not any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    future.cancel()
    client.gather(client.map(slowinc, range(3), pure=False))
    assert summarise(collect(client, run))["reruns"].sum() == 0


def test_late_registration_is_warned(client) -> None:
    _settle(client)
    futures = client.map(slowinc, range(6), delay=0.3, pure=False)
    wait(futures[:1])
    name = install(client, sample_interval=0)
    try:
        wait(futures)
        record = collect(client, name)
    finally:
        uninstall(client, name)
    assert any("registered after work started" in w for w in record.warnings)


def test_on_time_registration_has_no_warning(client, run) -> None:
    client.gather(client.map(slowinc, range(3), pure=False))
    assert collect(client, run).warnings == []


def test_pickling_and_uninstall(cluster, client) -> None:
    fresh = pickle.loads(pickle.dumps(TaskTimings("p", "client-1", 0.5)))
    assert (fresh.name, fresh.owner_client, fresh.installer) == ("p", "client-1", "client-1")
    name = install(client, sample_interval=0.1)
    live = cluster.scheduler.plugins[name]  # the scheduler runs in this process
    client.gather(client.map(slowinc, range(3), pure=False))
    copy = cloudpickle.loads(cloudpickle.dumps(live))
    assert copy.scheduler is None and copy.scope.scheduler is None and copy._pc is None
    assert copy.tasks.stats.keys() == live.tasks.stats.keys()
    pc = live._pc
    assert pc is not None and pc.is_running()
    assert uninstall(client, name) is True
    assert not pc.is_running() and name not in cluster.scheduler.plugins
    assert uninstall(client, name) is False
    with pytest.raises(KeyError, match=name):
        snapshot(client, name)


def test_close_stops_the_sampler(cluster, client, run) -> None:
    live = cluster.scheduler.plugins[run]
    pc = live._pc
    assert pc.is_running()
    client.sync(live.close)
    assert not pc.is_running()


def test_install_rejects_bad_arguments(client) -> None:
    with pytest.raises(ValueError, match="scope"):
        install(client, scope="everything")
    with pytest.raises(ValueError, match="sample_interval"):
        install(client, sample_interval=-1)


def test_two_runs_share_a_cluster(cluster) -> None:
    results: dict[str, object] = {}
    start = threading.Barrier(2)

    def one_run(label: str, func) -> None:
        with Client(cluster) as own:
            name = install(own, scope="run", sample_interval=0.2, task_records=True)
            plugin = cluster.scheduler.plugins[name]
            start.wait(timeout=30)
            with stage(f"stage-{label}"):
                own.gather(own.map(func, range(30), pure=False))
                seed = 10 if label == "a" else 20
                da.random.RandomState(seed).random((400, 400), chunks=100).sum().compute()
                own.submit(wrapper, 4, inner_stage=f"inner-{label}", pure=False).result()
            results[label] = collect(own, name)
            held = plugin.tasks.records
            results[label + "-records"] = [key_split(r[0])
                                           for r in held.page(0, held.index, held.index)[1]]
            pc = plugin._pc
        # the owning client disconnected: the plugin removed itself and stopped sampling
        results[label + "-gone"] = _removed(cluster, name) and not pc.is_running()

    threads = [threading.Thread(target=one_run, args=("a", inc_a)),
               threading.Thread(target=one_run, args=("b", inc_b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for label, mine, theirs in (("a", "inc_a", "inc_b"), ("b", "inc_b", "inc_a")):
        record = results[label]
        counts = _counts(record)
        assert counts[(f"stage-{label}", mine)] == 30
        assert counts[(f"inner-{label}", "slowinc")] == 4
        assert not any(p == theirs or s.endswith("-" + ("b" if label == "a" else "a"))
                       for s, p in counts)
        assert _counts(record, "orchestration") == {(f"stage-{label}", "wrapper"): 1}
        assert results[label + "-gone"] is True
        # the stage reports' task stream: this run's tasks only, as many as it counted
        records = results[label + "-records"]
        assert records.count(mine) == 30 and theirs not in records
        assert len(records) == sum(counts.values()) + 1  # and the wrapper, orchestration


# -- worker churn ------------------------------------------------------------------------------


def _hand_thread_seconds(timeline, start: float, stop: float) -> float:
    total = 0.0
    for i, (t, n) in enumerate(timeline):
        t_next = timeline[i + 1][0] if i + 1 < len(timeline) else float("inf")
        lo, hi = max(t, start), min(t_next, stop)
        if hi > lo:
            total += (hi - lo) * n
    return total


@pytest.mark.slow  # > 10 s
def test_utilisation_follows_workers_joining_and_leaving() -> None:
    with _local_cluster(1, 1) as cluster, Client(cluster) as client:
        name = install(client, sample_interval=0.2)
        pc = cluster.scheduler.plugins[name]._pc
        client.gather(client.map(slowinc, range(4), delay=0.1, pure=False))
        cluster.scale(2)
        client.wait_for_workers(2, timeout=60)
        client.gather(client.map(slowinc, range(10), delay=0.1, pure=False))
        cluster.scale(1)
        deadline = time.monotonic() + 60
        while len(client.nthreads()) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.gather(client.map(slowinc, range(4), delay=0.1, pure=False))
        record = collect(client, name)
        assert pc.is_running()
        client.close()
        # the installing client disconnected: the plugin stopped and removed itself
        assert _removed(cluster, name) and not pc.is_running()

    start, stop = record.window()
    inside = [n for t, n in record.timeline if start < t < stop]
    assert 2 in inside and inside[-1] == 1
    util = utilisation(record).loc["run"]
    assert util["thread_s"] == pytest.approx(_hand_thread_seconds(record.timeline, start, stop))
    assert util["wall_s"] < util["thread_s"] < 2 * util["wall_s"]
    assert summarise(record)["tasks"].sum() == 18
    assert util["utilisation"] <= 1.05


@pytest.mark.slow  # > 10 s
def test_killed_worker_reruns_are_counted() -> None:
    with _local_cluster(2, 1) as cluster, Client(cluster) as client:
        name = install(client, sample_interval=0.2)
        futures = client.map(slowinc, range(30), delay=0.2, pure=False)
        pids = client.run(os.getpid)
        victim = sorted(pids)[0]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = sum(f.done() for f in futures)
            if done >= 4 and client.processing().get(victim):
                break
            time.sleep(0.02)
        os.kill(pids[victim], signal.SIGKILL)
        assert client.gather(futures) == list(range(1, 31))
        record = collect(client, name)
        uninstall(client, name)
    table = summarise(record)
    assert list(table["prefix"]) == ["slowinc"]
    tasks, reruns = int(table["tasks"].sum()), int(table["reruns"].sum())
    assert reruns >= 1
    # every rerun finished at most once more than needed; nothing was lost
    assert 30 <= tasks <= 30 + reruns
    assert min(n for _, n in record.timeline) < max(n for _, n in record.timeline)
    assert utilisation(record).loc["run", "utilisation"] <= 1.05


# -- memory: bounded by stages x prefixes, not by task count --------------------------------


def _feed(plugin: TaskTimings, start: int, n: int) -> None:
    for i in range(start, start + n):
        prefix = f"op{i % 50}"
        key = (f"{prefix}-0123456789abcdef0123456789abcdef", i) if i % 2 else f"{prefix}-{i:032x}"
        t = 1e6 + i * 1e-3
        seconds = 1e-4 * (1 + (i * 7919) % 1000)
        plugin.transition(key, "processing", "memory",
                          startstops=({"action": "compute", "start": t, "stop": t + seconds},),
                          nbytes=8000, worker=f"tcp://127.0.0.1:{4000 + i % 4}",
                          stimulus_id=f"task-finished-{t}")


@pytest.mark.slow  # > 10 s
def test_memory_does_not_grow_with_task_count() -> None:
    plugin = TaskTimings("mem", sample_interval=0)  # no scheduler: keys it does not know
    # count only what the plugin's own code allocates: other threads of this test process
    # (clusters of session fixtures) allocate too, and are not the plugin's memory
    ours = [tracemalloc.Filter(True, importlib.import_module(name).__file__)
            for name in timing_client.BY_VALUE]

    def held() -> int:
        gc.collect()
        return sum(s.size for s in tracemalloc.take_snapshot().filter_traces(ours).statistics(
            "filename"))

    tracemalloc.start()
    try:
        base = held()
        _feed(plugin, 0, 100_000)
        first = held() - base
        _feed(plugin, 100_000, 100_000)
        second = held() - base
    finally:
        tracemalloc.stop()
    # the seed's list of dicts costs ~230 B per task: 46 MB for these 200k tasks
    assert second < 4 * 2**20
    assert second - first < 0.1 * first + 64 * 1024
    assert sum(s.tasks for s in plugin.tasks.stats.values()) == 200_000
    assert len(plugin.tasks.stats) == 50
    assert plugin.internal_errors == 0


def _spin(steps: int) -> int:
    total = 0
    for i in range(steps):
        total = (total * 31 + i) % 1_000_003
    return total


def test_each_stage_gets_the_scheduler_loops_cpu_while_it_ran(client, run) -> None:
    with stage("many"):
        client.gather(client.map(inc_a, range(3000), pure=False))
    with stage("few"):
        client.gather(client.map(_spin, [2_000_000] * 4, pure=False))
    record = collect(client, run)
    many, few = record.scheduler["many"], record.scheduler["few"]
    assert many["seconds"] > 0 and few["seconds"] > 0
    assert many["loop_cpu_s"] > 0 and few["loop_cpu_s"] >= 0
    # scheduling 3,000 tasks costs the loop more per second than 4 long ones
    assert many["loop_cpu_s"] / many["seconds"] > few["loop_cpu_s"] / few["seconds"], \
        record.scheduler
    if sys.platform == "linux":
        assert many["loop_wait_s"] is not None and many["loop_wait_s"] >= 0


def test_worker_lifetimes_as_the_cluster_scales() -> None:
    """Workers present at registration keep their arrival (from the scheduler's event
    log); later ones open and close a lifetime with their threads, memory and name."""
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=2, memory_limit="1GiB",
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        first = next(iter(cluster.scheduler.workers))
        before = time.time()
        name = install(client)
        cluster.scale(3)
        # the scheduler's own table, not Cluster.wait_for_workers: that reads the cluster's
        # copy (scheduler_info), which read 0 of 3 for 60 s under a CPU hog (a fresh-clone run)
        deadline = time.time() + 120
        while len(cluster.scheduler.workers) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert len(cluster.scheduler.workers) == 3, "the cluster did not scale to 3"
        added = set(cluster.scheduler.workers) - {first}
        cluster.scale(1)
        deadline = time.time() + 60
        while len(cluster.scheduler.workers) > 1 and time.time() < deadline:
            time.sleep(0.05)
        lives = {entry["worker"]: entry for entry in snapshot(client, name)["lifetimes"]}
        uninstall(client, name)
    assert set(lives) == {first, *added}
    assert lives[first]["start_known"] and lives[first]["arrived"] < before
    assert all(e["nthreads"] == 2 and e["memory_limit"] == 2 ** 30 for e in lives.values())
    departed = [w for w, e in lives.items() if e["departed"] is not None]
    assert len(departed) == 2
    assert all(lives[w]["departed"] > lives[w]["arrived"] for w in departed)
    assert all(isinstance(e["name"], str) and e["name"] for e in lives.values())


def test_worker_lifetimes_keep_the_workers_resource_tags() -> None:
    """A worker started with ``resources`` carries them in its lifetime (what
    ``cost={"resources": ...}`` prices by)."""
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1,
                      resources={"GPU": 1}, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        name = install(client)
        [entry] = snapshot(client, name)["lifetimes"]
        uninstall(client, name)
    assert entry["resources"] == {"GPU": 1.0}
