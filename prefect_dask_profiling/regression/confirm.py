"""Confirmation: whether a prefix flagged tonight fails the run now, waits a night, or clears.

One night cannot tell a blip from a step; the next run can. A prefix whose one-night verdict
(:func:`~prefect_dask_profiling.regression.verdict.detect_regressions`) is ``regression``
becomes **suspected** — reported, but the run does not fail — unless the night is
**conclusive**. The next run of the same pipeline and version then **confirms** it (the run
fails) or **clears** it. :attr:`~.rule.RegressionRule.confirm` chooses the mode:

``"never"``
    Fail on the first night, as before confirmation existed: the decision is the verdict.
``"always"``
    Never conclusive on one night: every flagged prefix waits for a second night.
``"auto"`` (default)
    Conclusive on one night when

    * the prefix ran **threshold times its tasks** or more (``tasks_ratio >= threshold``):
      a count, which no timing noise moves (reruns are counted apart); or
    * the jump is **extreme**: ``ratio >= EXTREME_FACTOR * threshold`` (4x at the default
      threshold 2: no one-night blip of a pipeline whose verdicts are worth keeping reaches
      it); or
    * the pipeline's recent nights are **calm**: tonight's jump lies ``CONCLUSIVE_SIGMAS``
      of the prefix's own robust spread beyond the farthest one-night excursion any prefix
      of the pipeline made in the baseline::

          log(ratio) >= log(reach) + CONCLUSIVE_SIGMAS * spread / median

      ``reach`` (:func:`noise_reach`) is the largest ``value / median`` of any prefix on
      any baseline night. With 20 prefixes and 8 baseline nights it is the maximum of 160
      one-night excursions, so a new blip exceeds it with probability about 1/161; the
      margin of 2 robust sigmas (the prefix's ``1.4826 * MAD / median``, as in the robust
      z) covers the prefix's own spread on top. Spikes that the 8-night MAD cannot see
      (1.8x on 5% of nights, as on spot instances) show up in the reach: 160 prefix-nights
      hold about 8 of them, so such a pipeline waits for a second night, while a calm one
      (reach ~1.3) fails at once as before. The margin was calibrated on
      ``benchmarks/alert_quality.py`` (docs/alerts.md, three seeds of 3,200 prefix-nights):
      1 sigma lets 9 false failures through in the rough regime, 2 sigmas 3–6, and 3.5
      sigmas makes calm steps wait (154–159 of 160 fail on the first night instead of 160).

What the second night must show: tonight is **nearer the flagged level than the baseline**,
in log space — ``ratio_tonight >= sqrt(ratio_flagged)`` — the decision boundary between
"the step is still there" and "back to normal" when both nights carry the same noise. A
suspected prefix whose next night is that high is confirmed even when tonight's ratio is
below the threshold (a 2.2x step on a fast night); one back nearer the baseline is cleared.
The rule is symmetric: a prefix flagged tonight whose previous night was already nearer
tonight's level than the baseline (but not flagged) is confirmed at once — two nights in a
row are the evidence, whichever came first.

Tonight's rule confirms: a suspicion whose level is below tonight's threshold (the threshold
was raised since it was suspected) is no suspicion under it. A night tonight's rule does not
flag clears it; one it flags is judged afresh.

Everything here is pure: rows in, decisions out. The episode built from the decisions
(ids, events, acknowledgements, resolution) is :mod:`~prefect_dask_profiling.regression.alerts`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from prefect_dask_profiling._util import InvalidInput, float_or_nan
from prefect_dask_profiling.regression.rule import RegressionRule

__all__ = ["ALERT_COLUMNS", "ALERTS", "CONCLUSIVE_SIGMAS", "EXTREME_FACTOR", "Decision",
           "confirm_signals", "metric_threshold",
           "Evidence", "Prior", "confirm_verdicts", "decide", "nearer", "noise_reach"]

# A jump this many times the threshold is conclusive on one night whatever the noise.
EXTREME_FACTOR = 2.0
# Robust sigmas of the prefix's own spread beyond the pipeline's farthest one-night
# excursion for a single night to be conclusive (see the module docstring).
CONCLUSIVE_SIGMAS = 2.0
# What a night means for a prefix: fails the run, waits for a second night, a suspicion
# that did not persist, or nothing.
ALERTS = ("regression", "suspected", "cleared", "")
# Columns confirm_verdicts adds to a verdict table.
ALERT_COLUMNS = ["alert", "alert_reason"]


@dataclass(frozen=True)
class Evidence:
    """One prefix on one night, as the one-night rule saw it (a verdict-table row).

    Attributes
    ----------
    verdict
        The one-night verdict (``regression``, ``ok``, ...).
    ratio
        ``latest / baseline median`` (NaN when either is missing).
    robust_z
        ``(latest - median) / spread``.
    delta_s
        ``latest - median`` in seconds.
    tasks_ratio
        ``latest tasks / baseline median tasks`` (NaN when unknown): a count, which timing
        noise does not move.
    """

    verdict: str
    ratio: float
    robust_z: float
    delta_s: float
    tasks_ratio: float = math.nan

    @classmethod
    def from_row(cls, row: Any) -> Evidence:
        """From a verdict-table row (a namedtuple or mapping with those fields)."""
        get = row.get if isinstance(row, dict) else (lambda k: getattr(row, k, math.nan))
        tasks = get("tasks_ratio")
        return cls(str(get("verdict")), float_or_nan(get("ratio")), float_or_nan(get("robust_z")),
                   float_or_nan(get("delta_s")), float_or_nan(tasks))

    @property
    def flagged(self) -> bool:
        return self.verdict == "regression"

    @property
    def relative_spread(self) -> float:
        """The baseline's robust spread as a fraction of its median: ``(ratio - 1) / z``."""
        if not (math.isfinite(self.ratio) and math.isfinite(self.robust_z)) \
                or self.robust_z == 0:
            return math.nan
        return (self.ratio - 1) / self.robust_z


