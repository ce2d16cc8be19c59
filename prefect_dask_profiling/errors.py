"""Every error the package raises on purpose, in one tree (the lowest layer: stdlib only).

Modelled on httpx's ``_exceptions.py``: one base, a few branches a caller can catch as a
whole, leaves only where the code — or a caller — acts differently on them::

    ProfilingError
    ├── InvalidInput (also a ValueError)      a value given by the user is not allowed
    │   └── BenchInputError                   bad benchmark input (workload, cluster, options)
    ├── StoreError                            the run store cannot answer as asked
    │   ├── StoreNotFound                     no such store, run, file or report
    │   ├── DamagedRecord                     a stored file is malformed, truncated or changed
    │   ├── StoreConflict                     other bytes already there (never overwritten)
    │   └── StoreUnavailable                  the store could not be used (retry, fix access)
    │       ├── StoreUnreachable              no answer: refused connection, timeout, marked down
    │       ├── StoreAccessDenied             the credentials lack a permission (403)
    │       └── HistoryUnavailable            a run's history cannot be listed or read
    ├── CannotShip (also a RuntimeError)      what Prefect sends the Dask workers cannot travel
    │   ├── WorkersCannotLoad                 the workers cannot unpickle the flow
    │   └── Unpicklable (also a TypeError)    an object the flow or a task holds cannot be pickled
    └── VerdictFailed                         a judgement fails the run on purpose
        └── RegressionDetected                (in :mod:`~prefect_dask_profiling.regression.verdict`,
                                               its message is built from the verdict table)

The old homes keep working: ``_util.InvalidInput``, ``store.errors.StoreError``,
``store.runs.StoreError``, ``bench.config.BenchInputError`` and ``store.spool.Clash`` (now
:class:`StoreConflict`) are these classes. The command line maps the tree to exit codes in
one place (:func:`prefect_dask_profiling.cli._output.exit_code`).
"""

from __future__ import annotations

__all__ = ["BenchInputError", "CannotShip", "DamagedRecord", "HistoryUnavailable",
           "InvalidInput", "ProfilingError",
           "StoreAccessDenied", "StoreConflict", "StoreError", "StoreNotFound",
           "StoreUnavailable", "StoreUnreachable", "Unpicklable", "VerdictFailed",
           "WorkersCannotLoad"]


class ProfilingError(Exception):
    """Base of every error dask-profiling raises on purpose; the message is one clear line."""


class InvalidInput(ProfilingError, ValueError):
    """A value given by the user is not allowed; the message names it and what is allowed.

    Raised by argument validation only, so callers (the command line) can tell bad input
    (exit code 2) from a bug (any other exception). A ``ValueError``, so existing
    ``except ValueError`` code keeps working.
    """


class BenchInputError(InvalidInput):
    """Bad benchmark input (unknown workload, malformed options, unusable cluster)."""


class StoreError(ProfilingError):
    """The run store cannot answer as asked: the message names the store, run or file.

    Raised as is for conditions without a leaf of their own (a run id in two pipelines...).
    """


class StoreNotFound(StoreError):
    """No such store, pipeline, run, file or report."""


class DamagedRecord(StoreError):
    """A stored file is not what its writer wrote: malformed, truncated, changed, of another
    schema. Readers of a history skip such a run with a warning."""


class StoreConflict(StoreError):
    """The store already holds other bytes where a file must be created (runs are never
    overwritten); a spooled file that meets one stays in the spool."""


class StoreUnavailable(StoreError):
    """The store could not be used at all: retry later, or fix the endpoint or permissions.

    Writers never raise it — they spool — but readers do, and a history that cannot be read
    because of it must leave a run unjudged, never judged on nothing.
    """


class StoreUnreachable(StoreUnavailable):
    """No answer: a refused connection, a timeout, or the store was marked down moments ago."""


class StoreAccessDenied(StoreUnavailable):
    """The store refused the credentials or lacks a permission (HTTP 403)."""


class HistoryUnavailable(StoreUnavailable):
    """The history of a pipeline version could not be listed or read: no judgement is
    possible, and the run is stored ``unjudged`` with this message as the reason.

    Distinct from an empty history (a new version), which is judged ``insufficient-history``.
    """


class CannotShip(ProfilingError, RuntimeError):
    """What Prefect sends the Dask workers with a task (the task, and the flow run context
    with the flow) cannot travel; the message names the object or the workers and the fix.

    Raised in the flow body at the first submission that needs it, never from deep inside
    distributed. A ``RuntimeError``, as the worker check always raised.
    """


class WorkersCannotLoad(CannotShip):
    """The workers cannot unpickle the flow: the package or the flow's code is missing there
    (a worker that cannot unpickle a task hangs the flow silently, hence the early check)."""


class Unpicklable(CannotShip, TypeError):
    """An object the flow or a submitted task holds (a lock, a connection) cannot be pickled.

    A flow script is ``__main__``, so cloudpickle sends its functions by value with every
    global and closure variable they use. While nothing is submitted this is a warning only.
    """


class VerdictFailed(ProfilingError):
    """A judgement fails the run on purpose (a confirmed regression); not a fault."""
