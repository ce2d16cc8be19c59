"""Task timing on the scheduler: the :class:`TaskTimings` plugin and its client API.

The plugin (``timing.plugin`` and the stream modules it delegates to: ``tasks``, ``memory``,
``loop``, ``workers``, with ``scope``, ``sketch`` and ``cpu``) imports nothing but the
standard library and ``distributed``: it runs inside a scheduler we do not own, shipped by
value by ``timing.client``. Names are served from here on first use, so that importing a
sibling (``timing.sketch``, which the stored summaries' readers need) does not import
``distributed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect_dask_profiling._util import lazy_exports

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.client import install, snapshot, uninstall
    from prefect_dask_profiling.timing.plugin import TaskTimings
    from prefect_dask_profiling.timing.scope import DEFAULT_STAGE, RUN_ANNOTATION, STAGE_ANNOTATION

__all__ = ["DEFAULT_STAGE", "RUN_ANNOTATION", "STAGE_ANNOTATION", "TaskTimings", "install",
           "snapshot", "uninstall"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "DEFAULT_STAGE": ".scope", "RUN_ANNOTATION": ".scope", "STAGE_ANNOTATION": ".scope",
    "TaskTimings": ".plugin", "install": ".client", "snapshot": ".client",
    "uninstall": ".client"})
