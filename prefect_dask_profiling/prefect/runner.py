"""``ProfiledDaskTaskRunner``: prefect-dask's ``DaskTaskRunner`` that profiles every run.

Switch an existing flow by changing its task runner and adding one line::

    @flow(task_runner=ProfiledDaskTaskRunner())
    @profiled                      # finish(): collect, store, artifacts, verdict
    def nightly(...):
        with stage("read"):
            ...

``@profiled`` (or ``finish()`` at the end of the flow body) is needed because the runner's
``__exit__`` runs after Prefect stored the final state, outside the flow-run context
(docs/getting-started.md). Prefect enters a ``duplicate()`` of the runner for every flow run
*and inside every Dask worker task*: extra arguments are copied in :meth:`duplicate`, and the
worker-side copies only re-enter the stage of the task they run in. Raising in
``__enter__`` leaves a flow run stuck in Running, so start-up problems are raised from the
flow body instead."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import dask
import distributed
from prefect import Flow
from prefect_dask import DaskTaskRunner

from prefect_dask_profiling._util import lazy_exports
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.options import (
    ProfilingOptions,
    check_renderer,
    with_option_keywords,
)
from prefect_dask_profiling.stages import running_task_annotations, running_task_key
from prefect_dask_profiling.timing.plugin import (
    PARENT_ANNOTATION,
    RUN_ANNOTATION,
    STAGE_ANNOTATION,
)

if TYPE_CHECKING:
    from prefect_dask_profiling.regression.verdict import RegressionDetected

logger = logging.getLogger("prefect_dask_profiling")


# Re-exported lazily: the verdict module needs pandas, which this module must not load in
# the Dask workers, where Prefect unpickles the runner around every task.
__getattr__, __dir__ = lazy_exports(
    __name__, {"RegressionDetected": "prefect_dask_profiling.regression.verdict"})

__all__ = ["ProfiledDaskTaskRunner", "ProfilingOptions", "RegressionDetected", "finish",
           "profiled"]

def _in_dask_worker() -> bool:
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True




def cluster_type_name(runner: DaskTaskRunner) -> str | None:
    """The class name of the cluster ``runner`` runs on, as configured: the ``cluster``
    given, else ``cluster_class`` (a class, a callable or an import path), else
    prefect-dask's default ``LocalCluster``; ``None`` for an ``address`` (unknown)."""
    given = getattr(runner, "_cluster", None)
    if given is not None:
        return type(given).__name__
    cls = getattr(runner, "resolved_cluster_class", None) or getattr(runner, "cluster_class",
                                                                     None)
    if isinstance(cls, str):
        return cls.rsplit(".", 1)[-1]
    if cls is not None:
        return getattr(cls, "__name__", None) or type(cls).__name__
    return None if getattr(runner, "address", None) else "LocalCluster"


