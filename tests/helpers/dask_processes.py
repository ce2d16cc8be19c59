"""Real ``dask scheduler`` / ``dask worker`` processes on 127.0.0.1 for tests.

::

    with external_cluster(tmp_path, n_workers=2) as cluster:
        cluster.address, cluster.worker_pids(), cluster.kill_scheduler(), cluster.logs()

The processes can import this repository and the ``tests`` folder (``PYTHONPATH``), write
their logs to files in ``workdir`` (so tests can search them) and are always stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from helpers.processes import stop_process_group

TESTS = str(Path(__file__).parents[1])
ROOT = str(Path(__file__).parents[2])


@dataclass
class ExternalCluster:
    """A running scheduler and its workers."""

    address: str
    workdir: Path
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)

    def client(self, **kwargs):
        """A new ``distributed.Client`` connected to the scheduler (close it yourself)."""
        from distributed import Client

        return Client(self.address, timeout=30, **kwargs)

    def worker_pids(self) -> dict[str, int]:
        """``{worker address: pid}`` of the worker processes (not their nannies)."""
        with self.client() as client:
            return client.run(os.getpid)

    def wait_for_workers(self, n: int, timeout: float = 60) -> None:
        with self.client() as client:
            client.wait_for_workers(n, timeout=timeout)

    def kill_scheduler(self) -> None:
        """SIGKILL the scheduler process (its workers notice and keep retrying)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.scheduler.pid, signal.SIGKILL)
        self.scheduler.wait(10)

    def logs(self) -> str:
        """Everything the scheduler and worker processes wrote so far."""
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.workdir.glob("*.log")))


@contextlib.contextmanager
def external_cluster(workdir: str | os.PathLike, n_workers: int = 2, nthreads: int = 1,
                     ready_timeout: float = 60,
                     pythonpath: tuple[str, ...] = (ROOT, TESTS)) -> Iterator[ExternalCluster]:
    """Start ``dask scheduler`` and ``n_workers`` ``dask worker`` processes; stop them after.

    ``pythonpath`` is what the processes can import besides the venv (drop ``TESTS`` for
    workers that cannot load the test flows).
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    scheduler_file = workdir / "scheduler.json"
    dask = str(Path(sys.executable).parent / "dask")
    procs: list[subprocess.Popen] = []

    def spawn(args: list[str], log: str) -> subprocess.Popen:
        with open(workdir / log, "wb") as out:
            proc = subprocess.Popen([dask, *args], env=env, cwd=workdir, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        procs.append(proc)
        return proc

    try:
        scheduler = spawn(["scheduler", "--host", "127.0.0.1", "--port", "0",
                           "--dashboard-address", ":0", "--scheduler-file",
                           str(scheduler_file)], "scheduler.log")
        deadline = time.monotonic() + ready_timeout
        while not scheduler_file.exists():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start: "
                                   f"{(workdir / 'scheduler.log').read_text()[-2000:]}")
            time.sleep(0.1)
        workers = [spawn(["worker", "--scheduler-file", str(scheduler_file), "--nthreads",
                          str(nthreads), "--host", "127.0.0.1", "--dashboard-address", ":0",
                          "--local-directory", str(workdir / f"w{i}")], f"worker{i}.log")
                   for i in range(n_workers)]
        import json

        address = json.loads(scheduler_file.read_text())["address"]
        cluster = ExternalCluster(address, workdir, scheduler, workers)
        cluster.wait_for_workers(n_workers, timeout=ready_timeout)
        yield cluster
    finally:
        for proc in reversed(procs):  # workers first, then the scheduler
            stop_process_group(proc, grace=15)


