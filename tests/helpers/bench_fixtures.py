"""Real clusters for the bench tests: ``dask scheduler`` / ``dask worker`` subprocesses on
127.0.0.1, and the netns cluster (workers as separate network hosts behind rate-limited links)
with what its workers need from this host: an S3 server on its host-side address, and a relay
to the Prefect API.

Every process started here is stopped by the context manager that started it (by its own
pid), also when the test fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

NETNS_TOOL = Path("/work/shared/tools/netns-cluster")
DASK = str(Path(sys.executable).with_name("dask"))


def _env() -> dict[str, str]:
    """This environment, with the venv's ``dask`` first on PATH and the project's top-level
    packages (``flows``, ``tasks``, the test helpers) importable by the processes started."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), str(root / "tests"), env.get("PYTHONPATH")) if p)
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@contextlib.contextmanager
def subprocess_cluster(workers: int = 2, nthreads: int = 1, memory_limit: str = "2GB",
                       saturation: str | None = "inf") -> Iterator[str]:
    """A real ``dask scheduler`` + ``workers`` × ``dask worker`` on 127.0.0.1; yields the address.

    ``workers=0`` gives a scheduler without workers. ``saturation="inf"`` turns off
    scheduler-side queuing, so tiny tasks are limited by the scheduler's CPU rather than by
    worker round trips (which take minutes for 10k tasks on a loaded 2-core machine).
    """
    from distributed import Client

    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    sched_file = tmp / "scheduler.json"
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        log = open(tmp / "scheduler.log", "wb")  # noqa: SIM115 - closed in finally
        logs.append(log)
        env = _env()
        if saturation is not None:
            env["DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION"] = saturation
        procs.append(subprocess.Popen(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp))
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError("dask scheduler did not start: " +
                                   (tmp / "scheduler.log").read_text()[-2000:])
            time.sleep(0.1)
        import json

        address = ""
        while not address:
            with contextlib.suppress(ValueError):
                address = json.loads(sched_file.read_text())["address"]
            time.sleep(0.05)
        for i in range(workers):
            log = open(tmp / f"worker{i}.log", "wb")  # noqa: SIM115
            logs.append(log)
            procs.append(subprocess.Popen(
                [DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", str(nthreads),
                 "--memory-limit", memory_limit, "--dashboard-address", "127.0.0.1:0",
                 "--name", f"w{i}", "--local-directory", str(tmp / f"w{i}")],
                stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=tmp))
        if workers:
            with Client(address, timeout="20s", set_as_default=False) as client:
                client.wait_for_workers(workers, timeout=90)
        yield address
    finally:
        _stop(procs)
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def netns_unavailable() -> str | None:
    """Why the netns cluster cannot run here, or ``None``."""
    if not NETNS_TOOL.exists():
        return f"{NETNS_TOOL} not found"
    if os.geteuid() != 0:
        return "netns-cluster needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"netns-cluster needs {tool!r} on PATH"
    return None


@contextlib.contextmanager
def netns_lock() -> Iterator[None]:
    """Hold the host's one netns cluster: the tool gives every cluster the same addresses
    (``10.231.N.1``), so two at once (two pytest processes, ``pytest -n``) would collide.
    The lock is an ``flock`` on a file in the temporary folder, released when the holder
    exits, whichever way."""
    with open(Path(tempfile.gettempdir()) / "netns-cluster.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def netns_cluster(workers: int = 2, nthreads: int = 1, rate: str = "100mbit") -> Iterator[str]:
    """Workers in their own network namespaces behind ``rate`` links; yields the address.

    One at a time on the host (:func:`netns_lock`)."""
    with netns_lock():
        yield from _netns_cluster(workers, nthreads, rate)


def _netns_cluster(workers: int, nthreads: int, rate: str) -> Iterator[str]:
    state = tempfile.mkdtemp(prefix="netns-cluster-")
    os.rmdir(state)  # the tool creates it
    args = ["--state", state]
    try:
        proc = subprocess.run(
            [str(NETNS_TOOL), "up", "--workers", str(workers), "--nthreads", str(nthreads),
             "--rate", rate, "--memory-limit", "2GB", *args],
            capture_output=True, text=True, env=_env(), timeout=120, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"netns-cluster up failed ({proc.returncode}): "
                               f"{proc.stderr.strip()[-1000:]}")
        address = proc.stdout.strip().splitlines()[-1]
        from distributed import Client

        with Client(address, timeout="20s", set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=90)
        yield address
    finally:
        subprocess.run([str(NETNS_TOOL), "down", *args], capture_output=True, env=_env(),
                       timeout=120, check=False)


def address_host(address: str) -> str:
    """The host of a ``tcp://host:port`` address: the netns scheduler's host-side address,
    which every worker namespace reaches (services for the workers bind to it)."""
    return address.split("://", 1)[1].rsplit(":", 1)[0]


@contextlib.contextmanager
def moto_on(host: str, size: int) -> Iterator[str]:
    """A moto S3 server bound to ``host`` with one object of ``size`` bytes.

    Yields ``endpoint,bench,blob`` (the bench's S3 workload spec). Bind it to a netns
    cluster's host-side address so that workers read it across their links.
    """
    from helpers.s3_servers import boto_client, moto_server

    with moto_server(host=host) as endpoint:
        s3 = boto_client(endpoint)
        s3.create_bucket(Bucket="bench")
        s3.put_object(Bucket="bench", Key="blob", Body=os.urandom(size))
        yield f"{endpoint},bench,blob"


@contextlib.contextmanager
def prefect_api_on(host: str) -> Iterator[str]:
    """This process's Prefect API, reachable on ``host`` through a relay
    (:class:`s3_servers.TcpRelay`).

    Yields the relayed API URL, which this process's Prefect settings point at meanwhile: a
    flow run hands its settings to the tasks it submits, so Prefect tasks on the netns
    workers report to the API through the relay (they cannot reach 127.0.0.1).
    """
    from urllib.parse import urlsplit

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from helpers.prefect_server import drain_prefect_services
    from helpers.s3_servers import TcpRelay

    api = urlsplit(PREFECT_API_URL.value())
    if api.hostname is None or api.port is None:
        raise RuntimeError(f"no Prefect API server to relay to (PREFECT_API_URL={api.geturl()!r})")
    with TcpRelay((api.hostname, api.port), host) as relay:
        url = api._replace(netloc=f"{host}:{relay.port}").geturl()
        with temporary_settings({PREFECT_API_URL: url}):
            try:
                yield url
            finally:
                drain_prefect_services()


def print_verdict(title: str, verdict: dict) -> None:
    """A classifier verdict with its evidence rows and disagreements, one line each.

    ``verdict`` is a bench summary's ``bottleneck`` or a stored stage ``diagnosis``: printed
    before a test asserts on it, so that a failure explains itself.
    """
    print(f"VERDICT {title}: {verdict['primary']} / {verdict['secondary']} / "
          f"{verdict['confidence']}: {verdict['note']}")
    for e in verdict["signals"]:
        print(f"  SIGNAL {e['signal']} [{e['source']}] = {e['value']:.4g} {e['op']} "
              f"{e['threshold']:g}: {'yes' if e['supports'] else 'no'}")
    for line in verdict["disagreements"]:
        print(f"  DISAGREE {line}")