@dataclass(frozen=True)
class Prior:
    """What the previous run of the same pipeline and version said about the prefix.

    Attributes
    ----------
    episode
        The state of the prefix's open episode after the previous run: ``"suspected"``,
        ``"confirmed"``, ``"acknowledged"``, or ``None`` (no open episode).
    ratio
        The prefix's ratio on the previous run (NaN when unknown).
    nights
        The nights the open episode was flagged on so far (0 without one).
    level
        The highest ratio the open episode reached (NaN: unknown; then ``ratio``): the
        suspected level that tonight's threshold is held against.
    """

    episode: str | None = None
    ratio: float = math.nan
    nights: int = 0
    level: float = math.nan

    @property
    def suspected_level(self) -> float:
        """:attr:`level` when known, else :attr:`ratio`."""
        return self.level if math.isfinite(self.level) else self.ratio


@dataclass(frozen=True)
class Decision:
    """What tonight means for one prefix: ``alert`` (one of :data:`ALERTS`) and why."""

    alert: str
    reason: str = ""

    @property
    def fails(self) -> bool:
        return self.alert == "regression"


def nearer(other_ratio: float, flagged_ratio: float) -> bool:
    """Whether a night at ``other_ratio`` is nearer the flagged level than the baseline.

    In log space: ``log(other) >= log(flagged) / 2``, i.e. ``other >= sqrt(flagged)``.
    """
    if not (math.isfinite(other_ratio) and other_ratio > 0):
        return False
    if math.isinf(flagged_ratio):  # from zero: any time at all is still the new level
        return other_ratio > 1
    return math.log(other_ratio) >= 0.5 * math.log(max(flagged_ratio, 1.0))


