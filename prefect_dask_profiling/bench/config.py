"""A benchmark session's inputs: :class:`BenchConfig`, its validation and the workload.

The same inputs (``n`` values, seeds, aggregates per batch, warmup policy) are used on
every side of a session. Bad input (unknown workload, malformed options) raises
:class:`BenchInputError`, a ``ValueError``: the CLI prints it as one line and exits 2. The
checks that need a cluster (unreachable scheduler, no workers, workload not importable on
the workers) raise it too, from :mod:`prefect_dask_profiling.bench.clusters` and
:mod:`prefect_dask_profiling.bench.preflight`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefect_dask_profiling.errors import BenchInputError


@dataclass
class BenchConfig:
    """One benchmark session's inputs (identical on every side)."""

    workload: str
    n: list[int] = field(default_factory=lambda: [128, 256])
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    warmup: int = 1
    repeats: int = 3
    out: str = "benchmark_results/profiles"
    scheduler: str | None = None
    local: bool = True
    local_workers: int = 2
    local_threads: int = 1
    local_memory_limit: str | None = None
    calibration_repeats: int = 5
    connect_timeout: float = 5.0
    worker_wait: float = 3.0

    def validate(self) -> None:
        """Raise :class:`BenchInputError` naming the first bad field."""
        if not self.local and not self.scheduler:
            raise BenchInputError("nothing to run: --no-local needs --scheduler tcp://HOST:PORT")
        if not self.n or any(v < 1 for v in self.n):
            raise BenchInputError(f"--n must be positive integers, got {self.n}")
        if not self.seeds:
            raise BenchInputError("--seeds must list at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise BenchInputError(f"--seeds has duplicates: {self.seeds}")
        if self.warmup < 0:
            raise BenchInputError(f"--warmup must be >= 0, got {self.warmup}")
        if self.repeats < 1:
            raise BenchInputError(f"--repeats must be >= 1, got {self.repeats}")
        if self.calibration_repeats < 1:
            raise BenchInputError(
                f"--calibration-repeats must be >= 1, got {self.calibration_repeats}")
        if self.local and self.local_workers < 1:
            raise BenchInputError(f"--local-workers must be >= 1 (zero workers), got "
                                  f"{self.local_workers}")
        if self.local and self.local_threads < 1:
            raise BenchInputError(f"--local-threads must be >= 1, got {self.local_threads}")
        if self.scheduler is not None and "://" not in self.scheduler:
            raise BenchInputError(
                f"--scheduler must be an address like tcp://HOST:PORT, got {self.scheduler!r}")
        if self.connect_timeout <= 0:
            raise BenchInputError(f"--connect-timeout must be > 0, got {self.connect_timeout}")



def parse_ints(text: str, option: str) -> list[int]:
    """``"128,256"`` → ``[128, 256]``; :class:`BenchInputError` naming ``option`` otherwise."""
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise BenchInputError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise BenchInputError(f"{option} must list at least one integer, got {text!r}")
    return values


def load_workload(spec: str) -> Callable[[int, int], Any]:
    """Import ``package.module:callable``.

    Raises
    ------
    BenchInputError
        Malformed spec, module not importable, attribute missing or not callable.
    """
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise BenchInputError(
            f"--workload must look like package.module:callable, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BenchInputError(f"unknown workload {spec!r}: cannot import module "
                              f"{module_name!r} ({type(exc).__name__}: {exc})") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise BenchInputError(f"unknown workload {spec!r}: module {module_name!r} has no "
                                  f"attribute {attr!r}")
    if not callable(obj):
        raise BenchInputError(f"workload {spec!r} is not callable")
    return obj
