"""The scheduler's event loop per stage: its CPU and run-queue wait while each stage ran.

Standard library only (shipped by value with the scheduler plugin); at most ``MAX_STAGES``
stages are kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefect_dask_profiling.timing.cpu import thread_cpu

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import StageScheduler

MAX_STAGES = 1_000  # stages with scheduler-load entries
LOOP_SAMPLE_GAP = 0.05  # seconds between event-loop samples taken outside the periodic one


@dataclass(slots=True)
class LoopShare:
    """The loop's CPU and run-queue wait over the sampled intervals in which a stage ran.

    ``wait_known`` turns False once an interval's wait could not be read (off Linux).
    """

    cpu_s: float = 0.0
    wait_s: float = 0.0
    seconds: float = 0.0
    wait_known: bool = True


@dataclass(slots=True)
class LoopReading:
    """One reading of the loop thread: when, its CPU seconds and run-queue wait."""

    time: float
    cpu: float
    wait: float | None


class LoopSampler:
    """The event loop's CPU (and run-queue wait) shared out to the stages running.

    Sampled on the event loop only (the periodic sampler, graph arrivals, snapshots), so the
    thread's CPU is the loop's: the scheduler's own work for the tasks it schedules. Every
    stage running in an interval gets the whole interval; stages that overlap share it.
    """

    def __init__(self) -> None:
        #: stage -> the loop while it ran
        self.stages: dict[str, LoopShare] = {}
        #: the previous reading, ``None`` before the first
        self.last: LoopReading | None = None
        #: native id of the loop's thread (the first sampling thread)
        self.thread: int | None = None

    @property
    def last_time(self) -> float | None:
        """When the loop was last read, ``None`` before the first reading."""
        return self.last.time if self.last is not None else None

    def due(self, now: float) -> bool:
        """Whether an extra reading (outside the periodic one) is worth taking ``now``."""
        return self.last is not None and now - self.last.time >= LOOP_SAMPLE_GAP

    def sample(self, stages: Iterable[str]) -> None:
        """Add the loop's CPU since the last reading to ``stages``, which ran in between."""
        tid = threading.get_native_id()
        if self.thread is None:
            self.thread = tid
        elif tid != self.thread:
            return  # not the event loop: its CPU would be another thread's
        now = time.time()
        cpu, wait = thread_cpu()
        previous, self.last = self.last, LoopReading(now, cpu, wait)
        if previous is None:
            return
        seconds, d_cpu = now - previous.time, cpu - previous.cpu
        d_wait = wait - previous.wait if wait is not None and previous.wait is not None \
            else None
        for stage in stages:
            entry = self.stages.get(stage)
            if entry is None:
                if len(self.stages) >= MAX_STAGES:
                    continue
                entry = self.stages[stage] = LoopShare()
            entry.cpu_s += max(d_cpu, 0.0)
            entry.wait_s += max(d_wait or 0.0, 0.0)
            entry.seconds += max(seconds, 0.0)
            if d_wait is None:
                entry.wait_known = False

    def rows(self) -> dict[str, StageScheduler]:
        """The snapshot's ``stage_scheduler``: the loop per stage."""
        return {s: {"loop_cpu_s": e.cpu_s, "loop_wait_s": e.wait_s if e.wait_known else None,
                    "seconds": e.seconds}
                for s, e in self.stages.items()}
