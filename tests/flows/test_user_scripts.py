"""Flows run the way users run them: scripts in a fresh folder, started as subprocesses.

A user's flow is a script run as ``python flow.py``: it is ``__main__``, so cloudpickle
sends its functions to the workers **by value**, with every global they use (the package
module among them, ``import prefect_dask_profiling as pdp``). Every other flow under test
lives in an importable module, which cloudpickle sends by reference: this file is where the
by-value path is exercised, on real ``dask worker`` processes (so pickling is real) and a real
Prefect server. The scripts' folders are on no worker's path: what a worker runs of them
arrives pickled.

The deployed-from-a-file case (a process worker runs ``flows/nightly_ndvi.py``) is
``tests/flows/test_deployment.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.dask_processes import external_cluster
from helpers.tiers import starts_processes
from prefect.client.orchestration import get_client

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240

# The top of every script: the runner connects to the module's `dask worker` processes.
FROM_IMPORTS = """\
import os
from prefect import flow, task
from prefect_dask_profiling import ProfiledDaskTaskRunner, profiled, stage

RUNNER = ProfiledDaskTaskRunner(address=os.environ["DASK_ADDRESS"], stage_reports=False)
"""
MODULE_IMPORT = """\
import os
from prefect import flow, task
import prefect_dask_profiling as pdp

RUNNER = pdp.ProfiledDaskTaskRunner(address=os.environ["DASK_ADDRESS"], stage_reports=False)
"""


@pytest.fixture(scope="module")
@starts_processes("dask scheduler and worker processes")
def workers(tmp_path_factory, prefect_server):
    """Two single-thread ``dask worker`` processes; the pkg/ folder is on their path (for
    ``python -m pkg.flow``), the scripts' folders are not."""
    modules = tmp_path_factory.mktemp("modules")
    with external_cluster(tmp_path_factory.mktemp("cluster"), n_workers=2,
                          pythonpath=(str(ROOT), str(modules))) as cluster:
        yield cluster, modules


def run_python(folder: Path, args: list[str], server, address: str,
               path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python *args`` in ``folder``, against the real server and cluster, with this
    checkout (and ``path``) importable."""
    env = server.client_env()
    env.update(DASK_ADDRESS=address, PYTHONPATH=os.pathsep.join([str(ROOT), *path]),
               DASK_PROFILING_SPOOL=str(folder / "spool"))
    return subprocess.run([sys.executable, *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)


def run_script(folder: Path, code: str, server, address: str,
               *args: str) -> subprocess.CompletedProcess:
    """Write ``code`` to ``folder/flow.py`` and run it as users do: ``python flow.py``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "flow.py").write_text(textwrap.dedent(code), encoding="utf-8")
    return run_python(folder, ["flow.py", *args], server, address)


def stored(folder: Path, pipeline: str) -> list[dict]:
    """The manifests the run stored in the default store (``./.dask-profiling``)."""
    runs = folder / ".dask-profiling" / "runs" / pipeline
    return [json.loads((run / "manifest.json").read_text()) for run in sorted(runs.iterdir())
            if (run / "manifest.json").exists()] if runs.exists() else []


def final_state(manifest: dict) -> str:
    """The flow run's final state as the Prefect server has it."""
    with get_client(sync_client=True) as client:
        return client.read_flow_run(manifest["flow_run_id"]).state.type.value


def prefixes(folder: Path, manifest: dict) -> dict[str, int]:
    """Tasks per key prefix in the run's stored ``tasks.csv``."""
    import pandas as pd

    path = folder / ".dask-profiling" / "runs" / manifest["pipeline"] / manifest["run_id"]
    table = pd.read_csv(path / "tasks.csv")
    return table.groupby("prefix")["tasks"].sum().astype(int).to_dict()


def completed(done: subprocess.CompletedProcess, folder: Path, pipeline: str) -> dict:
    """The one stored run of a script that must have completed, checked on the server."""
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    manifests = stored(folder, pipeline)
    assert len(manifests) == 1, (manifests, done.stderr[-3000:])
    assert manifests[0]["status"] in {"healthy", "insufficient-history"}, manifests[0]
    assert final_state(manifests[0]) == "COMPLETED"
    return manifests[0]


# -- both import styles, tasks and helpers defined in __main__ -------------------------------
MAIN_TASKS = """
import threading

OFFSET = 3           # a global of __main__: travels with the task that reads it


def helper(x: int) -> int:          # a plain function of __main__, used by a task
    return x * x + OFFSET


@task
def square(x: int) -> int:
    return helper(x)


@flow(name="{name}", task_runner=RUNNER)
@{prefix}profiled
def nightly(n: int = 6) -> int:
    with {prefix}stage("squares"):
        return sum(square.map(range(n)).result())


if __name__ == "__main__":
    import sys
    assert nightly() == sum(x * x + OFFSET for x in range(6))
    print("bokeh loaded:", "bokeh" in sys.modules)
"""


@pytest.mark.parametrize("style, header, prefix", [
    ("module", MODULE_IMPORT, "pdp."),
    ("names", FROM_IMPORTS, ""),
])
def test_a_main_script_with_tasks_and_helpers_completes(workers, prefect_server, tmp_path,
                                                        style, header, prefix):
    cluster, _ = workers
    name = f"user-main-{style}"
    done = run_script(tmp_path, header + MAIN_TASKS.format(name=name, prefix=prefix),
                      prefect_server, cluster.address)
    manifest = completed(done, tmp_path, name)
    assert prefixes(tmp_path, manifest).get("square", 0) == 6, prefixes(tmp_path, manifest)
    assert "cannot be pickled" not in done.stderr
    # no report asked for, a night that flags nothing: no trend page, so no Bokeh is loaded
    # (a new process pays ~1.3 CPU-s for it every night: docs/scaling.md, cold runs)
    assert "bokeh loaded: False" in done.stdout, done.stdout[-2000:]


