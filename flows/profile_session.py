"""The profiling protocol as a Prefect flow: bench local vs remote, publish the verdict.

Runs :func:`prefect_dask_profiling.bench.protocol.run_bench` (the same code as ``dask-profiling
bench``) and publishes two artifacts on the flow run: the local-vs-remote metric table
(``dask-profile-comparison``) and the bottleneck verdict with its signals and actions
(``dask-profile-verdict``). Run it with::

    python -m flows.profile_session --workload prefect_dask_profiling.bench.workloads:matmul \\
        --scheduler tcp://HOST:8786
"""

from __future__ import annotations

import argparse
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from prefect_dask_profiling._util import artifact_key, json_clean
from prefect_dask_profiling.bench.config import BenchConfig
from prefect_dask_profiling.bench.protocol import BenchResult, run_bench

COMPARISON_KEY = artifact_key("dask-profile", "comparison")
VERDICT_KEY = artifact_key("dask-profile", "verdict")


def verdict_markdown(result: BenchResult) -> str:
    """Markdown of each side's verdict: primary, secondary, confidence, signals, actions."""
    lines = [f"# Bottleneck verdict — `{result.comparison['config'].get('workload')}`", ""]
    for side, summary in result.summaries.items():
        b = summary["bottleneck"]
        lines += [f"## {side}: **{b['primary']}**-bound", "",
                  f"secondary: {b['secondary'] or '–'}; confidence: {b['confidence']}", "",
                  f"{b['note']}", "",
                  "| signal | source | value | threshold | supports |", "|---|---|---|---|---|"]
        for e in b["signals"]:
            lines.append(f"| {e['signal']} | {e['source']} | {e['value']:.4g} | "
                         f"{e['op']} {e['threshold']:.4g} | {'yes' if e['supports'] else 'no'} |")
        if b["disagreements"]:
            lines += ["", "Signals that disagree:", *[f"- {d}" for d in b["disagreements"]]]
        lines += ["", "Next actions (by expected impact):",
                  *[f"{i}. {a}" for i, a in enumerate(b["actions"][:3], 1)], ""]
    lines += ["## Interpretation", "", *[f"- {r}" for r in result.comparison["rubric"]], "",
              f"Artifacts: `{result.directory}`"]
    return "\n".join(lines)


def publish(result: BenchResult) -> None:
    """Create the comparison table and verdict markdown artifacts (JSON-clean values)."""
    create_table_artifact(json_clean(result.comparison["table"]), key=COMPARISON_KEY,
                          description="Local vs remote: raw and normalised throughput, busy "
                                      "fraction, success rate, task stats")
    create_markdown_artifact(verdict_markdown(result), key=VERDICT_KEY,
                             description="Bottleneck verdict per side with its signals")


@flow(name="dask-profile-session")
def profile_session(workload: str, n: list[int] | None = None, seeds: list[int] | None = None,
                    warmup: int = 1, repeats: int = 3, scheduler: str | None = None,
                    local: bool = True, local_workers: int = 2, local_threads: int = 1,
                    calibration_repeats: int = 5,
                    out: str = "benchmark_results/profiles") -> dict[str, Any]:
    """Run the profiling protocol and publish the comparison and the verdict.

    Returns
    -------
    ``{"directory", "verdicts", "table"}`` (JSON-clean).
    """
    config = BenchConfig(workload=workload, n=n or [128, 256], seeds=seeds or [1, 2, 3],
                         warmup=warmup, repeats=repeats, out=out, scheduler=scheduler,
                         local=local, local_workers=local_workers, local_threads=local_threads,
                         calibration_repeats=calibration_repeats)
    logger = get_run_logger()
    result = run_bench(config, progress=logger.info)
    publish(result)
    return json_clean({"directory": str(result.directory),
                       "verdicts": result.comparison["verdicts"],
                       "table": result.comparison["table"]})


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - manual entry point
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--scheduler")
    parser.add_argument("--no-local", action="store_true")
    parser.add_argument("--n", default="128,256")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--out", default="benchmark_results/profiles")
    args = parser.parse_args(argv)
    profile_session(workload=args.workload, scheduler=args.scheduler, local=not args.no_local,
                    n=[int(v) for v in args.n.split(",")],
                    seeds=[int(v) for v in args.seeds.split(",")], out=args.out)


if __name__ == "__main__":
    main()
