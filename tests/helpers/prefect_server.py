"""A real ``prefect server start`` for tests: temporary home, free port, always stopped.

Use the ``prefect_server`` session fixture (tests/conftest.py) rather than this module
directly; it points this process's Prefect settings (and its environment, for subprocesses
and Dask worker processes) at the server for the whole session.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from helpers.processes import stop_process_group

HOST = "127.0.0.1"
IDLE_SERVICES = ("FOREMAN", "LATE_RUNS", "PAUSE_EXPIRATIONS", "REPOSSESSOR",
                 "CANCELLATION_CLEANUP", "CLEANUP_RECONCILER", "DB_VACUUM")


@dataclass(frozen=True)
class PrefectServer:
    """A running server: where it listens and where it keeps its state."""

    api_url: str
    ui_url: str
    port: int
    home: Path
    pid: int
    log: Path

    def client_env(self) -> dict[str, str]:
        """Environment for a subprocess (CLI, worker) that should talk to this server."""
        env = dict(os.environ)
        env.update({"PREFECT_API_URL": self.api_url,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_HOME": str(self.home / "client")})
        return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def prefect_executable() -> str:
    """The ``prefect`` CLI of this interpreter's environment."""
    candidate = Path(sys.executable).parent / "prefect"
    return str(candidate) if candidate.exists() else (shutil.which("prefect") or "prefect")


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    """True if ``GET <api_url>/health`` answers 200."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_server(port: int | None = None, home: str | os.PathLike | None = None,
                   ui: bool = True, timeout: float = 120.0) -> Iterator[PrefectServer]:
    """Start ``prefect server start`` on 127.0.0.1, wait for ``/api/health``, stop it after.

    Parameters
    ----------
    port
        Port to listen on; default a free one.
    home
        ``PREFECT_HOME`` (SQLite database, logs); default a new temporary folder, removed
        afterwards.
    ui
        Serve the UI too (``PREFECT_UI_API_URL`` is set so it works on any port).
    timeout
        Seconds to wait for the server to become healthy.

    Raises
    ------
    RuntimeError
        If the server exits or is not healthy in time (with the tail of its log).
    """
    port = port or free_port()
    owned_home = home is None
    home_path = Path(home or tempfile.mkdtemp(prefix="prefect-server-"))
    home_path.mkdir(parents=True, exist_ok=True)
    api_url = f"http://{HOST}:{port}/api"
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env.update({"PREFECT_HOME": str(home_path),
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_UI_ENABLED": "true" if ui else "false",
                "PREFECT_UI_API_URL": api_url,
                "PREFECT_LOGGING_LEVEL": "WARNING"})
    # loop services no test uses (they poll the database every few seconds: half of an idle
    # server's CPU, 0.7 of 1.4 CPU-s a minute); the scheduler, events, triggers and the task
    # run recorder stay
    env.update({f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in IDLE_SERVICES})
    log = home_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [prefect_executable(), "server", "start", "--host", HOST, "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not healthy(api_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"prefect server on port {port} did not become healthy "
                                   f"(exit code {proc.poll()}); log tail:\n{tail}")
            time.sleep(0.25)
        yield PrefectServer(api_url=api_url, ui_url=f"http://{HOST}:{port}", port=port,
                            home=home_path, pid=proc.pid, log=log)
    finally:
        stop_process_group(proc)
        if owned_home:
            shutil.rmtree(home_path, ignore_errors=True)


@contextlib.contextmanager
def use_server(server: PrefectServer) -> Iterator[None]:
    """Point this process (settings and environment) at ``server``.

    On the way out, this process's Prefect log and event workers send what they hold to
    ``server`` and stop (:func:`drain_prefect_services`): else a worker made meanwhile keeps
    the server's URL after it stopped, and the session's next tests' events queue behind
    its retries of a dead API.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL",
                                            "PREFECT_SERVER_ANALYTICS_ENABLED")}
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            try:
                yield
            finally:
                drain_prefect_services()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def drain_prefect_services(timeout: float = 10.0) -> None:
    """Send what this process's Prefect log and event workers hold, and stop them.

    Called while the server (or relay) they may point at is still up: a worker made during
    its life keeps its URL, and would retry a dead API at exit (or for the session's next
    test). Stopped workers are made again, with the settings of the time, on next use.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout, at_exit=False)
