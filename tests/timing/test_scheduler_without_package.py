"""The scheduler (and workers) need not have prefect_dask_profiling installed.

A real ``dask scheduler`` and ``dask worker`` run in subprocesses whose import system refuses
the package (it is installed editable in .venv, so a ``sys.meta_path`` blocker hides it);
install() sends the plugin by value and collect() still returns real timings.
"""

from __future__ import annotations

import json
import operator
import pickle
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import dask.array as da
import pytest
from distributed import Client
from helpers.tiers import starts_processes

from prefect_dask_profiling import collect, install, stage, summarise, uninstall, utilisation
from prefect_dask_profiling.timing import client as timing_client
from prefect_dask_profiling.timing.plugin import TaskTimings

pytestmark = pytest.mark.timeout(180)

PACKAGE = "prefect_dask_profiling"
LAUNCHER = f"""
import sys

class _Blocker:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == {PACKAGE!r} or name.startswith({PACKAGE!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
        return None

sys.meta_path.insert(0, _Blocker)
from dask.__main__ import main

sys.argv = ["dask", *sys.argv[1:]]
sys.exit(main())
"""


BLOCKED = LAUNCHER.split("from dask.__main__")[0]
UNPICKLE = BLOCKED + """
import json
import cloudpickle

plugin, read_counts = cloudpickle.loads(sys.stdin.buffer.read())
plugin.transition("more-1", "processing", "memory", worker="w", startstops=(
    {"action": "compute", "start": 2.0, "stop": 3.0},))
snap = plugin.snapshot()
print(json.dumps({"tasks": sorted((r["prefix"], r["tasks"]) for r in snap["tasks"]),
                  "transfers": len(snap["transfers"]), "errors": snap["internal_errors"],
                  "counts": plugin.task_counts(), "modules": sorted(
                      m for m in sys.modules if m.startswith("prefect_dask_profiling"))}))
"""


def test_every_module_the_plugin_uses_is_sent_by_value() -> None:
    """A plugin with state in its streams, pickled as install() sends it, loads and runs in
    a process that cannot import the package (no cluster: the pickle alone)."""
    timing_client._register_by_value()
    plugin = TaskTimings("p", sample_interval=0)
    plugin.transition("inc-1", "processing", "memory", worker="w", nbytes=8, startstops=(
        {"action": "transfer", "start": 0.5, "stop": 1.0, "source": "v"},
        {"action": "compute", "start": 1.0, "stop": 2.0}))
    data = cloudpickle.dumps((plugin, timing_client._task_counts),
                             protocol=pickle.HIGHEST_PROTOCOL)
    done = subprocess.run([sys.executable, "-c", UNPICKLE], input=data, capture_output=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    out = json.loads(done.stdout)
    assert out == {"tasks": [["inc", 1], ["more", 1]], "transfers": 1, "errors": 0,
                   "counts": {"default": {"inc": 1, "more": 1}}, "modules": []}
    assert set(timing_client.BY_VALUE) <= set(cloudpickle.list_registry_pickle_by_value())


def _spawn(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], cwd=cwd,
                                stdout=out, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture
@starts_processes("dask scheduler and worker processes")
def foreign_cluster(tmp_path: Path):
    """Scheduler file of a ``dask scheduler`` + ``dask worker`` that cannot import us."""
    scheduler_file = tmp_path / "scheduler.json"
    procs = [_spawn(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(scheduler_file)], tmp_path,
                    tmp_path / "scheduler.log")]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(_spawn(["worker", address, "--nthreads", "2", "--no-nanny",
                             "--no-dashboard", "--host", "127.0.0.1",
                             "--local-directory", str(tmp_path)], tmp_path,
                            tmp_path / "worker.log"))
        yield scheduler_file
    finally:
        for proc in reversed(procs):
            _stop(proc)


def test_install_and_collect_without_the_package(foreign_cluster: Path) -> None:
    def try_import() -> str:  # local function: cloudpickled by value
        try:
            __import__(PACKAGE)
        except ImportError as exc:
            return type(exc).__name__
        return "imported"

    with Client(scheduler_file=str(foreign_cluster), timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
        assert client.run_on_scheduler(try_import) == "ModuleNotFoundError"
        assert set(client.run(try_import).values()) == {"ModuleNotFoundError"}

        name = install(client, sample_interval=0.2)
        with stage("arrays"):
            total = da.ones((400, 400), chunks=100).sum().compute()
        with stage("futures"):
            futures = client.map(operator.neg, range(25), pure=False)
            values = client.gather(futures)
        del futures
        time.sleep(0.5)  # let the sampler see the worker at least once more
        record = collect(client, name)
        assert uninstall(client, name) is True

    assert total == 160_000 and values == [-i for i in range(25)]
    table = summarise(record).set_index(["stage", "prefix"])
    assert table.loc[("futures", "neg"), "tasks"] == 25
    # ones fused into the first sum: 16 blocks, 4 partial sums, 1 aggregate (+ finalize)
    assert table.loc[("arrays", "sum"), "tasks"] == 16
    assert table.loc[("arrays", "sum-aggregate"), "tasks"] == 1
    assert (table["total_s"] > 0).all()
    assert record.internal_errors == 0 and record.warnings == []
    assert len(record.workers) == 1 and not record.samples.empty
    assert record.threads == 2
    assert 0 < utilisation(record).loc["run", "utilisation"] <= 1.05
