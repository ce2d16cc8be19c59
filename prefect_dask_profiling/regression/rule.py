"""The regression rule: every setting of the check, its default and its allowed range, once.

The runner (``threshold``, ``history``, ``check_options``), ``dask-profiling check`` and
:func:`~prefect_dask_profiling.regression.verdict.detect_regressions` all build a
:class:`RegressionRule`, so a bad value is refused where it is given — when the runner is
constructed, before any cluster starts — with a message naming the setting and its range,
instead of failing at night inside the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from prefect_dask_profiling._util import InvalidInput

__all__ = ["CHECK_OPTION_KEYS", "RegressionRule"]


def _number(name: str, value: object, *, low: float, low_open: bool,
            high: float | None = None) -> None:
    """Refuse ``value`` unless it is a finite real number (not a bool) in the range."""
    lower = f"> {low:g}" if low_open else f">= {low:g}"
    allowed = f"between {low:g} and {high:g}" if high is not None else lower
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and math.isfinite(value) and (value > low if low_open else value >= low)
          and (high is None or value <= high))
    if not ok:
        raise InvalidInput(f"{name} must be a finite number {allowed}, got {value!r}")


def _flag(name: str, value: object) -> None:
    """Refuse ``value`` unless it is a ``bool``."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be true or false, got {value!r}")


def _whole(name: str, value: object, *, low: int) -> None:
    """Refuse ``value`` unless it is an ``int`` (not a bool) of at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidInput(f"{name} must be a whole number >= {low}, got {value!r}")


@dataclass(frozen=True)
class RegressionRule:
    """When a prefix counts as regressed, and how many runs form the baseline.

    Parameters
    ----------
    threshold
        Minimum ``latest / baseline median`` ratio for a regression (> 1); an improvement
        needs ``ratio <= 1 / threshold``. 2.0: "more than doubled".
    z_threshold
        Minimum robust z for a regression (> 0); 3.5 is Iglewicz & Hoaglin's modified-z
        cut-off.
    min_seconds
        Minimum absolute change in seconds (>= 0).
    min_share
        Minimum share of the run's task time, between 0 and 1: tiny prefixes never fail a
        flow.
    min_history
        Minimum number of baseline runs, overall and for the prefix, to give a verdict (>= 1).
    mad_floor
        Floor of the spread as a fraction of the baseline median (>= 0): no nightly timing
        repeats to better than a few percent.
    abs_floor_s
        Absolute floor of the spread in seconds (> 0): sub-second prefixes are dominated by
        timer and scheduling jitter.
    history
        How many earlier healthy runs form the baseline at most (>= 1).
    memory_regression
        Judge each stage's peak process memory and spilled bytes against the baseline
        (:mod:`~prefect_dask_profiling.regression.memory`).
    memory_threshold
        Minimum ``latest / baseline median`` ratio of a memory regression (> 1). 1.5: on a
        quiet history (a real cluster's peaks repeat to a few MiB) a stage holding 150 MB
        more on 1 GiB workers is 1.67x; noisy histories are held back by the z.
    memory_z_threshold
        Minimum z of a memory regression (> 0), the spread being the largest of
        1.4826 x MAD, half the history's range and ``memory_mad_floor`` x median. 6: no
        false alarm in 80,000 generated stage-metric-nights with +-20% peaks and late
        garbage collections (5: 6 of them; ``benchmarks/memory_rule.py``).
    memory_mad_floor
        Floor of the memory spread as a fraction of the baseline median (>= 0).
    memory_min_fraction, memory_min_bytes
        Minimum effect of a memory regression: the increase must be at least
        ``min(memory_min_fraction x worker memory limit, memory_min_bytes)`` (a fraction
        between 0 and 1; bytes >= 0). Defaults 10% and 256 MiB.
    near_oom
        Flag a stage whose headroom (min over workers of ``(limit - peak) / limit``) fell
        under ``near_oom_headroom``; needs no history.
    near_oom_headroom
        Headroom under which a stage is ``near-oom``, between 0 and 1 (0.10).

    Raises
    ------
    InvalidInput
        A ``ValueError`` naming the setting and its allowed range.
    """

    threshold: float = 2.0
    z_threshold: float = 3.5
    min_seconds: float = 1.0
    min_share: float = 0.05
    min_history: int = 3
    mad_floor: float = 0.05
    abs_floor_s: float = 0.1
    history: int = 8
    memory_regression: bool = True
    memory_threshold: float = 1.5
    memory_z_threshold: float = 6.0
    memory_mad_floor: float = 0.10
    memory_min_fraction: float = 0.10
    memory_min_bytes: int = 256 * 2**20
    near_oom: bool = True
    near_oom_headroom: float = 0.10

    def __post_init__(self) -> None:
        _number("threshold", self.threshold, low=1, low_open=True)
        _number("z_threshold", self.z_threshold, low=0, low_open=True)
        _number("min_seconds", self.min_seconds, low=0, low_open=False)
        _number("min_share", self.min_share, low=0, low_open=False, high=1)
        _whole("min_history", self.min_history, low=1)
        _number("mad_floor", self.mad_floor, low=0, low_open=False)
        _number("abs_floor_s", self.abs_floor_s, low=0, low_open=True)
        _whole("history", self.history, low=1)
        _flag("memory_regression", self.memory_regression)
        _number("memory_threshold", self.memory_threshold, low=1, low_open=True)
        _number("memory_z_threshold", self.memory_z_threshold, low=0, low_open=True)
        _number("memory_mad_floor", self.memory_mad_floor, low=0, low_open=False)
        _number("memory_min_fraction", self.memory_min_fraction, low=0, low_open=False, high=1)
        _number("memory_min_bytes", self.memory_min_bytes, low=0, low_open=False)
        _flag("near_oom", self.near_oom)
        _number("near_oom_headroom", self.near_oom_headroom, low=0, low_open=False, high=1)

    @classmethod
    def from_options(cls, threshold: float = 2.0, history: int = 8,
                     check_options: dict[str, Any] | None = None) -> RegressionRule:
        """The rule from the runner's options: ``threshold``, ``history`` and the rest.

        Parameters
        ----------
        threshold, history
            As in :class:`RegressionRule`.
        check_options
            Any other settings by name (keys of :data:`CHECK_OPTION_KEYS`).

        Raises
        ------
        InvalidInput
            For an unknown key (naming the allowed ones) or a value out of range.
        """
        options = {} if check_options is None else check_options
        if not isinstance(options, dict):
            raise InvalidInput(f"check_options must be a dict, got {type(options).__name__}")
        unknown = sorted(set(options) - set(CHECK_OPTION_KEYS), key=str)
        if unknown:
            raise InvalidInput(f"check_options has unknown keys {unknown}; "
                               f"allowed: {sorted(CHECK_OPTION_KEYS)}")
        return cls(threshold=threshold, history=history, **options)

    def check_options(self) -> dict[str, Any]:
        """The settings other than ``threshold`` and ``history``, by name."""
        values = asdict(self)
        return {k: values[k] for k in CHECK_OPTION_KEYS}


CHECK_OPTION_KEYS: tuple[str, ...] = tuple(
    f.name for f in fields(RegressionRule) if f.name not in ("threshold", "history"))
