"""What the plugin's streams share: the run they record, the scheduler, the warnings.

Standard library only (the scheduler plugin ships it by value). The annotations that tie a
task to a stage and a run are named here, so that the task runner and :mod:`..stage` write
what the streams read.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

STAGE_ANNOTATION = "stage"
RUN_ANNOTATION = "profiling_run"
PARENT_ANNOTATION = "profiling_parent"
DEFAULT_STAGE = "default"


@dataclass(slots=True)
class RunScope:
    """The run one plugin records, and how a task is told to belong to it.

    Parameters
    ----------
    name
        The plugin's name, which tags the run's tasks (``RUN_ANNOTATION``).
    owner_client
        The client owning the run; ``None`` records every task on the scheduler.
    scheduler
        The scheduler, once the plugin started (``None`` before, and in a pickled copy).
    warnings
        What the streams could not record, for the snapshot (each said once).
    """

    name: str
    owner_client: str | None
    scheduler: Any = None
    warnings: list[str] = field(default_factory=list)
    #: dask's ``key_split`` without its cache, looked up on first use
    key_split: Callable[[Hashable], str] | None = None

    def task(self, key: Hashable) -> Any:
        """The scheduler's ``TaskState`` of ``key``, or ``None`` (no scheduler, unknown key)."""
        return self.scheduler.tasks.get(key) if self.scheduler is not None else None

    def owner_stage(self, ts: Any) -> str | None:
        """The task's stage, or ``None`` when the task belongs to another run."""
        annotations = (ts.annotations if ts is not None else None) or {}
        if self.owner_client is not None and annotations.get(RUN_ANNOTATION) != self.name:
            return None
        return annotations.get(STAGE_ANNOTATION) or DEFAULT_STAGE

    def prefix(self, key: Hashable, ts: Any) -> str:
        """The task's prefix: from its ``TaskState``, else split from the key."""
        if ts is not None:
            return ts.prefix.name
        split = self.key_split
        if split is None:
            # dask's key_split is lru-cached over 100k keys: tens of MiB that would grow
            # with the task count up to that bound, so use the uncached function.
            from dask.utils import key_split

            split = self.key_split = getattr(key_split, "__wrapped__", key_split)
        return split(key)

    def warn_once(self, marker: str, message: str) -> None:
        """Add ``message`` unless a warning containing ``marker`` was given already."""
        if not any(marker in w for w in self.warnings):
            self.warnings.append(message)

    def __getstate__(self) -> tuple[str, str | None, list[str]]:
        """Pickle without the scheduler and the looked-up function (a copy is not started)."""
        return self.name, self.owner_client, self.warnings

    def __setstate__(self, state: tuple[str, str | None, list[str]]) -> None:
        self.name, self.owner_client, self.warnings = state
        self.scheduler = None
        self.key_split = None