def noise_reach(history: pd.DataFrame) -> float:
    """The farthest one-night excursion in a baseline: max of ``value / prefix median``.

    Parameters
    ----------
    history
        The baseline's long table (``run_id, stage, prefix, total_s``), as given to
        ``detect_regressions``.

    Returns
    -------
    float
        At least 1.0; 1.0 for an empty baseline (nothing seen, nothing to wait for). Rows
        repeated for one (run, stage, prefix) are added up; prefixes with a zero median
        are left out.
    """
    missing = [c for c in ("run_id", "stage", "prefix", "total_s") if c not in history]
    if missing:
        raise InvalidInput(f"history is missing column(s): {', '.join(missing)}")
    seconds = pd.to_numeric(history["total_s"], errors="coerce").to_numpy(float,
                                                                           na_value=np.nan)
    kept = np.isfinite(seconds) & (seconds >= 0)
    if not kept.any():
        return 1.0
    keys = pd.MultiIndex.from_arrays([history["stage"].astype(str),
                                      history["prefix"].astype(str)])
    key, _ = pd.factorize(keys[kept])
    run, _ = pd.factorize(history["run_id"].astype(str).to_numpy()[kept])
    total = np.zeros((key.max() + 1, run.max() + 1))
    count = np.zeros_like(total)
    np.add.at(total, (key, run), seconds[kept])
    np.add.at(count, (key, run), 1)
    total[count == 0] = np.nan
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        ratios = total / np.nanmedian(total, axis=1)[:, None]
    ratios = ratios[np.isfinite(ratios)]
    return max(1.0, float(ratios.max())) if ratios.size else 1.0


def decide(tonight: Evidence, prior: Prior, rule: RegressionRule, reach: float) -> Decision:
    """The confirmation decision for one prefix tonight.

    Parameters
    ----------
    tonight
        The prefix's verdict row tonight.
    prior
        Its open episode and previous ratio (:class:`Prior` () when none).
    rule
        The rule (``confirm``, ``threshold``, ``min_seconds``).
    reach
        :func:`noise_reach` of tonight's baseline.

    Returns
    -------
    Decision
        ``regression`` fails the run (unless its episode was acknowledged, which
        :mod:`.alerts` decides); ``suspected`` is reported only; ``cleared`` ends a
        suspicion; ``""`` says nothing.
    """
    if rule.confirm == "never":
        return Decision("regression", "one night") if tonight.flagged else Decision("")
    if prior.episode == "suspected":
        if not _below_threshold(prior.suspected_level, rule):
            return _second_night(tonight, prior, rule)
        if not tonight.flagged:
            return Decision("cleared", f"not a regression under tonight's threshold "
                                       f"{rule.threshold:g}x: the suspected "
                                       f"{_x(prior.suspected_level)} is below it")
        prior = Prior(ratio=prior.ratio)  # judged afresh under tonight's rule
    if not tonight.flagged:
        return Decision("")
    if prior.episode in ("confirmed", "acknowledged"):
        return Decision("regression", "the episode is confirmed")
    if nearer(prior.ratio, tonight.ratio) and math.isfinite(prior.ratio):
        return Decision("regression", f"confirmed: the previous run was already "
                                      f"{prior.ratio:.2f}x")
    why = conclusive(tonight, rule, reach) if rule.confirm == "auto" else ""
    if why:
        return Decision("regression", why)
    return Decision("suspected", "one night: the next run confirms or clears it")


def conclusive(tonight: Evidence, rule: RegressionRule, reach: float) -> str:
    """Why one night is enough for ``tonight`` under ``confirm="auto"``; ``""`` if it is not."""
    ratio = tonight.ratio
    extreme = EXTREME_FACTOR * rule.threshold
    if ratio >= extreme:
        return f"conclusive: {_x(ratio)} >= {extreme:g}x"
    if tonight.tasks_ratio >= rule.threshold:
        return (f"conclusive: {tonight.tasks_ratio:.3g}x the baseline's tasks (a count, not "
                f"timing noise)")
    spread = tonight.relative_spread
    if not (math.isfinite(spread) and ratio > 0 and reach >= 1):
        return ""
    bar = reach * math.exp(CONCLUSIVE_SIGMAS * spread)
    if ratio >= bar:
        return (f"conclusive: {_x(ratio)} is beyond the baseline's farthest one-night "
                f"excursion {reach:.2f}x by {CONCLUSIVE_SIGMAS:g} robust sigmas "
                f"(needs {bar:.2f}x)")
    return ""


def _below_threshold(ratio: float, rule: RegressionRule) -> bool:
    """Whether a suspected level ``ratio`` is below ``rule``'s threshold: a suspicion raised
    under a lower threshold (the rule changed since) is no suspicion under tonight's rule, so
    it cannot be confirmed by a night that tonight's rule does not flag."""
    return math.isfinite(ratio) and ratio < rule.threshold


