"""A real OTLP/HTTP trace server for tests: Arize Phoenix (``arize-phoenix``), which stores
the spans it receives and answers queries on its REST API.

Started as ``python -m phoenix.server.main serve`` on free ports of 127.0.0.1, with a
temporary working directory (its SQLite database) and its own telemetry off; always stopped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from helpers.prefect_server import HOST, free_port
from helpers.processes import stop_process_group


@dataclass(frozen=True)
class TraceServer:
    """A running Phoenix: its base URL (OTLP/HTTP at ``/v1/traces``, REST at ``/v1``)."""

    url: str
    log: Path

    @property
    def traces_endpoint(self) -> str:
        return f"{self.url}/v1/traces"

    def spans(self, project: str) -> list[dict[str, Any]]:
        """Every span stored for ``project``, read back over the REST API."""
        spans, cursor = [], None
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            response = httpx.get(f"{self.url}/v1/projects/{project}/spans", params=params,
                                 timeout=30)
            if response.status_code == 404:  # the project exists once a span arrived
                return []
            response.raise_for_status()
            body = response.json()
            spans += body["data"]
            cursor = body.get("next_cursor")
            if not cursor:
                return spans


@contextmanager
def running_phoenix(workdir: Path, timeout: float = 180.0) -> Iterator[TraceServer]:
    """Phoenix on free ports, stopped on exit (its log in ``workdir``)."""
    if importlib.util.find_spec("phoenix") is None:
        raise RuntimeError("arize-phoenix is not installed in this environment: it is in "
                           "the test extra (make install)")
    port, grpc_port = free_port(), free_port()
    env = {**os.environ, "PHOENIX_HOST": HOST, "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(grpc_port), "PHOENIX_WORKING_DIR": str(workdir),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = workdir / "phoenix.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "phoenix.server.main", "serve"],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Phoenix did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield TraceServer(url=url, log=log)
    finally:
        stop_process_group(proc)
