"""The clusters a benchmark session runs on: the remote scheduler and a local cluster.

:func:`connect` fails fast on an unreachable scheduler or one without workers
(:class:`~prefect_dask_profiling.bench.config.BenchInputError`); :func:`local_cluster`
starts a ``LocalCluster`` on 127.0.0.1 sized by the session's
:class:`~prefect_dask_profiling.bench.config.BenchConfig`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefect_dask_profiling.bench.config import BenchConfig, BenchInputError

if TYPE_CHECKING:
    from distributed import Client


@contextlib.contextmanager
def _quiet_distributed() -> Iterator[None]:
    """Keep distributed's connection-retry chatter off stderr while we report ourselves."""
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def connect(address: str, timeout: float, worker_wait: float = 3.0):
    """Connect to a scheduler, fail fast; require at least one worker.

    Raises
    ------
    BenchInputError
        Unreachable scheduler (within ``timeout`` seconds) or a scheduler without workers.
    """
    from distributed import Client

    try:
        with _quiet_distributed():
            client = Client(address, timeout=f"{timeout}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BenchInputError(f"cannot reach scheduler {address} within {timeout:g} s: "
                              f"{reason}") from None
    try:
        _require_workers(client, address, worker_wait)
    except BaseException:
        client.close()
        raise
    return client


def _require_workers(client: Client, address: str, wait_s: float) -> None:
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError:
        raise BenchInputError(f"scheduler {address} has zero workers (waited {wait_s:g} s): "
                              "start workers or check that they reach the scheduler") from None


@contextlib.contextmanager
def local_cluster(config: BenchConfig) -> Iterator[Any]:
    """A LocalCluster on 127.0.0.1 with ``config.local_workers`` × ``local_threads``."""
    from distributed import Client, LocalCluster

    kwargs: dict[str, str] = {}  # LocalCluster's options that are set
    if config.local_memory_limit:
        kwargs["memory_limit"] = config.local_memory_limit
    with _quiet_distributed(), LocalCluster(
            n_workers=config.local_workers, threads_per_worker=config.local_threads,
            processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR, **kwargs) as cluster, \
            Client(cluster, set_as_default=False) as client:
        _require_workers(client, cluster.scheduler_address, 30.0)
        yield client