def _second_night(tonight: Evidence, prior: Prior, rule: RegressionRule) -> Decision:
    """A suspected prefix's next night: confirmed when still nearer the flagged level."""
    if tonight.flagged:
        return Decision("regression", "confirmed: flagged two runs in a row")
    still = nearer(tonight.ratio, prior.ratio) and tonight.delta_s >= rule.min_seconds
    if still:
        return Decision("regression", f"confirmed: still {tonight.ratio:.2f}x, nearer the "
                                      f"suspected {_x(prior.ratio)} than the baseline")
    return Decision("cleared", "did not persist: back near the baseline")


def confirm_verdicts(verdicts: pd.DataFrame, priors: dict[tuple[str, str], Prior],
                     rule: RegressionRule, reach: float) -> pd.DataFrame:
    """The verdict table with :data:`ALERT_COLUMNS` (``alert``, ``alert_reason``) added.

    Parameters
    ----------
    verdicts
        Tonight's table from ``detect_regressions`` (``stage, prefix, verdict, ratio,
        robust_z, delta_s``); it is left unchanged.
    priors
        ``{(stage, prefix): Prior}`` from the previous run (:func:`.alerts.priors`); keys
        absent have no open episode and no previous ratio.
    rule
        The rule (its ``confirm`` mode).
    reach
        :func:`noise_reach` of tonight's baseline.

    Notes
    -----
    A prefix suspected on the previous run but absent tonight gets no row here: it is
    cleared by :func:`.alerts.advance` (nothing persisted).
    """
    if not isinstance(rule, RegressionRule):
        raise InvalidInput(f"rule must be a RegressionRule, got {type(rule).__name__}")
    missing = [c for c in ("stage", "prefix", "verdict", "ratio", "robust_z", "delta_s")
               if c not in verdicts]
    if missing:
        raise InvalidInput(f"verdicts is missing column(s): {', '.join(missing)}")
    columns = [verdicts[c].to_numpy() for c in
               ("stage", "prefix", "verdict", "ratio", "robust_z", "delta_s")]
    columns.append(verdicts["tasks_ratio"].to_numpy() if "tasks_ratio" in verdicts
                   else np.full(len(verdicts), np.nan))
    decisions = [decide(Evidence(str(v), float_or_nan(r), float_or_nan(z), float_or_nan(d),
                                 float_or_nan(t)),
                        priors.get((str(s), str(p)), Prior()), rule, reach)
                 for s, p, v, r, z, d, t in zip(*columns, strict=True)]
    return verdicts.assign(alert=[d.alert for d in decisions],
                           alert_reason=[d.reason for d in decisions])




def _x(ratio: float) -> str:
    return f"{ratio:.2f}x" if math.isfinite(ratio) else "from zero"


def metric_threshold(metric: str, rule: RegressionRule) -> float | None:
    """The ratio ``rule`` flags ``metric`` at (``None``: a metric judged without a ratio
    threshold, ``headroom`` and ``drift``)."""
    return {"total_s": rule.threshold, "peak_bytes": rule.memory_threshold,
            "spilled_bytes": rule.memory_threshold,
            "requests_per_chunk": rule.requests_threshold,
            "bytes_per_chunk": rule.requests_threshold,
            "idle_hours": rule.threshold}.get(metric)


