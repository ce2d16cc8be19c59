"""A worker plugin that writes each worker's own account of its lifetime to a file.

Standard library and distributed only, so a new worker unpickles it at once (a module that
imports Prefect would take seconds to import there and delay the worker's start line).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from distributed import WorkerPlugin

POLL_MS = 50


class LifetimeFile(WorkerPlugin):
    """Append ``{"worker", "event", "time"}`` lines to ``<folder>/<pid>.jsonl``: ``start``
    when the plugin is set up on the worker, ``stop`` when the worker stops running (its
    status leaves ``running``: retiring, closing), seen by polling every ``POLL_MS``."""

    name = "lifetime-file"

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._pc = None

    def _write(self, worker, event: str) -> None:
        line = json.dumps({"worker": worker.address, "event": event, "time": time.time()})
        with open(Path(self.folder, f"{os.getpid()}.jsonl"), "a") as fh:
            fh.write(line + "\n")

    def setup(self, worker) -> None:
        from tornado.ioloop import PeriodicCallback

        self._write(worker, "start")

        def poll() -> None:
            if worker.status.name != "running":
                self._write(worker, "stop")
                self._pc.stop()

        self._pc = PeriodicCallback(poll, POLL_MS)
        self._pc.start()

    def teardown(self, worker) -> None:
        if self._pc is not None and self._pc.is_running():
            self._pc.stop()
            self._write(worker, "stop")
