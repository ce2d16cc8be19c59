"""The live ETA of a flow run: its forecast kept current off the flow's critical path.

The session tells a :class:`LiveEta` when the run's history is being read and when stages
open and close (a few dictionary updates in the flow thread); everything else runs as typed
jobs of the process's one background service
(:class:`~prefect_dask_profiling.run.background.Background`), in the flow run's context:

* :class:`EtaHistory`: once the history the judge reads early is there, the run's first
  estimate (:meth:`~prefect_dask_profiling.forecast.live.LiveForecast.load`);
* :class:`EtaTick`: every ``eta_interval`` seconds, an estimate from one small read of the
  plugin's task counts (:func:`~prefect_dask_profiling.timing.client.task_counts`, the
  session's ``read_counts``);
* :class:`EtaBoundary`: at every stage boundary, an estimate from the counts the stage's
  close already read (:func:`~prefect_dask_profiling.timing.client.counts_of`) and its line;
* :class:`EtaSweep`: at the start, the leftover estimates of the pipeline's earlier runs that
  died without ending are swept (:meth:`~prefect_dask_profiling.store.live.Live.sweep_live`);
* :class:`EtaEnd`: the run's stored estimate is removed, a finished run's progress goes to 100.

The forecast (:mod:`~prefect_dask_profiling.forecast.live`, pure) hands its news to its
sink, the run's :class:`~prefect_dask_profiling.prefect.publish.Publisher`: every post to
Prefect goes through it. After each estimate, the current one replaces the run's object in
its store (:class:`LiveObject`, ``live/<pipeline>/<run_id>.json``:
:mod:`~prefect_dask_profiling.forecast.live_store`) for ``dask-profiling eta``: never spooled,
bounded by the store's timeout (at most :data:`LIVE_TIMEOUT_S`) and its breaker.

A failing Prefect API, store or scheduler read never fails or slows the flow: each job
catches and logs at debug level, and keeps the last good estimate.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from prefect_dask_profiling.forecast.live import Counts, EtaSink, LiveForecast, quietly
from prefect_dask_profiling.forecast.model import Eta
from prefect_dask_profiling.run.background import Background, Periodic

if TYPE_CHECKING:
    from concurrent.futures import Future

    from prefect_dask_profiling.forecast.live_store import LiveEstimate
    from prefect_dask_profiling.store.manifest import RunContext
    from prefect_dask_profiling.store.runs import RunStore

logger = logging.getLogger("prefect_dask_profiling")

# The longest one write of the stored estimate may take (the store's timeout, if shorter):
# an estimate older than this is stale anyway, and the background service has other work.
LIVE_TIMEOUT_S = 5.0
LABEL = "dask-profiling eta"


class LiveObject:
    """The run's current estimate in its store, for ``dask-profiling eta``: replaced at each
    estimate, removed when the run ends. Each call is a background job's (a failure is its
    debug log, and the next estimate tries again)."""

    #: The run's identity (its pipeline and run id name the object).
    ctx: RunContext
    #: The run's options now (the store's URL may change until the run ends: ``use_store``).
    options: Callable[[], Any]
    #: (url, store) the estimate is written to.
    _store: tuple[str, RunStore] | None = None
    #: The store holding the estimate (removed from it at the end).
    written: RunStore | None = None
    #: Removed: write no more.
    over: bool = False

    def __init__(self, ctx: RunContext, options: Callable[[], Any]) -> None:
        self.ctx, self.options = ctx, options

    def store(self) -> RunStore:
        """The run's store, with a write timeout of at most :data:`LIVE_TIMEOUT_S`."""
        from prefect_dask_profiling.store.runs import RunStore

        options = self.options()
        if self._store is None or self._store[0] != options.store:
            timeout = min(float(options.store_timeout), LIVE_TIMEOUT_S)
            self._store = (options.store, RunStore(options.store, options.storage_options,
                                                   timeout=timeout))
        return self._store[1]

    def write(self, estimate: LiveEstimate) -> None:
        """Replace the run's stored estimate."""
        if self.over or not self.ctx.pipeline:
            return
        store = self.store()
        store.write_live(estimate)
        self.written = store

    def sweep(self) -> None:
        """Remove the leftover estimates of the pipeline's earlier runs (the next run or
        ``dask-profiling sweep`` tries again)."""
        if not self.ctx.pipeline:
            return
        removed = self.store().sweep_live(self.ctx.pipeline, keep=self.ctx.run_id)
        if removed:
            logger.info("dask-profiling: removed %d leftover live estimate(s) of runs that "
                        "stopped without ending: %s", len(removed), ", ".join(removed))

    def remove(self) -> None:
        """The run ended: remove its stored estimate (a reader ignores a leftover once the
        run's manifest exists)."""
        self.over = True
        store, self.written = self.written, None
        if store is not None:
            store.remove_live(self.ctx.pipeline, self.ctx.run_id)


