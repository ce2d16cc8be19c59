"""What the session reads of the Prefect flow run it profiles: identity, loadability, state.

Each function reads Prefect's run context (or its API) and returns plain values; none keeps
state. The session (:mod:`~prefect_dask_profiling.prefect.session`) calls them.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import distributed

from prefect_dask_profiling._util import validate_name
from prefect_dask_profiling.errors import Unpicklable, WorkersCannotLoad

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.store.manifest import RunContext


def read_identity(ctx: RunContext, pipeline: str | None = None,
                  version: str | None = None) -> bool:
    """Fill ``ctx`` from the current flow run (pipeline, version, flow run, attempt);
    ``False`` outside a flow run (``ctx`` unchanged). ``pipeline`` and ``version``, when
    given, name the run instead of the flow's name and explicit version.

    Raises
    ------
    ValueError
        For a pipeline or version name that is not a valid name.
    """
    from prefect.context import FlowRunContext

    run_ctx = FlowRunContext.get()
    if run_ctx is None:
        return False
    flow, flow_run = run_ctx.flow, run_ctx.flow_run
    ctx.pipeline = validate_name(pipeline or flow.name, "pipeline")
    source_hash = _source_hash(flow)
    explicit = flow.version if flow.version and flow.version != source_hash else None
    ctx.version = validate_name(version or explicit or "unversioned", "version")
    ctx.source_hash = source_hash
    if flow_run is not None:
        ctx.flow_run_id = str(flow_run.id)
        ctx.flow_run_name = flow_run.name
        ctx.deployment = str(flow_run.deployment_id) if flow_run.deployment_id else None
        # Prefect's run_count (prefect.runtime.flow_run.run_count): 1, then each retry
        ctx.attempt = int(flow_run.run_count) if flow_run.run_count else None
    return True


@dataclass(frozen=True)
class Held:
    """An object that cannot be pickled, and the chain of names that holds it.

    ``path`` reads from the outside in, e.g. ``flow 'nightly' → function 'nightly' →
    closure variable 'lock'``; ``error`` is pickle's own word on the innermost object.
    """

    path: str
    error: str

    def message(self, what: str) -> str:
        """One clear line: what cannot travel, what holds it, and the fix."""
        return (f"{what} cannot be sent to the Dask workers: {self.path} cannot be pickled "
                f"({self.error}). A flow script run as `python flow.py` is __main__, so its "
                "functions travel by value with every global and closure variable they use. "
                "Create such an object inside the task that uses it, or keep it in an "
                "importable module (module-level objects of installed code travel by "
                "reference).")


def scheduled_start() -> datetime | None:
    """The current flow run's scheduled start (its ``expected_start_time``, in UTC when
    naive); ``None`` outside a flow run or without one. Never raises."""
    from prefect.context import FlowRunContext

    try:
        at = getattr(getattr(FlowRunContext.get(), "flow_run", None), "expected_start_time",
                     None)
    except Exception:
        return None
    if at is None:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def check_workers_load(client: Client) -> Held | None:
    """Check that the workers can load what Prefect sends them with a task: the flow.

    Prefect sends the flow run context, the flow in it, with every task it submits. A flow
    that cannot be pickled at all is no error yet: its Dask work may run only in its body
    (``get_dask_client()``), where nothing is sent. It is returned (``None`` when the flow
    pickles, or outside a flow run) for the caller to warn, and to raise at the first
    submission that needs it.

    Raises
    ------
    WorkersCannotLoad
        Naming the workers and the fix, when the flow pickles but a worker cannot load it
        (the package or the flow's code is missing there: a worker that cannot unpickle a
        task hangs the flow silently).
    """
    from prefect.context import FlowRunContext

    run_ctx = FlowRunContext.get()
    if run_ctx is None:
        return None
    try:
        payload = distributed.protocol.pickle.dumps(run_ctx.flow)
    except Exception:
        return find_unpicklable(run_ctx.flow, f"flow {run_ctx.flow.name!r}")

    def can_load(blob: bytes) -> str | None:  # local: travels by value
        import pickle

        try:
            pickle.loads(blob)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    problems = {w: e for w, e in client.run(can_load, payload).items() if e}
    if problems:
        detail = "; ".join(f"{w}: {e}" for w, e in sorted(problems.items()))
        raise WorkersCannotLoad(
            f"Dask workers cannot load this flow ({detail}). Install the flow's code and "
            "prefect-dask-profiling (same versions as the flow process) on every worker, "
            "or start the workers from a directory/PYTHONPATH where the flow's module "
            "imports.")
    return None


def check_task_pickles(task: Any) -> None:
    """Raise the clear error for a Prefect task that cannot be pickled (what distributed
    would otherwise raise as a bare ``TypeError`` from deep inside its serializer).

    Raises
    ------
    Unpicklable
        Naming the object the task holds and the fix.
    """
    try:
        distributed.protocol.pickle.dumps(task)
    except Exception:
        held = find_unpicklable(task, f"task {getattr(task, 'name', task)!r}")
        raise Unpicklable(held.message(f"Task {getattr(task, 'name', task)!r}")) from None


# The search for what cannot be pickled looks this deep and at this many objects at most: a
# flow's closure chain is a few levels (flow → wrapper → function → global or cell).
_MAX_DEPTH = 8
_MAX_VISITS = 400


def find_unpicklable(obj: Any, label: str) -> Held:
    """The innermost object under ``obj`` that cannot be pickled, with the names that hold it.

    Walks what cloudpickle sends of a function by value (closure variables, the globals its
    code names, defaults, ``__wrapped__``), an object's attributes and a container's items,
    and returns the deepest part that still fails; ``obj`` itself when no part fails alone.
    """
    visits = [0]
    return _search(obj, label, 0, visits, {id(obj)}) or Held(label, _pickle_error(obj) or "")


def _search(obj: Any, label: str, depth: int, visits: list[int], seen: set[int]) -> Held | None:
    """``Held`` for the deepest failing part of ``obj`` (``None`` when ``obj`` pickles)."""
    error = _pickle_error(obj)
    if error is None:
        return None
    visits[0] += 1
    if depth < _MAX_DEPTH and visits[0] < _MAX_VISITS:
        for name, part in _parts(obj):
            if id(part) in seen:
                continue
            seen.add(id(part))
            found = _search(part, f"{label} → {name}", depth + 1, visits, seen)
            if found is not None:
                return found
    return Held(label, error)


def _pickle_error(obj: Any) -> str | None:
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """The named parts that travel with ``obj`` when cloudpickle pickles it; a Prefect flow's
    or task's own function (unwrapped) first."""
    fn = getattr(obj, "fn", None)
    if isinstance(fn, types.FunctionType):
        user_fn = inspect.unwrap(fn)
        yield f"function {user_fn.__qualname__}", user_fn
    if isinstance(obj, types.FunctionType):
        yield from _function_parts(obj)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield f"item {key!r}", value
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"item {i}", value
    elif not isinstance(obj, (type, types.ModuleType)) and hasattr(obj, "__dict__"):
        for key, value in vars(obj).items():
            yield f"attribute {key!r}", value


