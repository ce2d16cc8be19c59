"""Stopping server processes that tests started in their own session (process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_process_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM ``proc``'s process group, SIGKILL it after ``grace`` seconds.

    The process must have been started with ``start_new_session=True``; children it
    spawned (a nanny's worker, uvicorn under ``prefect server``) are stopped with it, and
    an orphan left in the group after the leader exited is killed too.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