def confirm_signals(rows: pd.DataFrame, priors: dict[tuple[str, str], Prior],
                    rule: RegressionRule, *, flagged: tuple[str, ...],
                    conclusive: bool, threshold: float | None = None) -> pd.DataFrame:
    """A per-stage verdict table (memory, storage requests) with :data:`ALERT_COLUMNS`.

    The same lifecycle as time (:func:`decide`), for metrics whose one night is never
    conclusive (a spill, a request blow-up: the next night confirms or clears it) or always
    is (``near-oom``: absolute, needs no history).

    Parameters
    ----------
    rows
        ``stage, metric, verdict, ratio`` and, for the second night, ``delta`` and
        ``min_effect`` (absent: any increase counts).
    priors
        ``{(stage, metric): Prior}`` of the previous night (:func:`.alerts.priors` per
        metric, keyed by stage and metric).
    rule
        Its ``confirm`` mode: ``"never"`` makes every flag conclusive.
    flagged
        The verdicts that flag a row.
    conclusive
        Whether one flagged night is enough under ``confirm="auto"`` and ``"always"``.
    threshold
        Tonight's ratio threshold of the rows' metric (:func:`metric_threshold`): a
        suspicion whose level is below it is no suspicion under tonight's rule (``None``:
        every suspicion holds).
    """
    if not isinstance(rule, RegressionRule):
        raise InvalidInput(f"rule must be a RegressionRule, got {type(rule).__name__}")
    if rows.empty:
        return rows.assign(alert=pd.Series(dtype=str), alert_reason=pd.Series(dtype=str))
    missing = [c for c in ("stage", "metric", "verdict", "ratio") if c not in rows]
    if missing:
        raise InvalidInput(f"verdicts is missing column(s): {', '.join(missing)}")
    decisions = []
    for row in rows.to_dict("records"):
        prior = priors.get((str(row["stage"]), str(row["metric"])), Prior())
        is_flagged = row["verdict"] in flagged
        level = prior.suspected_level
        if prior.episode == "suspected" and threshold is not None \
                and math.isfinite(level) and level < threshold:
            if not is_flagged:
                decisions.append(Decision("cleared", f"not a regression under tonight's "
                                                     f"threshold {threshold:g}x: the "
                                                     f"suspected {_x(level)} is below it"))
                continue
            prior = Prior(ratio=prior.ratio)  # judged afresh under tonight's rule
        decisions.append(_decide_signal(
            _Tonight(float_or_nan(row.get("ratio")), float_or_nan(row.get("delta")),
                     float_or_nan(row.get("min_effect")),
                     float_or_nan(row.get("nights_needed"))),
            is_flagged, prior, rule, conclusive))
    return rows.assign(alert=[d.alert for d in decisions],
                       alert_reason=[d.reason for d in decisions])


@dataclass(frozen=True)
class _Tonight:
    """A per-stage row's figures the confirmation reads (NaN: missing): its ratio, its
    increase against the minimum effect (NaN effect: any increase counts) and the flagged
    nights in a row that confirm it (NaN: 2)."""

    ratio: float
    delta: float
    min_effect: float
    nights_needed: float


def _decide_signal(row: _Tonight, is_flagged: bool, prior: Prior,
                   rule: RegressionRule, conclusive: bool) -> Decision:
    if rule.confirm == "never":
        return Decision("regression", "one night") if is_flagged else Decision("")
    needed = _nights_needed(row)
    if prior.episode == "suspected":
        ratio, delta, effect = row.ratio, row.delta, row.min_effect
        enough = not math.isfinite(effect) or (math.isfinite(delta) and delta >= effect)
        still = is_flagged or (nearer(ratio, prior.ratio) and enough)
        if not still:
            return Decision("cleared", "did not persist: back near the baseline")
        if prior.nights + 1 < needed:
            return Decision("suspected", f"an onset: {prior.nights + 1} of the {needed} "
                                         f"nights in a row that confirm it")
        if is_flagged:
            return Decision("regression", f"confirmed: flagged {max(needed, 2)} runs in a row")
        return Decision("regression", f"confirmed: still {_x(ratio)}, nearer the "
                                      f"suspected {_x(prior.ratio)} than the baseline")
    if not is_flagged:
        return Decision("")
    if prior.episode in ("confirmed", "acknowledged"):
        return Decision("regression", "the episode is confirmed")
    if conclusive:
        return Decision("regression", "conclusive: needs no history")
    if needed > 2:
        return Decision("suspected", f"an onset: confirmed after {needed} nights in a row")
    return Decision("suspected", "one night: the next run confirms or clears it")


def _nights_needed(row: _Tonight) -> int:
    """The flagged nights in a row that confirm a row (its ``nights_needed``; default 2)."""
    value = row.nights_needed
    return int(value) if math.isfinite(value) and value >= 2 else 2
