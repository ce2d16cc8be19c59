"""A pytest plugin that writes when each test started and ended, per pytest-xdist process.

Where a suite's time goes, process by process: how long each file kept its process busy,
and whether a process sat idle at the end. Not loaded by default::

    PYTHONPATH=tests TIMELINE_OUT=/tmp/timeline.txt make test PYTEST_ARGS="-p helpers.timeline"
    .venv/bin/python tests/helpers/timeline.py /tmp/timeline.txt [--top 30]

Each line is ``<process> start|end|FAILED <unix time> <node id>``; the processes are
pytest-xdist's ``gw0``, ``gw1``... (``main`` without xdist). The controller of ``-n``
receives the workers' reports too: its lines are ignored by the summary.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from pathlib import Path

OUT_ENV = "TIMELINE_OUT"


def _write(kind: str, nodeid: str) -> None:
    process = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ.get(OUT_ENV, "timeline.txt"), "a", encoding="utf-8") as out:
        out.write(f"{process} {kind} {time.time():.3f} {nodeid}\n")


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _write("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _write("end", nodeid)


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        _write("FAILED", f"{report.nodeid} ({report.when})")


def summarise(path: Path) -> tuple[dict[str, tuple[float, float]],
                                   dict[str, tuple[float, float, str]], list[str]]:
    """(each process's first start and last end, each file's first start, last end and
    process, the failed node ids), in seconds from the first test's start."""
    rows = [line.split(None, 3) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == 4 and (r[0] != "main" or
                                                all(x[0] == "main" for x in rows))]
    if not rows:
        raise SystemExit(f"{path}: no test lines")
    t0 = min(float(r[2]) for r in rows)
    processes: dict[str, tuple[float, float]] = {}
    files: dict[str, tuple[float, float, str]] = {}
    failed = []
    for process, kind, at, nodeid in rows:
        t = float(at) - t0
        if kind == "FAILED":
            failed.append(nodeid)
            continue
        first, last = processes.get(process, (t, t))
        processes[process] = (min(first, t), max(last, t))
        name = nodeid.split("::", 1)[0]
        first, last, _ = files.get(name, (t, t, process))
        files[name] = (min(first, t), max(last, t), process)
    return processes, files, failed


def main() -> None:
    parser = argparse.ArgumentParser(description="Where a test run's time went, per file.")
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    processes, files, failed = summarise(args.timeline)
    for process, (first, last) in sorted(processes.items()):
        print(f"{process}: {first:.0f}-{last:.0f} s")
    busiest = sorted(files.items(), key=lambda kv: kv[1][0] - kv[1][1])
    per_process: dict[str, float] = defaultdict(float)
    for _, (first, last, process) in files.items():
        per_process[process] += last - first
    for name, (first, last, process) in busiest[:args.top]:
        print(f"{last - first:7.1f} s  {first:5.0f}-{last:5.0f}  {process}  {name}")
    print(f"files' busy seconds summed: {sum(per_process.values()):.0f} "
          f"({', '.join(f'{p} {s:.0f}' for p, s in sorted(per_process.items()))})")
    for nodeid in failed:
        print(f"FAILED {nodeid}")


if __name__ == "__main__":
    main()
