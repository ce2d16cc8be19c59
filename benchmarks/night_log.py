"""The history simulation's generated nights, night by night (issue 56).

Runs the nights ``tests/regression/test_history_simulation.py`` generates for one seed
(:class:`night_sim.Simulation` through the real ``finish_run`` on a local store in a
temporary folder, a real in-process LocalCluster's record), then prints one line per night
(day, kind, run id, status, what was flagged, baseline size, events), the notes about
acknowledgements (and nights the old, coarse acknowledged-baseline check would have
flagged), the violations by kind, and where the store is, to look at it with the CLI.

    PYTHONPATH=. .venv/bin/python -m benchmarks.night_log NIGHTS [SEED]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "regression")]


def main() -> None:
    from distributed import Client, LocalCluster
    from helpers.run_records import record_stages
    from night_sim import Driver, Simulation, violation_kinds

    from prefect_dask_profiling.store.runs import RunStore

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nights", type=int)
    parser.add_argument("seed", type=int, nargs="?", default=31)
    args = parser.parse_args()
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        record = record_stages(client, {"read": 300, "reduce": 300})
    folder = Path(tempfile.mkdtemp())
    store = RunStore(str(folder / "store"), spool_dir=folder / "spool")
    sim = Simulation(Driver(store, record), args.seed, folder)
    sim.run(args.nights)
    for night in sim.log:
        print(night.line())
    print("NOTES")
    print("\n".join(note for note in sim.notes if "ack" in note))
    print("VIOLATIONS", len(sim.violations), violation_kinds(sim.violations))
    print("\n".join(sim.violations[:20]))
    print("STORE", folder)


if __name__ == "__main__":
    main()
