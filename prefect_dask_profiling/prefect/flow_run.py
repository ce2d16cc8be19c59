"""What the session reads of the Prefect flow run it profiles: identity, loadability, state.

Each function reads Prefect's run context (or its API) and returns plain values; none keeps
state. The session (:mod:`~prefect_dask_profiling.prefect.session`) calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import distributed

from prefect_dask_profiling._util import validate_name

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


def check_workers_load(client: Client) -> bool:
    """Check that the workers can load the current flow (what Prefect sends them); ``False``
    outside a flow run (nothing checked).

    Raises
    ------
    RuntimeError
        Naming the workers and the fix (a worker that cannot unpickle a task hangs the flow
        silently).
    """
    from prefect.context import FlowRunContext

    run_ctx = FlowRunContext.get()
    if run_ctx is None:
        return False
    payload = distributed.protocol.pickle.dumps(run_ctx.flow)

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
        raise RuntimeError(
            f"Dask workers cannot load this flow ({detail}). Install the flow's code and "
            "prefect-dask-profiling (same versions as the flow process) on every worker, "
            "or start the workers from a directory/PYTHONPATH where the flow's module "
            "imports.")
    return True


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
    import inspect

    from prefect.utilities.hashing import file_hash

    try:
        return file_hash(inspect.getsourcefile(inspect.unwrap(flow.fn)))
    except (TypeError, OSError):
        return None
