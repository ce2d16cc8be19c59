"""``deadline=``, ``deadline_margin=``, ``eta_interval=`` on the runner: refused at
construction naming the option, carried by duplicate() and pickling (no cluster, no server)."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

import pytest

from prefect_dask_profiling.forecast.model import parse_deadline, resolve_deadline
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner


@pytest.mark.parametrize(("options", "words"), [
    ({"deadline": "six in the morning"}, ["deadline", "HH:MM Zone"]),
    ({"deadline": "06:00"}, ["deadline", "HH:MM Zone"]),
    ({"deadline": "24:30 UTC"}, ["deadline", "no such time of day"]),
    ({"deadline": "06:00 Europe/Berlln"}, ["deadline", "unknown time zone 'Europe/Berlln'"]),
    ({"deadline": timedelta(hours=-4)}, ["deadline", "positive duration"]),
    ({"deadline": 6}, ["deadline", "timedelta"]),
    ({"deadline_margin": -60}, ["deadline_margin", ">= 0"]),
    ({"deadline_margin": timedelta(minutes=-5)}, ["deadline_margin", ">= 0"]),
    ({"eta_interval": -1}, ["eta_interval", "> 0"]),
    ({"eta_interval": 0}, ["eta_interval", "> 0"]),
    ({"eta_interval": "30"}, ["eta_interval", "'30'"]),
])
def test_bad_eta_options_are_refused_at_construction(options, words):
    with pytest.raises(ValueError) as info:
        ProfiledDaskTaskRunner(**options)
    for word in words:
        assert word in str(info.value), info.value


def test_the_options_survive_duplicate_and_pickling():
    runner = ProfiledDaskTaskRunner(deadline="06:00 Europe/Berlin", deadline_margin=600,
                                    eta_interval=timedelta(seconds=45))
    for copy in (runner.duplicate(), pickle.loads(pickle.dumps(runner))):
        assert copy.profiling.deadline == "06:00 Europe/Berlin"
        assert copy.profiling.deadline_margin == 600
        assert copy.profiling.eta_interval == timedelta(seconds=45)
    assert ProfiledDaskTaskRunner().profiling.deadline is None


def test_a_duration_without_a_scheduled_start_says_what_was_used():
    started = datetime(2026, 12, 3, 1, 30, tzinfo=UTC)
    at, note = resolve_deadline(parse_deadline(timedelta(hours=4)), started, scheduled=None)
    assert at == started + timedelta(hours=4)
    assert note == ("deadline 4:00:00 after the scheduled start: the flow run has no "
                    "scheduled start; counted from its start 2026-12-03 01:30:00 UTC instead")
