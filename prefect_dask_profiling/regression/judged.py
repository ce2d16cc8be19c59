"""What a night is judged from and what its judgement decides: :class:`Tonight`,
:class:`History` and :class:`Outcome`.

They live apart from :mod:`.judge` so that the verdict families
(:mod:`.families`), which the judge loops over, can read them without importing the judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

import pandas as pd

from prefect_dask_profiling.regression.alert_history import SkippedNight
from prefect_dask_profiling.regression.alerts import Ack, AlertEvent, AlertEventDoc, Book, Key
from prefect_dask_profiling.regression.baseline import Baseline
from prefect_dask_profiling.store.manifest import RunKey

__all__ = ["FamilyRead", "History", "Outcome", "OutcomeDoc", "Tonight"]


class OutcomeDoc(TypedDict):
    """An :class:`Outcome` as stored (the manifest's ``outcome``): failing keys as
    ``stage/prefix/metric``, events as :meth:`AlertEvent.to_json`."""

    regressed: bool
    reason: str
    message: str
    suspected: bool
    acknowledged: bool
    episodes: list[str]
    failing: list[str]
    events: list[AlertEventDoc]


@dataclass(frozen=True)
class Tonight:
    """The run being judged, built one way (:meth:`from_manifest`): from its manifest,
    stored or built by the run's end before it is written (the same fields either way).

    Attributes
    ----------
    run
        Its identity.
    summary
        Its per-prefix table (``tasks.csv``: ``stage, prefix, tasks, total_s``, ...).
    started
        ISO start time (orders the drift series; the judged run is last whatever it says).
    failed
        The flow failed: its flagged prefixes do not count (its times are partial).
    incomplete
        Its record is incomplete (the final collection failed): the same.
    context
        What the explanations and the per-stage families compare with the baseline runs'
        manifests (``version``, ``source_hash``, ``workers``, ``threads``, ``environment``,
        ``stages`` with their ``diagnosis``, ``incidents``): the run's manifest.
    """

    run: RunKey
    summary: pd.DataFrame
    started: str | None = None
    failed: bool = False
    incomplete: bool = False
    context: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], summary: pd.DataFrame, *,
                      failed: bool | None = None, incomplete: bool | None = None) -> Tonight:
        """The run its manifest names; ``failed`` and ``incomplete`` default to its stored
        status (the run's end tells them apart: both are stored ``failed``)."""
        status = str(manifest.get("status") or "")
        return cls(RunKey.of(manifest), summary, started=manifest.get("started"),
                   failed=status == "failed" if failed is None else failed,
                   incomplete=status == "incomplete" if incomplete is None else incomplete,
                   context=manifest)


@dataclass(frozen=True)
class FamilyRead:
    """What one family read of the history besides its baseline's manifests
    (:meth:`~.families.Family.read`): its data, a note on it, and the nights it found
    unreadable (every family is then judged without them).

    Attributes
    ----------
    data
        The family's own reading (drift: the series of comparable nights).
    note
        Where it starts, or why it is empty; stored with the family's part of the manifest.
    skipped
        The nights it found damaged or gone.
    """

    data: Any
    note: str = ""
    skipped: tuple[SkippedNight, ...] = ()


@dataclass(frozen=True)
class History:
    """What a run is judged against: loaded by :func:`load_history`.

    Attributes
    ----------
    baseline
        The healthy baseline runs of the same version (:func:`~.baseline.load_baseline`).
    reads
        What each family read of the history besides the baselines' manifests, by family
        name (:meth:`~.families.Family.read`; drift: its series of comparable nights).
    manifests
        The manifests of the time baseline's nights (for explanations).
    alerts
        The state after the nights before tonight (:func:`~.alerts.replay`: episodes and
        each night's standing, derived from the stored nights, nothing kept aside).
    acks
        The acknowledgements of the pipeline version.
    warnings
        What could not be read and was not needed.
    baselines
        Per baseline family (a family's :attr:`~.families.Family.baseline`: ``memory``,
        ``requests``, ``cost``...), the manifests of the nights whose standing counts in it
        (a night flagged in time only still counts there), newest last.
    skipped
        The stored nights left out because they cannot be read (damaged or gone): every
        family is judged without them, and the judged night names them.
    """

    baseline: Baseline
    reads: Mapping[str, FamilyRead] = field(default_factory=dict)
    manifests: tuple[Mapping[str, Any], ...] = ()
    alerts: Book = field(default_factory=Book)
    acks: tuple[Ack, ...] = ()
    warnings: tuple[str, ...] = ()
    baselines: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    skipped: tuple[SkippedNight, ...] = ()

    def manifests_of(self, family: str | None) -> tuple[Mapping[str, Any], ...]:
        """The manifests of baseline family ``family`` (none for ``None``)."""
        return tuple(self.baselines.get(family, ())) if family is not None else ()


@dataclass(frozen=True)
class Outcome:
    """What the judgement means for the run as a whole.

    Attributes
    ----------
    regressed
        The run counts as regressed: a prefix regressed on this night or drifted past the
        threshold, and the run neither failed nor is incomplete. Only such a run fails a
        flow (``on_regression="fail"``) or makes ``dask-profiling check`` exit 1.
    reason
        Why flagged prefixes do not count (the run failed or is incomplete); empty otherwise.
    message
        One line naming what regressed and drifted (the failure message of the flow).
    suspected
        Prefixes flagged tonight wait for the next run to confirm them (the run does not
        fail; it is stored ``suspected`` and kept out of baselines).
    events
        What happened to alert episodes tonight (suspected, detected, cleared, resolved),
        each with a stable id.
    episodes
        The ids of the episodes that fail the run (in the order of ``failing``).
    failing
        The keys ``(stage, prefix, metric)`` that fail the run (``prefix`` is ``""`` for
        per-stage metrics): the rows to report as detected.
    acknowledged
        Only acknowledged episodes would have failed the run: it is stored
        ``acknowledged``, told apart from a healthy night (and kept out of the baselines of
        those episodes' families, as their flagged nights are).
    """

    regressed: bool
    reason: str = ""
    message: str = "no regression"
    suspected: bool = False
    events: tuple[AlertEvent, ...] = ()
    episodes: tuple[str, ...] = ()
    failing: tuple[Key, ...] = ()
    acknowledged: bool = False

    def episode_of(self, stage: str, prefix: str, metric: str) -> str | None:
        """The id of the episode that fails the run at this key (``None``: it does not)."""
        key = (stage, prefix, metric)
        return self.episodes[self.failing.index(key)] if key in self.failing else None

