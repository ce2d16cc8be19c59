"""The regression rule: every setting of the check, its default and its allowed range, once.

The runner (``threshold``, ``history``, ``check_options``), ``dask-profiling check`` and
:func:`~prefect_dask_profiling.regression.verdict.detect_regressions` all build a
:class:`RegressionRule`, so a bad value is refused where it is given — when the runner is
constructed, before any cluster starts — with a message naming the setting and its range,
instead of failing at night inside the verdict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TypedDict, cast

from prefect_dask_profiling._util import InvalidInput

__all__ = ["CHECK_OPTION_KEYS", "CONFIRM_MODES", "COST_REGRESSION_MODES", "DriftRule",
           "RegressionRule", "Rules"]

# How a prefix flagged on one night fails the run: see RegressionRule.confirm.
CONFIRM_MODES: tuple[str, ...] = ("auto", "never", "always")
# What a stage whose idle worker-hours grew does: see RegressionRule.cost_regression.
COST_REGRESSION_MODES: tuple[str, ...] = ("warn", "fail", "off")


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


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Refuse ``value`` unless it is one of the ``allowed`` strings."""
    if not isinstance(value, str) or value not in allowed:
        raise InvalidInput(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                           f"got {value!r}")
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
        flow. A regression needs it of tonight's run or of the usual run (the baseline
        medians' sum), so a regression elsewhere that inflates tonight's total does not
        hide it.
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
    confirm
        When a prefix that passes the rule on one night fails the run
        (:mod:`~prefect_dask_profiling.regression.confirm`): ``"auto"`` — at once when the
        night is conclusive (an extreme jump, or a jump well beyond the pipeline's recent
        one-night excursions), else it is ``suspected`` and the next run confirms or clears
        it; ``"never"`` — at once, always (the rule before confirmation existed);
        ``"always"`` — only once a second night confirms it.
    resolve_after
        How many consecutive runs back within the baseline close an episode as
        ``resolved`` (>= 1).
    memory_regression
        Judge each stage's peak process memory and spilled bytes against the baseline
        (:mod:`~prefect_dask_profiling.regression.memory`).
    memory_history
        How many earlier runs form the memory baseline at most (>= 1; 30): spills come on
        some nights only, and eight nights cannot show a stage that spills on one night in
        ten (``benchmarks/alert_quality.py``: with 8, two spill nights in a row of such a
        stage failed 9 of 1,920 nights).
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
    memory_onset_chance
        How unlikely, between 0 and 1 (exclusive), a run of flagged nights must be before an
        *onset* confirms: a memory metric none of whose ``n`` baseline nights reached the
        minimum effect (a stage that has not spilled) and that does tonight. ``n`` clean
        nights cannot rule out an occasional spill rate of ``1 / (n + 2)`` (Laplace's rule
        of succession), so the onset confirms after ``k`` nights in a row, the smallest
        ``k >= 2`` with ``(1 / (n + 2)) ** k <= memory_onset_chance``: 1e-4 needs 4 nights
        after 8 to 19 clean ones, 3 after 20 to 97 (``benchmarks/alert_quality.py``: a stage
        spilling 300-600 MiB on one night in ten failed 9 and 11 of 1,920 nights with two
        nights, 0 of 3,840 with the onset rule).
    memory_min_fraction, memory_min_bytes
        Minimum effect of a memory regression: the increase must be at least
        ``min(memory_min_fraction x worker memory limit, memory_min_bytes)`` (a fraction
        between 0 and 1; bytes >= 0). Defaults 10% and 256 MiB.
    near_oom
        Flag a stage whose headroom (min over workers of ``(limit - peak) / limit``) fell
        under ``near_oom_headroom``; needs no history.
    near_oom_headroom
        Headroom under which a stage is ``near-oom``, between 0 and 1 (0.10).
    requests_regression
        Judge each stage's storage requests and bytes per chunk against the baseline
        (:mod:`~prefect_dask_profiling.regression.requests`).
    requests_threshold
        Minimum ``latest / baseline median`` ratio of a request regression (> 1); 2.0:
        "the requests per chunk doubled".
    requests_min_per_chunk
        Minimum increase in requests per chunk for a request regression (>= 0): one more
        request for every chunk read (0.5 MiB per chunk for ``bytes_per_chunk``), so a
        stage that went from 1.1 to 2.3 requests per chunk on a handful of chunks is not
        one.
    cost_regression
        What a stage whose idle worker-hours grew against the baseline does
        (:mod:`~prefect_dask_profiling.regression.cost`): ``"warn"`` (default) — named in
        the manifest, the artifact and a warning, never in the outcome; ``"fail"`` — judged
        like storage requests (one night is never conclusive: the next night confirms or
        clears it; episodes, acknowledgements) and a confirmed idle regression fails the run
        like a time regression; ``"off"`` — not judged. A runner option of its own, not a
        ``check_options`` key.

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
    confirm: str = "auto"
    resolve_after: int = 3
    memory_regression: bool = True
    memory_history: int = 30
    memory_threshold: float = 1.5
    memory_z_threshold: float = 6.0
    memory_mad_floor: float = 0.10
    memory_onset_chance: float = 1e-4
    memory_min_fraction: float = 0.10
    memory_min_bytes: int = 256 * 2**20
    near_oom: bool = True
    near_oom_headroom: float = 0.10
    requests_regression: bool = True
    requests_threshold: float = 2.0
    requests_min_per_chunk: float = 1.0
    cost_regression: str = "warn"

    def __post_init__(self) -> None:
        _number("threshold", self.threshold, low=1, low_open=True)
        _number("z_threshold", self.z_threshold, low=0, low_open=True)
        _number("min_seconds", self.min_seconds, low=0, low_open=False)
        _number("min_share", self.min_share, low=0, low_open=False, high=1)
        _whole("min_history", self.min_history, low=1)
        _number("mad_floor", self.mad_floor, low=0, low_open=False)
        _number("abs_floor_s", self.abs_floor_s, low=0, low_open=True)
        _whole("history", self.history, low=1)
        _choice("confirm", self.confirm, CONFIRM_MODES)
        _whole("resolve_after", self.resolve_after, low=1)
        _flag("memory_regression", self.memory_regression)
        _whole("memory_history", self.memory_history, low=1)
        _number("memory_threshold", self.memory_threshold, low=1, low_open=True)
        _number("memory_z_threshold", self.memory_z_threshold, low=0, low_open=True)
        _number("memory_mad_floor", self.memory_mad_floor, low=0, low_open=False)
        _number("memory_onset_chance", self.memory_onset_chance, low=0, low_open=True,
                high=1)
        if self.memory_onset_chance >= 1:
            raise InvalidInput(f"memory_onset_chance must be a finite number between 0 and "
                               f"1 (exclusive), got {self.memory_onset_chance!r}")
        _number("memory_min_fraction", self.memory_min_fraction, low=0, low_open=False, high=1)
        _number("memory_min_bytes", self.memory_min_bytes, low=0, low_open=False)
        _flag("near_oom", self.near_oom)
        _number("near_oom_headroom", self.near_oom_headroom, low=0, low_open=False, high=1)
        _flag("requests_regression", self.requests_regression)
        _number("requests_threshold", self.requests_threshold, low=1, low_open=True)
        _number("requests_min_per_chunk", self.requests_min_per_chunk, low=0,
                low_open=False)
        _choice("cost_regression", self.cost_regression, COST_REGRESSION_MODES)

    @classmethod
    def from_options(cls, threshold: float = 2.0, history: int = 8,
                     check_options: CheckOptions | None = None,
                     cost_regression: str = "warn") -> RegressionRule:
        """The rule from the runner's options: ``threshold``, ``history`` and the rest.

        Parameters
        ----------
        threshold, history, cost_regression
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
        return cls(threshold=threshold, history=history, cost_regression=cost_regression,
                   **options)

    def check_options(self) -> CheckOptions:
        """The settings other than ``threshold``, ``history`` and ``cost_regression``, by
        name."""
        values = asdict(self)
        return cast(CheckOptions, {k: values[k] for k in CHECK_OPTION_KEYS})


CHECK_OPTION_KEYS: tuple[str, ...] = tuple(
    f.name for f in fields(RegressionRule)
    if f.name not in ("threshold", "history", "cost_regression"))


class CheckOptions(TypedDict, total=False):
    """:class:`RegressionRule` settings other than ``threshold``, ``history`` and
    ``cost_regression``, by name (:data:`CHECK_OPTION_KEYS`): the runner's
    ``check_options``; any left out take the rule's default."""

    z_threshold: float
    min_seconds: float
    min_share: float
    min_history: int
    mad_floor: float
    abs_floor_s: float
    confirm: str
    resolve_after: int
    memory_regression: bool
    memory_history: int
    memory_threshold: float
    memory_z_threshold: float
    memory_mad_floor: float
    memory_onset_chance: float
    memory_min_fraction: float
    memory_min_bytes: int
    near_oom: bool
    near_oom_headroom: float
    requests_regression: bool
    requests_threshold: float
    requests_min_per_chunk: float