# -- a flow built in a factory, an unpicklable object in its closure -------------------------
FACTORY = """
import threading
from prefect_dask import get_dask_client


@task
def double(x: int) -> int:
    return 2 * x


def make_flow(with_task: bool):
    lock = threading.Lock()      # cannot be pickled: the flow holds it in its closure

    @flow(name="{name}", task_runner=RUNNER)
    @profiled
    def nightly() -> int:
        with lock, stage("body"):
            with get_dask_client() as client:
                total = client.compute(client.map(lambda x: x + 1, range(8), pure=False))
                value = sum(client.gather(total))
        if with_task:
            with stage("task"):
                value += double.submit(value).result()
        return value

    return nightly


if __name__ == "__main__":
    import sys
    print("result", make_flow(sys.argv[-1] == "task")())
"""


def test_a_factory_flow_with_a_lock_and_dask_work_in_its_body_completes(
        workers, prefect_server, tmp_path):
    """Nothing is sent to the workers but the body's Dask work: the unpicklable lock is one
    warning naming it, and the run completes (it failed at preflight before)."""
    cluster, _ = workers
    name = "user-factory-body"
    done = run_script(tmp_path, FROM_IMPORTS + FACTORY.format(name=name), prefect_server,
                      cluster.address)
    manifest = completed(done, tmp_path, name)
    assert "result 36" in done.stdout
    warnings = re.findall(r"closure variable 'lock'", done.stdout + done.stderr)
    assert len(warnings) == 1, done.stderr[-3000:]
    assert "lambda" in prefixes(tmp_path, manifest), prefixes(tmp_path, manifest)


def test_a_factory_flow_with_a_lock_fails_at_its_first_task_naming_the_lock(
        workers, prefect_server, tmp_path):
    """The same flow submitting a Prefect task: the task needs the flow, which cannot travel.
    The run fails at that submission with the package's error naming the object and the fix,
    not a bare ``TypeError`` from inside distributed; what ran before is stored."""
    cluster, _ = workers
    name = "user-factory-task"
    done = run_script(tmp_path, FROM_IMPORTS + FACTORY.format(name=name), prefect_server,
                      cluster.address, "task")
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Unpicklable" in done.stderr and "closure variable 'lock'" in done.stderr, (
        done.stderr[-4000:])
    assert "Create such an object inside the task" in done.stderr
    manifests = stored(tmp_path, name)
    assert len(manifests) == 1 and manifests[0]["status"] == "failed", manifests
    assert final_state(manifests[0]) == "FAILED"


# -- decorator order -------------------------------------------------------------------------
def test_profiled_above_flow_is_refused_with_the_fix(workers, prefect_server, tmp_path):
    cluster, _ = workers
    code = FROM_IMPORTS + """
@profiled
@flow(name="user-reversed", task_runner=RUNNER)
def nightly() -> int:
    return 1


if __name__ == "__main__":
    nightly()
"""
    done = run_script(tmp_path, code, prefect_server, cluster.address)
    assert done.returncode != 0
    assert "InvalidInput: @profiled is above @flow on 'user-reversed'" in done.stderr, (
        done.stderr[-3000:])


# -- python -m pkg.flow: the flow's module is importable, sent by reference ------------------
PACKAGED = """
import prefect_dask_profiling as pdp
from prefect import flow, task

from pkg.helpers import cube

import os
RUNNER = pdp.ProfiledDaskTaskRunner(address=os.environ["DASK_ADDRESS"], stage_reports=False)


@task
def cubed(x: int) -> int:
    return cube(x)


@flow(name="user-packaged", task_runner=RUNNER)
@pdp.profiled
def nightly(n: int = 4) -> int:
    with pdp.stage("cubes"):
        return sum(cubed.map(range(n)).result())


if __name__ == "__main__":
    assert nightly() == sum(x ** 3 for x in range(4))
"""


def test_python_dash_m_on_a_package_the_workers_import(workers, prefect_server, tmp_path):
    cluster, modules = workers
    pkg = modules / "pkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("def cube(x):\n    return x ** 3\n")
    (pkg / "flow.py").write_text(textwrap.dedent(PACKAGED))
    done = run_python(tmp_path, ["-m", "pkg.flow"], prefect_server, cluster.address,
                      path=(str(modules),))
    manifest = completed(done, tmp_path, "user-packaged")
    assert prefixes(tmp_path, manifest).get("cubed", 0) == 4


# -- the README's adoption snippet, verbatim, in both import styles --------------------------
def readme_adoption_blocks() -> list[str]:
    """The python blocks of README.md's "Adopt it" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Adopt it", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```python\n(.*?)^```", section, re.M | re.S)


def test_the_readme_shows_both_import_styles():
    blocks = readme_adoption_blocks()
    assert len(blocks) == 2, blocks
    assert "from prefect_dask_profiling import" in blocks[0]
    assert "import prefect_dask_profiling as pdp" in blocks[1]


@pytest.mark.parametrize("which", [0, 1], ids=["names", "module"])
def test_the_readme_snippet_verbatim_on_process_workers(prefect_server, tmp_path, which):
    """As printed: ``ProfiledDaskTaskRunner()`` makes prefect-dask's default cluster, a
    ``LocalCluster`` of worker processes."""
    code = readme_adoption_blocks()[which]
    done = run_script(tmp_path, code, prefect_server, address="")
    manifest = completed(done, tmp_path, "nightly")
    assert prefixes(tmp_path, manifest).get("square", 0) == 4
