"""The package's samples in ``cost_per_task.py --spy-raw`` stacks, by the innermost package
function.

``cost_per_task.py --spy`` prints the package's samples by the package function *entered
first* (the plugin's hook, a read): where its time starts. This reads the raw stacks it kept
(``--spy-raw DIR``) and prints, for each file, the share of the samples that hold a package
frame and those samples by the *innermost* package frame: where inside the hook the time is
spent (the dispatch, the sketch, the aggregates, the records). A frame is the package's by
the same test as the benchmark's (:meth:`benchmarks.cost_per_task.Spies.ours`).

    PYTHONPATH=. .venv/bin/python benchmarks/investigations/spy_innermost.py \
        DIR/*-scheduler-*.raw [--top 10]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.cost_per_task import Spies  # noqa: E402


def innermost(raw: Path) -> tuple[int, collections.Counter]:
    """(all samples, the package's samples by innermost package function) of one raw file."""
    sampled = 0
    inner: collections.Counter = collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():  # blank, or read while the process changed it
            continue
        sampled += int(count)
        own = [frame for frame in stack.split(";") if Spies.ours(frame)]
        if own:
            inner[own[-1].partition(" (")[0]] += int(count)
    return sampled, inner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", nargs="+", type=Path, help="py-spy raw files")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    for raw in args.raw:
        sampled, inner = innermost(raw)
        ours = sum(inner.values())
        print(f"{raw.name}: {sampled} samples, the package's {ours} "
              f"({100 * ours / max(sampled, 1):.2f} %)")
        for name, n in inner.most_common(args.top):
            print(f"  {n:6d}  {name}")


if __name__ == "__main__":
    main()