class ProfiledDaskTaskRunner(DaskTaskRunner):
    """A ``DaskTaskRunner`` that records, stores and judges every run.

    Every argument of ``prefect_dask.DaskTaskRunner`` works unchanged; the other keyword
    arguments are the fields of :class:`~prefect_dask_profiling.options.ProfilingOptions`
    (or the whole object, ``profiling=``), kept as :attr:`profiling` and passed as it is to
    the run's session. They reach the options as they are, and the signature shown lists
    them with their defaults (:func:`~prefect_dask_profiling.options.with_option_keywords`):
    a new option is a field of the options only. ``report_renderer`` is only checked:
    ``"flow"`` is the one renderer (``"dask"`` was removed and is refused, naming why).
    """

    @with_option_keywords
    def __init__(self, cluster=None, address: str | None = None, cluster_class=None,
                 cluster_kwargs: dict | None = None, adapt_kwargs: dict | None = None,
                 client_kwargs: dict | None = None, performance_report_path: str | None = None,
                 *, report_renderer: str = "flow", profiling: ProfilingOptions | None = None,
                 **options: Any) -> None:
        # every other keyword is a field of ProfilingOptions, checked there: a new option is
        # a field of the options and nothing here (the signature shown is built from them)
        check_renderer(report_renderer)
        if profiling is not None and options:
            raise InvalidInput(f"pass the options either whole (profiling=) or as keywords, "
                               f"not both: got profiling= and {sorted(options)}")
        self.profiling = profiling or ProfilingOptions.from_keywords(options)
        super().__init__(cluster=cluster, address=address, cluster_class=cluster_class,
                         cluster_kwargs=cluster_kwargs, adapt_kwargs=adapt_kwargs,
                         client_kwargs=client_kwargs,
                         performance_report_path=performance_report_path)
        rates = self.profiling.cost
        if rates is not None and rates.by_cluster:  # cost={"clusters": ...}: whose class
            self.profiling = self.profiling.evolve(
                cost=rates.with_cluster(cluster_type_name(self)))
        self._session = None
        self._startup_error: BaseException | None = None

    def duplicate(self) -> ProfiledDaskTaskRunner:
        new = super().duplicate()
        new.profiling = self.profiling
        return new

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and getattr(other, "profiling", None) == self.profiling

    __hash__ = None  # mutable runtime state; equality is by settings like the base

    def __getstate__(self) -> dict[str, Any]:
        # The runner travels inside the pickled Flow to every Dask worker, whose copies
        # never touch the store: leave credentials in storage_options behind.
        state = self.__dict__.copy()
        state["_session"] = None
        state["_startup_error"] = None
        if self.profiling.storage_options:
            state["profiling"] = self.profiling.evolve(storage_options=None)
        return state

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ProfiledDaskTaskRunner:
        super().__enter__()
        if _in_dask_worker():
            self._reenter_running_stage()
            return self
        try:
            from prefect_dask_profiling.prefect.session import Session

            self._session = Session.start(self, self._exit_stack)
        except Exception as exc:  # never raise here: the flow run would stay Running
            logger.warning("dask-profiling could not start: %s", exc, exc_info=True)
            self._startup_error = exc
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self._session is not None and not self._session.finished:
                self._session.finish_unattended(exc_info[1])
        except Exception:
            logger.warning("dask-profiling could not store the run at exit", exc_info=True)
        finally:
            super().__exit__(*exc_info)

    def _reenter_running_stage(self) -> None:
        """Worker-side copy: tag the Dask work the task body launches.

        Prefect enters this copy around the task body, in the thread that runs it, so every
        graph the body submits (``compute``, ``persist``, ``submit``, through any client,
        ``get_dask_client()`` included) carries the task's stage and run, and the key of
        the Prefect task as its parent: the scheduler plugin then counts the time the task
        spent waiting on that work as orchestration, not as task time.
        """
        running = running_task_annotations()
        tags = {k: running[k] for k in (STAGE_ANNOTATION, RUN_ANNOTATION) if k in running}
        key = running_task_key()
        if key is not None:
            tags[PARENT_ANNOTATION] = key
        if tags:
            self._exit_stack.enter_context(dask.annotate(**tags))

    # -- flow-side API ---------------------------------------------------------------------

    @property
    def session(self):
        """The live profiling session; raises the start-up problem if there was one."""
        if self._startup_error is not None:
            raise RuntimeError(
                f"dask-profiling could not start: {self._startup_error}. The flow's cluster "
                "or its scheduler could not be prepared; see the message above for the "
                "fix.") from self._startup_error
        if self._session is None:  # a state, not a bad value: stays a RuntimeError
            raise RuntimeError("the task runner has not been started in this process")
        return self._session

    def submit(self, task, parameters, wait_for=None, dependencies=None):
        session = self._session if not _in_dask_worker() else None
        if session is not None:
            session.preflight()
            session.check_travels(task)
        elif self._startup_error is not None and not _in_dask_worker():
            self.session  # noqa: B018 - raises the start-up error from the flow body
        future = super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)
        if session is not None:
            session.track(future.wrapped_future)
        return future

    def finish(self, error: BaseException | None = None, store: str | None = None):
        """Collect, store, publish and judge this run (idempotent).

        Raises
        ------
        RegressionDetected
            When regressions were found and ``on_regression="fail"``.
        """
        session = self.session
        session.use_store(store)
        return session.finish(error=error)


# -- the one line in user code ---------------------------------------------------------------


def _live_runner() -> ProfiledDaskTaskRunner | None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    return runner if isinstance(runner, ProfiledDaskTaskRunner) else None


def finish(error: BaseException | None = None, store: str | None = None):
    """Finish the current flow run's profiling (call at the end of the flow body).

    Raises
    ------
    RegressionDetected
        On a regression in ``"fail"`` mode: let it propagate, so the flow run ends Failed
        and its ``on_failure`` hooks fire. Before raising, the flow run's retries are
        switched off (unless ``retry_on_regression=True``), so ``@flow(retries=N)`` does
        not re-run the pipeline on it.
    """
    runner = _live_runner()
    if runner is None:  # called in the wrong place, not with a bad value: a RuntimeError
        raise RuntimeError("finish() must be called inside a flow run whose task runner is "
                           "ProfiledDaskTaskRunner")
    return runner.finish(error=error, store=store)


