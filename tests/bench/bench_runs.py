"""What the bench test files share: one bench run, and the assertion every verdict meets
(the module's subprocess cluster, ``remote``, is in conftest.py).

The files are split (test_bench.py: bad input, the protocol, the synthetic bottlenecks;
test_bench_holdout.py: the held-out workloads; test_bench_netns.py: the network hosts) so
``pytest -n --dist loadfile`` can run them side by side; each starts its own cluster.
"""

from __future__ import annotations

from pathlib import Path

from helpers.bench_fixtures import print_verdict

from prefect_dask_profiling.bench.config import BenchConfig
from prefect_dask_profiling.bench.protocol import run_bench

W = "prefect_dask_profiling.bench.workloads"


def run(tmp_path: Path, workload: str, **kwargs) -> dict:
    """One bench session of ``workload`` (3 calibration repeats, 1 repeat): its summaries."""
    config = BenchConfig(workload=f"{W}:{workload}", out=str(tmp_path), calibration_repeats=3,
                         repeats=1, **kwargs)
    return run_bench(config, progress=print).summaries


def assert_verdict(summary: dict, klass: str, min_sources: int = 3,
                   confidences: tuple[str, ...] = ("high", "medium")) -> None:
    b = summary["bottleneck"]
    print_verdict(f"{summary['config']['workload']} ({summary['side']})", b)
    print("  ALL " + ", ".join(f"{k}={v:.3g}" for k, v in sorted(summary["signals"].items())
                              if isinstance(v, float)))
    assert b["primary"] == klass, b["note"]
    supporting = [e for e in b["signals"] if e["supports"]]
    assert len({e["source"] for e in supporting}) >= min_sources, b["signals"]
    assert b["confidence"] in confidences
    assert b["actions"]