class RuleSettings(CheckOptions, total=False):
    """The single settings a one-night check takes by name (``threshold`` and the
    :class:`CheckOptions`)."""

    threshold: float


@dataclass(frozen=True)
class DriftRule:
    """When a prefix's series since the baseline start counts as drifting.

    The one-night settings it shares with :class:`RegressionRule` (``threshold``,
    ``min_seconds``, ``min_share``, ``mad_floor``) are taken from there by :class:`Rules`;
    the method and the defaults are explained in :mod:`~prefect_dask_profiling.regression.drift`.

    Parameters
    ----------
    min_ratio
        Smallest cumulative ratio ever reported as drift (> 1). :class:`Rules` lowers it to
        the regression ``threshold`` when that is smaller, so a drifting prefix is always
        reported before it fails.
    z_threshold
        Smallest robust shift, in noise units (> 0).
    cusum_limit, allowance
        CUSUM decision limit (> 0) and per-night allowance (>= 0), in noise units.
    start_nights, recent_nights
        Nights whose median gives the start level and the current level (>= 1).
    min_nights
        Fewest nights in a series before it is judged (>= 1).
    max_runs
        Most runs read for one series (> ``start_nights``): the first ``start_nights`` and the
        newest others.
    enabled
        Whether drift is judged at all.

    Raises
    ------
    InvalidInput
        A ``ValueError`` naming the setting and its allowed range.
    """

    min_ratio: float = 1.5
    z_threshold: float = 3.5
    cusum_limit: float = 5.0
    allowance: float = 0.5
    start_nights: int = 3
    recent_nights: int = 3
    min_nights: int = 8
    max_runs: int = 60
    enabled: bool = True

    def __post_init__(self) -> None:
        _number("min_ratio", self.min_ratio, low=1, low_open=True)
        _number("z_threshold", self.z_threshold, low=0, low_open=True)
        _number("cusum_limit", self.cusum_limit, low=0, low_open=True)
        _number("allowance", self.allowance, low=0, low_open=False)
        _whole("start_nights", self.start_nights, low=1)
        _whole("recent_nights", self.recent_nights, low=1)
        _whole("min_nights", self.min_nights, low=1)
        _whole("max_runs", self.max_runs, low=2)
        if self.max_runs <= self.start_nights:
            raise InvalidInput(f"max_runs ({self.max_runs}) must be above start_nights "
                               f"({self.start_nights})")
        if not isinstance(self.enabled, bool):
            raise InvalidInput(f"enabled must be True or False, got {self.enabled!r}")


