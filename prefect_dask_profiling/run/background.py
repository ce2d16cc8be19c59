"""One background worker per process for everything that may follow a run's verdict.

The verdict stays on the flow's critical path (it decides the flow's final state); what comes
after it — drawing and storing stage reports, posting artifacts, storing the views and fleet
rows — and the periodic work of a run in progress (the ETA) runs here, on **one** thread of the
process, in the order it was submitted. The model is Prefect's own ``QueueService`` as its
event worker uses it: one queue per process, drained with a bound when the process exits, so
nothing submitted is lost by a flow that returns before its reports are stored.

A job is typed, as Prefect's ``EventsWorker(QueueService[Event])`` takes ``Event`` s: a
small dataclass whose fields say what it is about, with a ``label`` and a ``run()`` that does
it (:class:`Job`; e.g. :class:`~prefect_dask_profiling.prefect.artifacts.ArtifactJob`, the live
ETA's :class:`~prefect_dask_profiling.run.live_eta.EtaTick`), queued by :meth:`Background.post`
or repeated by :meth:`Background.every`. :meth:`Background.submit` still queues a plain call.

A job runs in the :mod:`contextvars` context of the thread that submitted it (the flow run's
context is visible to it, as Prefect's artifact and event calls need), or the one it was
posted with. A job that raises is logged; its exception is in its
:class:`~concurrent.futures.Future`.

Examples
--------
>>> service = Background.instance()
>>> service.submit(print, "stored", label="report read").result()
stored
>>> @dataclass
... class Hello:
...     name: str
...     label: ClassVar[str] = "hello"
...     def run(self) -> str:
...         return f"hello {self.name}"
>>> service.post(Hello("eta")).result()
'hello eta'
"""

from __future__ import annotations

import atexit
import contextvars
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from prefect_dask_profiling.errors import InvalidInput

logger = logging.getLogger("prefect_dask_profiling")

#: How long the process waits at exit for the jobs still queued (seconds).
EXIT_DRAIN_S = 120.0


class Job(Protocol):
    """A typed job of the background service: its fields say what it is about."""

    #: What it is, in a warning about it (a class-level constant, usually).
    label: str

    def run(self) -> Any:
        """Do it (on the service's thread); what it returns is its future's result."""


@dataclass(order=True)
class _Job:
    """A queued call: due at ``due`` (monotonic seconds), in submission order among equals."""

    due: float
    seq: int
    run: Callable[[], Any] = field(compare=False)
    future: Future = field(compare=False)
    label: str = field(compare=False, default="")
    periodic: Periodic | None = field(compare=False, default=None)


class Periodic:
    """A job repeated every ``interval`` seconds until :meth:`cancel` (see
    :meth:`Background.every`). Its runs never overlap: the next is queued when one ends."""

    def __init__(self, service: Background, interval: float, run: Callable[[], Any],
                 label: str) -> None:
        self.service = service
        self.interval = interval
        self.label = label
        self._run = run
        self.cancelled = False

    def cancel(self) -> None:
        """Run no more (a run in progress finishes)."""
        self.cancelled = True

    def __call__(self) -> None:
        if self.cancelled:
            return
        try:
            self._run()
        finally:
            if not self.cancelled:
                self.service._queue(self, self.interval, self.label, periodic=self)


