"""A gate that says when it is blind: how many nights in a row a pipeline went unjudged.

An ``unjudged`` night passes: its flow completes, and only ``dask-profiling check`` exits
non-zero for it. One such night is a notice; a pipeline that goes unjudged night after night
has lost its regression gate, and says so: a warning in the run's artifacts and manifest
naming the cause and the command that shows it, and (from the Prefect side) the event
``dask-profiling.judgement.unjudged`` for Automations. No peer tells you when its gate has
stopped looking.

The streak counts the nights whose flow completed (stored ``healthy``, ``suspected``,
``regressed``, ``acknowledged`` or ``unjudged``); a night whose flow failed is never
judged, by design, and neither breaks nor lengthens it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefect_dask_profiling.errors import StoreError
from prefect_dask_profiling.regression.alerts import JUDGED_STATUSES

if TYPE_CHECKING:
    from prefect_dask_profiling.store.manifest import RunKey
    from prefect_dask_profiling.store.runs import RunStore

__all__ = ["BLIND_AFTER_NIGHTS", "UNJUDGED_EVENT", "Blindness", "blindness"]

# Unjudged nights in a row, tonight's included, from which the gate says it is blind.
BLIND_AFTER_NIGHTS = 2
# How many earlier nights are listed to count the streak (it is reported as "at least" this).
LOOKBACK_NIGHTS = 30
UNJUDGED_EVENT = "dask-profiling.judgement.unjudged"
# The statuses of nights whose flow completed: each is judged, or should have been.
JUDGEABLE = frozenset({*JUDGED_STATUSES, "unjudged"})


@dataclass(frozen=True)
class Blindness:
    """Tonight's unjudged streak and what to do about it.

    Attributes
    ----------
    streak
        Unjudged nights in a row, tonight's included (a lower bound when the earlier nights
        could not be listed, or when there are more than ``LOOKBACK_NIGHTS`` of them).
    cause
        Why tonight was not judged (the manifest's ``unjudged_reason``).
    fix
        The command that judges tonight again once the cause is mended.
    """

    streak: int
    cause: str
    fix: str

    @property
    def alerting(self) -> bool:
        """The gate has been blind long enough to say so (:data:`BLIND_AFTER_NIGHTS`)."""
        return self.streak >= BLIND_AFTER_NIGHTS

    def message(self, pipeline: str, version: str) -> str:
        """The warning for the run's artifacts and manifest."""
        return (f"the regression gate is blind: {pipeline} {version} has gone unjudged "
                f"{self.streak} nights in a row, so no regression can fail it (tonight: "
                f"{self.cause}). Run `{self.fix}` to see the cause, and again once it is "
                "mended")

    def to_json(self) -> dict[str, object]:
        """The event payload's and the manifest's form."""
        return {"streak": self.streak, "cause": self.cause, "fix": self.fix,
                "blind": self.alerting}


def unjudged_streak(statuses: list[str]) -> int:
    """Leading ``unjudged`` statuses of earlier nights, newest first (failed nights skipped)."""
    streak = 0
    for status in statuses:
        if status not in JUDGEABLE:
            continue
        if status != "unjudged":
            break
        streak += 1
    return streak


def blindness(store: RunStore, tonight: RunKey, cause: str | None) -> Blindness:
    """Tonight's streak (tonight is unjudged): one listing of the earlier nights of the
    version, served from the history read when the judge already listed them.

    A listing that fails counts tonight alone (the cause is then usually that same store).
    """
    try:
        earlier = store.list_runs(tonight.pipeline, tonight.version, newest=LOOKBACK_NIGHTS,
                                  counting=JUDGEABLE, before=tonight.run_id)
    except StoreError:
        earlier = []
    streak = 1 + unjudged_streak([e["status"] for e in earlier])
    return Blindness(streak=streak, cause=cause or "no reason recorded",
                     fix=f"dask-profiling check --pipeline {tonight.pipeline} "
                         f"--run {tonight.run_id}")
