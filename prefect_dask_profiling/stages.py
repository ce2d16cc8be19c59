"""Stages: named windows in which work actually runs.

What is computed, persisted or written inside ``with stage("reduce"):`` belongs to
``"reduce"``. Attribution happens at execution: the annotation is active when the graph is
*submitted* (``compute``, ``persist``, ``to_zarr``, ``client.submit``), which survives graph
optimisation and fusion, whereas annotations set while a lazy graph is *built* are dropped
by the optimiser. So a graph built lazily in one stage and computed in the next belongs to
the next::

    with stage("read"):
        cube = xr.open_zarr(url)            # lazy: nothing runs here
    with stage("ndvi"):
        ndvi = ((cube.nir - cube.red) / (cube.nir + cube.red)).persist()   # runs here
    with stage("reduce"):
        median = ndvi.median("time").compute()

A stage opens Dask's own :func:`distributed.span` as well (for Dask's per-span fine
metrics), but attribution uses a ``stage`` annotation: spans attach per TaskGroup and the
first span wins, so they can misattribute repeated functions.

Inside a Dask worker task (e.g. a Prefect task that computes a collection) a stage inherits
the run tag of the task it runs in, so its work is counted for the right run on a shared
cluster. Listeners (the Prefect task runner) are told when a stage opens and closes: that is
how per-stage performance reports are cut and submitted futures awaited.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, cast

import dask
from dask.callbacks import Callback

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.timing.plugin import DEFAULT_STAGE, RUN_ANNOTATION, STAGE_ANNOTATION


class StageListener(Protocol):
    """Told when a stage opens and closes (implemented by the task runner)."""

    def stage_opened(self, name: str) -> Any: ...

    def stage_closed(self, name: str, token: Any, error: BaseException | None) -> None: ...


RESERVED_STAGE = "run"  # utilisation() reports the whole run under this scope

_listener: contextvars.ContextVar[StageListener | None] = contextvars.ContextVar(
    "dask_profiling_stage_listener", default=None)
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dask_profiling_stage", default=None)


def current_stage() -> str:
    """The innermost open stage, or ``"default"``."""
    return _current.get() or dask.get_annotations().get(STAGE_ANNOTATION) or DEFAULT_STAGE


def open_stage_name() -> str | None:
    """The innermost stage opened in this context with :func:`stage`, if any."""
    return _current.get()


def running_task_key() -> Any:
    """Key of the Dask task running in this thread (``None`` outside a worker task)."""
    try:
        from distributed.worker import thread_state
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    return getattr(thread_state, "key", None)


class StageAnnotations(TypedDict, total=False):
    """The annotations this package puts on Dask work: the ``stage`` a task belongs to
    (:data:`~.timing.plugin.STAGE_ANNOTATION`) and the ``profiling_run`` that submitted it
    (:data:`~.timing.plugin.RUN_ANNOTATION`). Read back from a running task, Dask's other
    annotations (``retries``, ``priority``...) ride along unread."""

    stage: str
    profiling_run: str


def running_task_annotations() -> StageAnnotations:
    """Annotations of the Dask task running in this thread (``{}`` outside a worker task)."""
    key = running_task_key()
    if key is None:
        return {}
    try:
        from distributed.worker import get_worker

        ts = get_worker().state.tasks.get(key)
        return cast(StageAnnotations, dict(ts.annotations or {})) if ts is not None else {}
    except (ValueError, AttributeError):
        return {}


@contextlib.contextmanager
def use_listener(listener: StageListener | None) -> Iterator[None]:
    """Make ``listener`` receive the stages opened in this context."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def set_listener(listener: StageListener | None) -> contextvars.Token:
    """Set the listener for the current context; reset it with :func:`reset_listener`."""
    return _listener.set(listener)


def reset_listener(token: contextvars.Token) -> None:
    _listener.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[str]:
    """Attribute the work that runs inside this block to stage ``name``.

    Parameters
    ----------
    name
        Stage name: non-empty, no path separators, ``..`` or control characters.

    Yields
    ------
    The stage name.

    Raises
    ------
    ValueError
        If ``name`` is not a valid stage name or is the reserved ``"run"``.
    """
    validate_name(name, "stage")
    if name == RESERVED_STAGE:
        raise InvalidInput(f"stage must not be {RESERVED_STAGE!r}: that name is the whole-run row "
                           "of utilisation()")
    annotations: StageAnnotations = {"stage": name}
    run = dask.get_annotations().get(RUN_ANNOTATION) or running_task_annotations().get(
        RUN_ANNOTATION)
    if run:
        annotations["profiling_run"] = run
    listener = _listener.get()
    current_token = _current.set(name)
    with contextlib.ExitStack() as stack:
        stack.callback(_current.reset, current_token)
        stack.enter_context(_span(name))
        stack.enter_context(dask.annotate(**annotations))
        token = listener.stage_opened(name) if listener is not None else None
        error: BaseException | None = None
        try:
            yield name
        except BaseException as exc:
            error = exc
            raise
        finally:
            if listener is not None:
                listener.stage_closed(name, token, error)


@dataclass(frozen=True)
class LocalCount:
    """Dask work run by Dask's local schedulers while a :class:`LocalWorkWatch` watched."""

    tasks: int
    seconds: float
    computes: int


class LocalWorkWatch(Callback):
    """Count Dask tasks that Dask's *local* schedulers run in this process while registered.

    A stage records what runs on the cluster. Work computed with Dask's local schedulers
    (threads or processes of this process) never reaches the scheduler, so a stage around
    it records nothing: in a Prefect flow body that is any bare ``.compute()``, because
    prefect-dask's clients are not the default client. Dask's local-scheduler callbacks
    see that work; this one counts tasks, computes and the computes' wall seconds. Work
    computed inside a Dask worker task is left out (the cluster records its task).

    Registered globally (``Callback.active``): work computed by other threads of the
    process while it is registered counts too.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._tasks = 0
        self._seconds = 0.0
        self._computes = 0

    def _start(self, dsk: Any) -> None:
        if running_task_key() is None:
            with self._lock:
                self._started[threading.get_ident()] = time.perf_counter()

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        if threading.get_ident() in self._started:
            with self._lock:
                self._tasks += 1

    def _finish(self, dsk: Any, state: Any, errored: bool) -> None:
        with self._lock:
            started = self._started.pop(threading.get_ident(), None)
            if started is not None:
                self._seconds += time.perf_counter() - started
                self._computes += 1

    def count(self) -> LocalCount:
        """What was counted so far."""
        with self._lock:
            return LocalCount(tasks=self._tasks, seconds=self._seconds,
                              computes=self._computes)

    def unregister(self) -> None:
        """Stop counting (a no-op when it is not registered)."""
        Callback.active.discard(self._callback)


def _span(name: str) -> contextlib.AbstractContextManager:
    try:
        from distributed import span
    except ImportError:  # pragma: no cover - distributed is a dependency
        return contextlib.nullcontext()
    return span(name)
