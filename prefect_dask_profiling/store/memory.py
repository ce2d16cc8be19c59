"""Remembered reads: a store answers a repeated listing or read from memory inside a block.

Judging a run reads the history twice (the baseline, then the drift series) from the same
listing and partly the same tables. :class:`ReadMemory` is what a
:class:`~prefect_dask_profiling.store.runs.RunStore` holds for that: empty and inactive
outside :meth:`~prefect_dask_profiling.store.runs.RunStore.remembering_reads`, forgotten by
every write or delete through the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any


class ReadMemory:
    """Answers remembered by key while a :meth:`block` is open (blocks nest; the outermost
    one ends the memory). Failures are never remembered: ``read()`` raising stores nothing."""

    def __init__(self) -> None:
        self._memory: dict[Hashable, Any] | None = None

    @property
    def active(self) -> bool:
        """Whether a block is open (callers then hand out copies, never the memory)."""
        return self._memory is not None

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        """Remember answers until the outermost block ends."""
        outer = self._memory
        self._memory = {} if outer is None else outer
        try:
            yield
        finally:
            self._memory = outer

    def recall(self, key: Hashable, read: Callable[[], Any]) -> Any:
        """``read()``, or inside a block its remembered answer."""
        memory = self._memory
        if memory is None:
            return read()
        try:
            return memory[key]
        except KeyError:  # not read yet, or forgotten by a write from another thread
            value = memory[key] = read()
            return value

    def get(self, key: Hashable) -> Any:
        """The remembered answer for ``key``, or ``None``."""
        memory = self._memory
        return None if memory is None else memory.get(key)

    def put(self, key: Hashable, value: Any) -> None:
        """Remember ``value`` for ``key`` (only inside a block)."""
        memory = self._memory
        if memory is not None:
            memory[key] = value

    def forget(self) -> None:
        """Forget every answer (a write or delete happened)."""
        if self._memory:
            self._memory.clear()