class Background:
    """The process's one background worker: a queue of jobs and one daemon thread.

    Use :meth:`instance` (one per process); the thread starts with the first job. At exit
    the queue is drained for at most :data:`EXIT_DRAIN_S` seconds (periodic jobs stop).
    """

    _instances: ClassVar[dict[int, Background]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "dask-profiling-background") -> None:
        self.name = name
        self._heap: list[_Job] = []
        self._changed = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._busy = 0  # one-shot jobs queued or running

    @classmethod
    def instance(cls) -> Background:
        """The background worker of this process (a forked child gets its own)."""
        pid = os.getpid()
        with cls._instances_lock:
            service = cls._instances.get(pid)
            if service is None:
                service = cls._instances[pid] = cls()
                atexit.register(service.drain, EXIT_DRAIN_S)
            return service

    # -- submitting ---------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], *args: Any, label: str = "",
               **kwargs: Any) -> Future:
        """Queue ``fn(*args, **kwargs)`` after the jobs already queued.

        Returns
        -------
        concurrent.futures.Future
            Its result, or the exception it raised.
        """
        if not callable(fn):
            raise InvalidInput(f"submit() needs a callable, got {fn!r}")
        context = contextvars.copy_context()
        return self._queue(lambda: context.run(fn, *args, **kwargs), 0.0,
                           label or getattr(fn, "__name__", repr(fn)))

    def post(self, job: Job, *, context: contextvars.Context | None = None) -> Future:
        """Queue ``job.run()`` after the jobs already queued, in a copy of ``context``
        (default: the caller's).

        Returns
        -------
        concurrent.futures.Future
            Its result, or the exception it raised.
        """
        run = getattr(job, "run", None)
        if not callable(run):
            raise InvalidInput(f"post() needs a job with a run() method, got {job!r}")
        context = (context or contextvars.copy_context()).copy()
        return self._queue(lambda: context.run(run), 0.0, str(getattr(job, "label", "")) or
                           type(job).__name__)

    def every(self, interval: float, fn: Job | Callable[[], Any], *, label: str = "",
              first_after: float | None = None) -> Periodic:
        """Run ``fn`` (a :class:`Job`: its ``run()``; or a plain call) every ``interval``
        seconds (first after ``first_after``, by default ``interval``) until the returned
        :class:`Periodic` is cancelled.

        A periodic job is not waited for by :meth:`drain`; a slow run delays the next one
        (runs never overlap), and other jobs queued meanwhile run in between.
        """
        if not (isinstance(interval, int | float) and interval > 0):
            raise InvalidInput(f"every() needs an interval > 0 seconds, got {interval!r}")
        run = getattr(fn, "run", fn)
        if not callable(run):
            raise InvalidInput(f"every() needs a job or a callable, got {fn!r}")
        label = label or str(getattr(fn, "label", "")) or getattr(fn, "__name__", repr(fn))
        context = contextvars.copy_context()
        periodic = Periodic(self, float(interval), lambda: context.run(run), label)
        self._queue(periodic, interval if first_after is None else first_after,
                    periodic.label, periodic=periodic)
        return periodic

    def _queue(self, run: Callable[[], Any], delay: float, label: str,
               periodic: Periodic | None = None) -> Future:
        future: Future = Future()
        job = _Job(time.monotonic() + max(delay, 0.0), next(self._seq), run, future, label,
                   periodic)
        with self._changed:
            heapq.heappush(self._heap, job)
            if periodic is None:
                self._busy += 1
            self._start()
            self._changed.notify_all()
        return future

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    # -- running ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            job = self._next()
            if not job.future.set_running_or_notify_cancel():
                self._done(job)
                continue
            try:
                job.future.set_result(job.run())
            except BaseException as exc:
                logger.warning("dask-profiling: background job %s failed: %r", job.label, exc,
                               exc_info=True)
                job.future.set_exception(exc)
            finally:
                self._done(job)

    def _next(self) -> _Job:
        """The next job due, waiting for one (cancelled periodic jobs are dropped)."""
        with self._changed:
            while True:
                if self._heap:
                    head = self._heap[0]
                    if head.periodic is not None and head.periodic.cancelled:
                        heapq.heappop(self._heap)
                        continue
                    wait = head.due - time.monotonic()
                    if wait <= 0:
                        return heapq.heappop(self._heap)
                    self._changed.wait(wait)
                else:
                    self._changed.wait()

    def _done(self, job: _Job) -> None:
        if job.periodic is None:
            with self._changed:
                self._busy -= 1
                self._changed.notify_all()

    # -- draining -----------------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every one-shot job queued so far has run; at most ``timeout`` seconds.

        Returns
        -------
        bool
            Whether the queue was drained (False: jobs still queued after ``timeout``; they
            are said in a warning).
        """
        if timeout is not None and timeout < 0:
            raise InvalidInput(f"drain() needs a timeout >= 0 seconds, got {timeout!r}")
        with self._changed:
            drained = self._changed.wait_for(lambda: self._busy == 0, timeout=timeout)
            left = [j.label for j in self._heap if j.periodic is None]
        if not drained:
            logger.warning("dask-profiling: %d background job(s) not finished after %.0f s: %s",
                           max(len(left), 1), timeout, ", ".join(left) or "one running")
        return drained

    def pending(self) -> int:
        """One-shot jobs queued or running."""
        with self._changed:
            return self._busy
