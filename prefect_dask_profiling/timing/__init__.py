"""Task timing on the scheduler: the :class:`TaskTimings` plugin and its client API.

The plugin module imports nothing but the standard library and ``distributed`` (plus the
sketch, shipped with it by value): it runs inside a scheduler we do not own. Its names are
served from here on first use, so that importing a sibling (``timing.sketch``, which the
stored summaries' readers need) does not import ``distributed``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.plugin import (
        DEFAULT_STAGE,
        RUN_ANNOTATION,
        STAGE_ANNOTATION,
        TaskTimings,
        install,
        snapshot,
        uninstall,
    )

__all__ = ["DEFAULT_STAGE", "RUN_ANNOTATION", "STAGE_ANNOTATION", "TaskTimings", "install",
           "snapshot", "uninstall"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.plugin"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
