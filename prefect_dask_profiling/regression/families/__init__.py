"""The verdict families and their one registry (:data:`REGISTRY`).

Every module of this package is one family and registers it when imported: the built-in
ones first, in the order they are judged — ``time`` (:mod:`.time`), ``drift``
(:mod:`.drift`), ``memory`` (:mod:`.memory`), ``requests`` (:mod:`.requests`), ``cost``
(idle resources, :mod:`.idle`) — then any other module of the package, by name. A new family
is a :class:`Family` subclass in a file of its own here that ends with
``REGISTRY.register(MyFamily())`` (a test's family: :meth:`Registry.registered`).
"""

import importlib
import pkgutil

from prefect_dask_profiling.regression.families.base import (
    REGISTRY,
    Family,
    Judged,
    Registry,
    StageFamily,
)

__all__ = ["REGISTRY", "Family", "Judged", "Registry", "StageFamily"]

BUILT_IN = ("time", "drift", "memory", "requests", "idle")


def _load() -> None:
    """Import (so register) the built-in families in order, then every other module."""
    found = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base")
    for name in (*BUILT_IN, *[m for m in found if m not in BUILT_IN]):
        importlib.import_module(f"{__name__}.{name}")


_load()
