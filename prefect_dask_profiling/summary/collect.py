"""Collecting a run: the scheduler plugin's snapshot turned into a :class:`RunRecord`.

Lives above :mod:`prefect_dask_profiling.timing` (which only installs, snapshots and removes
the plugin) because the record is a summary concept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_dask_profiling.summary.record import RunRecord

if TYPE_CHECKING:
    from distributed import Client


def collect(client: Client, name: str) -> RunRecord:
    """Collect plugin ``name`` into a :class:`RunRecord`.

    Parameters
    ----------
    client
        The connected synchronous client that installed the plugin
        (:func:`~prefect_dask_profiling.timing.client.install`); collect before closing it.
    name
        The plugin name ``install`` returned.

    Raises
    ------
    KeyError
        When no plugin of that name is on the scheduler.
    """
    # imported here: the summary's readers (the command line's ``show``) need no distributed
    from prefect_dask_profiling.timing.client import cluster_size, snapshot

    snap = snapshot(client, name)
    workers, threads = cluster_size(client, snap)
    return RunRecord.from_snapshot(snap, workers=workers, threads=threads)