@dataclass(frozen=True)
class Rules:
    """Every rule a night is judged by: the one-night rule and the drift rule, together.

    Built once where the settings are given (the runner, ``dask-profiling check``), stored
    in each judged run's manifest (:meth:`to_dict`) and read back to re-judge it
    (:meth:`from_dict`).

    The drift rule is **derived**, not refused, when it would contradict the regression
    rule: a ``threshold`` below the drift rule's ``min_ratio`` (say 1.3 against 1.5) lowers
    ``min_ratio`` to the threshold. Refusing would make a legitimate one-night threshold
    unusable; keeping ``min_ratio`` above it would switch drift off in every run (a drifting
    prefix must be reported before it fails).
    """

    regression: RegressionRule = field(default_factory=RegressionRule)
    drift: DriftRule = field(default_factory=DriftRule)

    def __post_init__(self) -> None:
        if not isinstance(self.regression, RegressionRule):
            raise InvalidInput(f"regression must be a RegressionRule, got "
                               f"{type(self.regression).__name__}")
        if not isinstance(self.drift, DriftRule):
            raise InvalidInput(f"drift must be a DriftRule, got {type(self.drift).__name__}")
        if self.drift.min_ratio > self.regression.threshold:
            object.__setattr__(self, "drift",
                               replace(self.drift, min_ratio=self.regression.threshold))

    @classmethod
    def from_options(cls, threshold: float = 2.0, history: int = 8,
                     check_options: CheckOptions | None = None,
                     cost_regression: str = "warn") -> Rules:
        """The rules from the runner's options (see :meth:`RegressionRule.from_options`).

        Raises
        ------
        InvalidInput
            For an unknown key or a value out of range, naming it.
        """
        regression = RegressionRule.from_options(threshold, history, check_options,
                                                 cost_regression)
        return cls(regression)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON form, as stored in a judged run's manifest (``rules``): ``regression``
        and ``drift``, each its rule's fields (``asdict``; a stored rule lacks the settings
        added after it)."""
        return {"regression": asdict(self.regression), "drift": asdict(self.drift)}

    @classmethod
    def from_dict(cls, data: Any) -> Rules:
        """The rules stored by :meth:`to_dict`; settings added since then take defaults.

        Raises
        ------
        InvalidInput
            When ``data`` is not such a document, or names an unknown setting.
        """
        if not isinstance(data, dict) or not isinstance(data.get("regression", {}), dict) \
                or not isinstance(data.get("drift", {}), dict):
            raise InvalidInput(f"stored rules must be a dict of 'regression' and 'drift' "
                               f"settings, got {data!r}")
        regression = dict(data.get("regression", {}))
        unknown = sorted(set(regression) - {f.name for f in fields(RegressionRule)}, key=str)
        if unknown:
            raise InvalidInput(f"stored regression rule has unknown settings {unknown}")
        return cls(RegressionRule(**regression), _drift_rule(dict(data.get("drift", {}))))


def _drift_rule(options: object) -> DriftRule:
    """The drift rule of stored ``options`` (its fields, checked: they were read from
    JSON)."""
    if not isinstance(options, dict):
        raise InvalidInput(f"drift options must be a dict, got {type(options).__name__}")
    unknown = sorted(set(options) - {f.name for f in fields(DriftRule)}, key=str)
    if unknown:
        raise InvalidInput(f"drift options have unknown keys {unknown}; allowed: "
                           f"{sorted(f.name for f in fields(DriftRule))}")
    return DriftRule(**options)
