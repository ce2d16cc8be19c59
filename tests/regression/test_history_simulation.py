"""The history model under thousands of generated nights (issue 33): a seeded stateful
simulation through the real ``finish_run`` on a real store.

Each sequence mixes calm and rough noise, blips, steps (2.6-10x, persistent), gradual drift,
chronic (0.93 of a 1 GiB limit every night) and sudden near-OOM, spill noise on 10% of
nights, storage-request blow-ups, acks (by episode and by run), accepts, version bumps,
overlapping runs finished in both orders (on two stores), failed flows, infrastructure
retries, reruns cancelled (0-task rows with empty quantiles) and damaged verdict tables,
tasks tables, manifests and ``carried`` fields at any position of the replay window, for
one night or for good (issue 56); after every night :class:`night_sim.Simulation` checks
the invariants of the model, among them that no stored night keeps the pipeline unjudged
and that ``check`` names the nights tonight's manifest left out
(docs/alerts.md, "What the simulation checks"). The generator and the checks are in
``night_sim.py``.

Budget: ``SIM_NIGHTS`` (default 40 local nights over two seeds: ~2 s a night on the loaded
2-core machine under a load of 8-9) and ``SIM_S3_NIGHTS`` (default 8 on moto S3);
``SIM_SEEDS`` picks seeds. A long run::

    SIM_NIGHTS=3000 SIM_S3_NIGHTS=200 pytest tests/regression/test_history_simulation.py

(``SIM_NIGHTS`` is split over the seeds; the figures of the last long run are in
docs/alerts.md.)
"""

from __future__ import annotations

import os

import pytest
from helpers.run_records import record_stages
from helpers.s3_servers import boto_client, moto_server, reset_moto, s3_options
from night_sim import Driver, Simulation, violation_kinds

from prefect_dask_profiling.store.runs import RunStore

LOCAL_NIGHTS = int(os.environ.get("SIM_NIGHTS", "40"))
S3_NIGHTS = int(os.environ.get("SIM_S3_NIGHTS", "8"))
SEEDS = [int(s) for s in os.environ.get("SIM_SEEDS", "11 12").split()]
BUCKET = "sim-history"



@pytest.fixture(scope="module")
def record(inproc_client):
    return record_stages(inproc_client, {"read": 300, "reduce": 300})


@pytest.fixture(scope="module")
def moto():
    with moto_server() as endpoint:
        yield endpoint


def simulate(store: RunStore, record, seed: int, nights: int, workdir) -> Simulation:
    sim = Simulation(Driver(store, record), seed, workdir)
    sim.run(nights)
    print(sim.report(limit=40))
    print("violations by kind:", violation_kinds(sim.violations))
    return sim


@pytest.mark.slow  # generated nights through finish_run: > 10 s a test
@pytest.mark.parametrize("seed", SEEDS)
def test_generated_nights_keep_the_history_model(record, tmp_path, seed):
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    sim = simulate(store, record, seed, max(LOCAL_NIGHTS // len(SEEDS), 1), tmp_path)
    assert not sim.violations, sim.report()


@pytest.mark.slow
def test_the_same_sequences_on_s3(record, tmp_path, moto):
    reset_moto(moto)
    boto_client(moto).create_bucket(Bucket=BUCKET)
    store = RunStore(f"s3://{BUCKET}/root", s3_options(moto), spool_dir=tmp_path / "spool",
                     timeout=20)
    sim = simulate(store, record, SEEDS[0], S3_NIGHTS, None)
    assert not sim.violations, sim.report()


def test_damaged_nights_and_cancelled_reruns_keep_the_gate_judging(record, tmp_path):
    """Fast tier (a few seconds): every kind of damage, for a night and for good, and a
    cancelled rerun, between plain nights; the invariants hold after each (issue 56)."""
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    sim = Simulation(Driver(store, record), 56, tmp_path)

    def night(action, *args) -> None:  # one action a day, as Simulation.one_day does
        action(*args)
        sim.day += 1

    night(sim._do_plain)
    night(sim._do_cancelled)
    for name, for_good in (("carried", True), ("regression.csv", False), ("tasks.csv", True),
                           ("manifest.json", True)):
        night(sim._do_damage, name, for_good)
    night(sim._do_plain)
    assert len(sim.damaged) == 3 and not sim.violations, sim.report()
    assert all(n.judged for n in sim.log), sim.report()