def _function_parts(fn: types.FunctionType) -> Iterator[tuple[str, Any]]:
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            yield f"closure variable {name!r}", cell.cell_contents
    for name in sorted(_global_names(code)):
        if name in fn.__globals__:
            yield f"global {name!r}", fn.__globals__[name]
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f"default {i}", value
    if hasattr(fn, "__wrapped__"):
        yield "the function it wraps", fn.__wrapped__


def _global_names(code: types.CodeType) -> set[str]:
    """The names a code object (and the code nested in it) may read as globals."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def returned_state(value: Any) -> str:
    """The state type Prefect gives the flow run for what its function returned.

    The flow's end is stored before Prefect turns the return value into the final state, so
    this applies Prefect's own rule to it first (``return_value_to_state``, futures resolved
    to their states as the engine does): a hand-made state is the final state; a state, a
    future or a collection of them completes only when all completed (``CANCELLED``,
    ``PAUSED``, else ``FAILED``); any other value ``COMPLETED``.
    """
    from prefect.futures import resolve_futures_to_states
    from prefect.states import State, StateGroup, is_state_iterable
    from prefect.utilities.collections import ensure_iterable

    resolved = resolve_futures_to_states(value)
    if isinstance(resolved, State):
        details = resolved.state_details
        if not details.flow_run_id and not details.task_run_id:
            return resolved.type.value
    elif not is_state_iterable(resolved):
        return "COMPLETED"
    states = StateGroup(ensure_iterable(resolved))
    if states.all_completed():
        return "COMPLETED"
    if states.any_cancelled():
        return "CANCELLED"
    return "PAUSED" if states.any_paused() else "FAILED"


def final_state(flow_run_id: str | None, error: BaseException | None) -> str:
    """The flow run's state type as Prefect's API has it (``COMPLETED``, ``FAILED``...);
    ``FAILED`` (``error``) or ``UNKNOWN`` when it cannot be read."""
    if flow_run_id is None:
        return "FAILED" if error is not None else "UNKNOWN"
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
        return run.state.type.value if run.state is not None else "UNKNOWN"
    except Exception:
        return "FAILED" if error is not None else "UNKNOWN"


def _source_hash(flow) -> str | None:
    from prefect.utilities.hashing import file_hash

    try:
        return file_hash(inspect.getsourcefile(inspect.unwrap(flow.fn)))
    except (TypeError, OSError):
        return None