def profiled(fn=None, *, store_parameter: str = "store"):
    """Decorate a flow function (under ``@flow``) so its run is finished and judged.

    On a regression in ``"fail"`` mode the decorated function returns a ``Failed`` state
    (:func:`regression_state`) instead of its value: the flow run ends Failed, its
    ``on_failure`` hooks fire, and Prefect does not retry it (unless
    ``retry_on_regression=True``). When the body raises, the run is stored ``failed`` and
    the error propagates unchanged (Prefect retries it as usual).

    Parameters
    ----------
    fn
        The flow function (sync or async).
    store_parameter
        If the flow has a parameter of this name and it is not ``None``, it overrides the
        runner's store URL.

    Raises
    ------
    InvalidInput
        When ``fn`` is already a Prefect flow (``@profiled`` written above ``@flow``): the
        wrapper would then run outside the flow run and record nothing.
    """
    if fn is None:
        return functools.partial(profiled, store_parameter=store_parameter)
    if isinstance(fn, Flow):
        raise InvalidInput(
            f"@profiled is above @flow on {fn.name!r}: write it below, so it wraps the flow "
            "function and runs inside the flow run:\n\n    @flow(task_runner="
            "ProfiledDaskTaskRunner())\n    @profiled\n    def nightly(): ...")
    # The wrapper is the one closure: the flow is pickled with every task Prefect sends to
    # Dask (scheduler and worker unpickle it), and nested functions travel by value.
    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            runner = _begin(fn, store_parameter, args, kwargs)
            with _failing(runner):
                value = await fn(*args, **kwargs)
            return _ending(runner, value)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        runner = _begin(fn, store_parameter, args, kwargs)
        with _failing(runner):
            value = fn(*args, **kwargs)
        return _ending(runner, value)

    return wrapper


def _store_from(fn: Callable[..., Any], store_parameter: str, args: tuple,
                kwargs: dict) -> str | None:
    """The store URL the flow call passed as ``store_parameter``, if the flow has one."""
    signature = inspect.signature(fn)
    if store_parameter not in signature.parameters:
        return None
    return signature.bind_partial(*args, **kwargs).arguments.get(store_parameter)


def _begin(fn: Callable[..., Any], store_parameter: str, args: tuple,
           kwargs: dict) -> ProfiledDaskTaskRunner | None:
    """The live profiled runner, its store chosen and its workers checked; ``None`` (with
    a warning) when the flow runs on another task runner."""
    runner = _live_runner()
    if runner is None:
        logger.warning("@profiled: the flow's task runner is not ProfiledDaskTaskRunner; "
                       "nothing is recorded")
        return None
    runner.session.use_store(_store_from(fn, store_parameter, args, kwargs))
    runner.session.preflight()
    return runner


@contextlib.contextmanager
def _failing(runner: ProfiledDaskTaskRunner | None) -> Iterator[None]:
    """Store what ran when the flow body raises; never masks its error."""
    try:
        yield
    except BaseException as exc:
        if runner is not None:
            runner.session.finish(error=exc)
        raise


def _ending(runner: ProfiledDaskTaskRunner | None, value: Any) -> Any:
    """Finish the run: the body's value, or the Failed state of a regression.

    The run is stored with the state Prefect will derive from ``value`` (a returned failed
    future or ``Failed`` state ends the run Failed, and is retried by ``@flow(retries=N)``):
    any state but ``COMPLETED`` is stored ``failed``, kept out of baselines and never judged
    regressed, and ``value`` is returned as it is.
    """
    if runner is None:
        return value
    from prefect_dask_profiling.prefect.flow_run import returned_state
    from prefect_dask_profiling.regression.verdict import RegressionDetected

    state = returned_state(value)
    if state != "COMPLETED":
        runner.session.finish(state=state)
        return value
    try:
        runner.session.finish()
    except RegressionDetected as exc:  # "fail" mode: the flow run ends Failed
        return regression_state(exc)
    return value


def regression_state(exc: RegressionDetected):
    """The ``Failed`` state a flow function returns on a regression.

    Returned rather than raised: the run ends Failed with the verdict as its message,
    ``on_failure`` hooks fire and ``state.result()`` raises ``exc``, without Prefect's
    "Encountered exception" traceback for what is a verdict, not a bug. (Whether Prefect
    retries it is decided by ``retry_on_regression``: its server would retry a returned
    Failed state as well, see :meth:`.publish.Publisher.stop_retries`.)
    """
    from prefect.states import Failed

    return Failed(message=f"RegressionDetected: {exc}", data=exc)

