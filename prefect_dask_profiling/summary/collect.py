"""Collecting a run: the scheduler plugin's snapshot turned into a :class:`RunRecord`.

Lives above :mod:`prefect_dask_profiling.timing` (which only installs, snapshots and removes
the plugin) because the record is a summary concept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_dask_profiling.summary.record import RunRecord
from prefect_dask_profiling.timing.plugin import snapshot

if TYPE_CHECKING:
    from distributed import Client


def collect(client: Client, name: str) -> RunRecord:
    """Collect plugin ``name`` into a :class:`RunRecord`.

    Parameters
    ----------
    client
        The connected synchronous client that installed the plugin
        (:func:`~prefect_dask_profiling.timing.plugin.install`); collect before closing it.
    name
        The plugin name ``install`` returned.

    Raises
    ------
    KeyError
        When no plugin of that name is on the scheduler.
    """
    threads = client.nthreads()
    return RunRecord.from_snapshot(snapshot(client, name), workers=len(threads),
                                   threads=sum(threads.values()))