class LiveEta:
    """The live ETA of one flow run (see the module docstring).

    Parameters
    ----------
    ctx
        The run's identity.
    options
        The run's options now (``eta_interval``, ``deadline``, ``deadline_margin``,
        ``rule``, the store's).
    sink
        Where the forecast's news goes (the run's publisher).
    read_counts
        Reads the plugin's task counts (``None``: never read).
    """

    #: The run's forecast (pure): the estimate, the deadline, the news.
    forecast: LiveForecast
    #: The run's estimate in its store.
    live: LiveObject
    #: Reads the plugin's task counts (``None``: never read).
    read_counts: Callable[[], Counts] | None
    #: The flow run's context, which every job runs in (artifacts attach to the run).
    context: contextvars.Context | None = None
    #: The periodic tick (``None``: not started).
    periodic: Periodic | None = None
    #: Whether the run ended.
    stopped: bool = False

    def __init__(self, ctx: RunContext, options: Callable[[], Any], sink: EtaSink,
                 read_counts: Callable[[], Counts] | None = None) -> None:
        o = options()
        self.forecast = LiveForecast(ctx, sink, interval=o.eta_interval, deadline=o.deadline,
                                     margin=o.deadline_margin,
                                     needed=o.rules.regression.min_history)
        self.live = LiveObject(ctx, options)
        self.read_counts = read_counts

    # -- told by the session (flow thread) ---------------------------------------------------

    def start(self, history: Future | None, scheduled: datetime | None = None) -> None:
        """The run's history is being read (``history``: its future; ``scheduled``: the
        flow run's scheduled start): estimate once it is there, then every interval."""
        if self.periodic is not None or self.stopped:
            return
        self.context = contextvars.copy_context()  # the flow run's: artifacts attach to it
        quietly(self.forecast.resolve_deadline, scheduled)  # needs no history
        self.forecast.history = history
        self.periodic = Background.instance().every(self.forecast.interval, EtaTick(self))
        self.post(EtaSweep(self))
        if history is not None:
            history.add_done_callback(lambda f: self.post(EtaHistory(self, f)))

    def stage_opened(self, name: str) -> None:
        self.forecast.clock.opened(name)

    def stage_closed(self, name: str, counts: Counts | None = None) -> None:
        """Stage ``name`` closed; ``counts``: the tasks finished per stage and prefix as its
        close read them (``None``: the boundary's estimate reads them itself)."""
        self.forecast.clock.closed(name)
        if self.periodic is not None:
            self.post(EtaBoundary(self, name, counts))

    def stop(self, finished: bool = True) -> None:
        """The run is over: no more ticks; its stored estimate goes, and a ``finished``
        run's progress goes to 100 (queued)."""
        if self.stopped:
            return
        self.stopped = True
        self.forecast.end()
        if self.periodic is not None:
            self.periodic.cancel()
            self.post(EtaEnd(self, finished))

    def post(self, job: Any) -> None:
        """Queue ``job`` on the background service, in the flow run's context."""
        Background.instance().post(job, context=self.context)

    # -- the jobs' work ------------------------------------------------------------------------

    def update(self, counts: Counts | None = None, now: datetime | None = None, *,
               read: bool = True) -> Eta | None:
        """Estimate now (from ``counts`` when given, else from a fresh read when ``read``,
        else the last counts), the forecast telling its news (judged at ``now``); store the
        estimate."""
        if counts is None and read and self.forecast.stats is not None:
            counts = self._read()
        eta = self.forecast.update(counts, now)
        self.store()
        return eta

    def boundary(self, name: str, counts: Counts | None = None) -> None:
        """Stage ``name`` closed: estimate (from ``counts``, else a fresh read), say its
        line, store the estimate."""
        if counts is None and self.forecast.stats is not None:
            counts = self._read()
        self.forecast.boundary(name, counts)
        self.store()

    def store(self) -> None:
        """Replace the stored estimate by the last one (a failing store is a debug log)."""
        forecast = self.forecast
        if forecast.eta is not None and forecast.made_at is not None:
            quietly(lambda: self.live.write(forecast.live_estimate(forecast.eta,
                                                                     forecast.made_at)))

    def _read(self) -> Counts | None:
        if self.read_counts is None:
            return None
        try:
            return self.read_counts()
        except Exception:  # the scheduler is busy or gone: time only, last counts kept
            logger.debug("dask-profiling: task counts not read for the ETA", exc_info=True)
            return None


@dataclass
class EtaTick:
    """The periodic estimate (``now``: the clock the deadline is judged on, default the
    current time)."""

    eta: LiveEta
    now: datetime | None = None
    label: ClassVar[str] = LABEL

    def run(self) -> None:
        if not self.eta.stopped:
            quietly(self.eta.update, None, self.now)


@dataclass
class EtaBoundary:
    """A stage boundary's estimate (``counts``: those its close read)."""

    eta: LiveEta
    name: str
    counts: Counts | None = None
    label: ClassVar[str] = LABEL

    def run(self) -> None:
        quietly(self.eta.boundary, self.name, self.counts)


@dataclass
class EtaHistory:
    """The run's history is read (``history``: its future): the first estimate from it (a
    failed read: no ETA, the judge says why at the end)."""

    eta: LiveEta
    history: Future
    label: ClassVar[str] = LABEL

    def run(self) -> None:
        def load() -> None:
            self.eta.forecast.load(self.history.result())
            self.eta.store()

        quietly(load)


@dataclass
class EtaSweep:
    """The start: sweep the pipeline's leftover estimates."""

    eta: LiveEta
    label: ClassVar[str] = LABEL

    def run(self) -> None:
        quietly(self.eta.live.sweep)


@dataclass
class EtaEnd:
    """The end: remove the stored estimate; a ``finished`` run's progress goes to 100."""

    eta: LiveEta
    finished: bool
    label: ClassVar[str] = LABEL

    def run(self) -> None:
        quietly(self.eta.live.remove)
        if self.finished:
            quietly(self.eta.forecast.finished)


__all__ = ["LIVE_TIMEOUT_S", "EtaBoundary", "EtaEnd", "EtaHistory", "EtaSweep", "EtaTick",
           "LiveEta", "LiveObject"]
