"""What a run costs as users run it: ``python flow.py``, a new process every night.

:mod:`benchmarks.cost_per_task` and :mod:`benchmarks.flow_overhead` run every flow in one
long-lived process after warm-up runs, so what a process pays once (importing the package,
Bokeh and its first page) is left out of their per-run figures. A nightly flow run by
``python flow.py``, or by a Prefect process worker, is a new process each night and pays it
every run. This runs the same small flow as a new process per run: three stages, each four
mapped Prefect tasks and a Dask array reduction of 96 chunks computed from the flow body
through ``get_dask_client()``, on a ``dask scheduler`` and two ``dask worker --nthreads 1``
processes and a Prefect server (127.0.0.1) that live across the runs. The plain script uses
prefect-dask's ``DaskTaskRunner``; the profiled one is the same script with the README's
changes (``ProfiledDaskTaskRunner``, ``@profiled``, ``with stage(...)``). Plain and
profiled runs alternate, the first of each pair swapped every pair, after one warm-up run
of each.

Each run's CPU seconds (user + system): the flow process, whole (``resource`` of the
children, read around the run), with what it spent before the flow was called (its
imports, as the script prints them); the scheduler, the two workers
and the Prefect server (psutil), read once the scheduler holds no task and 1 s has passed.
Prints the medians and the paired differences (median, 90% bootstrap interval); "after
imports" and "all, imports out" leave out what the script spent importing before the flow
was called (the same libraries in both scripts, plus the package's top level), whose
run-to-run scatter (±0.5 CPU-s) is wider than the profiler's cost.

``--importtime`` runs each script once under ``python -X importtime`` and lists what the
profiled one imports that the plain one does not, by cumulative import time. ``--spy``
runs each script ``--spy`` times under ``py-spy record --gil`` (the flow process's thread
holding the interpreter lock, 200 samples a second: Python's CPU, not C code that releases
the lock; ``pip install py-spy``, not a dependency) and splits the samples: the imports, by
the package imported; Bokeh drawing pages; the package's own work, by the part of it that
started it (the flow body runs inside ``@profiled``: its work counts under ``prefect``); the
rest by the library running. Then the package's functions, inclusive.

    PYTHONPATH=. .venv/bin/python benchmarks/cold_run.py [--pairs 5] [--variants defaults]
        [--importtime] [--spy 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from benchmarks.cost_per_task import Processes, bench_cluster  # noqa: E402
from prefect_dask_profiling.bench.report import paired_difference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # profiled variants: runner options, as a script's keyword arguments
    "defaults": "",
    "no-reports": "stage_reports=False, ",
    "auto": 'stage_reports="auto", ',
}
PARTS = ("flow process", "imports", "after imports", "scheduler", "workers", "Prefect server")
# the processes whose sum is "all processes" (the flow process counted once, whole)
WHOLE = ("flow process", "scheduler", "workers", "Prefect server")

SCRIPT = '''\
import json, os, resource, sys

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

import dask.array as da
from prefect import flow, task
from prefect_dask import get_dask_client
{imports}
IMPORTS = cpu()

@task
def tile_check(i: int) -> int:
    return i * i

@flow(name="cold-{name}", version="1", task_runner={runner})
{decorator}def nightly() -> float:
    total = 0.0
    for name in ("read", "compute", "write"):
        with stage(name):
            checks = tile_check.map(range(4))
            cube = da.random.RandomState(0).random((24, 256, 256), chunks=(1, 128, 128))
            with get_dask_client() as client:
                total += float(client.compute(cube.mean()).result())
            total += sum(checks.result())
    return total

if __name__ == "__main__":
    state = nightly(return_state=True)
    print(json.dumps({{"imports": IMPORTS, "ok": state.is_completed()}}))
'''


def script(name: str, address: str, store: str) -> str:
    """The user's ``flow.py`` for variant ``name`` (``plain``: prefect-dask's runner)."""
    if name == "plain":
        return SCRIPT.format(
            name=name, decorator="",
            imports="import contextlib\nfrom prefect_dask import DaskTaskRunner\n"
                    "stage = lambda name: contextlib.nullcontext()",
            runner=f"DaskTaskRunner(address={address!r})")
    return SCRIPT.format(
        name=name, decorator="@profiled\n",
        imports="from prefect_dask_profiling import ProfiledDaskTaskRunner, profiled, stage",
        runner=f"ProfiledDaskTaskRunner({VARIANTS[name]}address={address!r}, "
               f"store={store!r})")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cold_run(path: Path, procs: Processes) -> dict[str, float]:
    """One run of ``python path`` as a new process: CPU seconds per part, and its wall."""
    procs.quiet()
    before, children = procs.cpu(), _children_cpu()
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    flow_cpu = _children_cpu() - children
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines or not json.loads(lines[-1])["ok"]:
        raise RuntimeError(f"{path.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    procs.quiet()
    after = procs.cpu()
    imports = json.loads(lines[-1])["imports"]
    return {"flow process": flow_cpu, "imports": imports, "after imports": flow_cpu - imports,
            **{k: after[k] - before[k] for k in ("scheduler", "workers", "Prefect server")}}


def import_times(path: Path) -> dict[str, tuple[int, int]]:
    """``{module: (self µs, cumulative µs)}`` of one run of ``python -X importtime path``."""
    done = subprocess.run([sys.executable, "-X", "importtime", str(path)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    found = {}
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)", line)
        if match:
            found[match[3]] = (int(match[1]), int(match[2]))
    return found


def print_import_times(paths: dict[str, Path], top: int = 25) -> None:
    """What each profiled script imports that the plain one does not."""
    plain = import_times(paths["plain"])
    for name, path in paths.items():
        if name == "plain":
            continue
        extra = {k: v for k, v in import_times(path).items() if k not in plain}
        by_root: dict[str, int] = {}
        for module, (own, _) in extra.items():
            by_root[module.split(".")[0]] = by_root.get(module.split(".")[0], 0) + own
        print(f"\n{name}: {len(extra)} modules the plain script does not import, "
              f"{sum(v[0] for v in extra.values()) / 1e3:.0f} ms of import time (self); "
              "by package: " + ", ".join(f"{k} {v / 1e3:.0f} ms" for k, v in
                                         sorted(by_root.items(), key=lambda kv: -kv[1])[:6]))
        for module, (_, total) in sorted(extra.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {total / 1e3:8.1f} ms  {module}")


SPY_RATE = 200  # samples per second
_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def _root(path: str) -> str:
    """The top-level package a frame's file belongs to (``bokeh``, ``prefect``...)."""
    parts = Path(path).with_suffix("").parts
    for marker in ("site-packages", "lib"):
        if marker in parts[:-1]:
            rest = parts[len(parts) - parts[::-1].index(marker):]
            if rest:
                return rest[0] if not rest[0].startswith("python3") else "stdlib"
    return parts[0] if parts else path


def bucket(frames: list[tuple[str, str]], script: str) -> str:
    """Where one sampled stack's CPU goes, outermost frame first: an import (by the package
    imported), Bokeh drawing, the package's work (by its part), else the running library."""
    for function, path in frames:
        if function == "<module>" and not path.endswith(script):
            root = _root(path)
            if root == "prefect_dask_profiling":
                return "import prefect_dask_profiling"
            return f"import {root}"
    if any(_root(path) == "bokeh" for _, path in frames):
        return "bokeh, drawing"
    for _, path in frames:
        if "prefect_dask_profiling/" in path:
            module = path.split("prefect_dask_profiling/", 1)[1].removesuffix(".py")
            return "prefect_dask_profiling." + module.split("/")[0]
    return _root(frames[-1][1]) if frames else "?"


def spy(path: Path, runs: int) -> tuple[collections.Counter, collections.Counter]:
    """Samples per :func:`bucket` over ``runs`` runs of ``python path`` under py-spy, and
    per function of the package (inclusive: a sample counts once for each function on its
    stack)."""
    counts: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()
    for i in range(runs):
        out = path.with_suffix(f".spy{i}.txt")
        subprocess.run(["py-spy", "record", "--gil", "--format", "raw", "-r", str(SPY_RATE), "-o",
                        str(out), "--", sys.executable, str(path)], capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900, check=True)
        for line in out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [m.groups() for m in map(_FRAME.match, stack.split(";")) if m]
            counts[bucket(frames, path.name)] += int(count)
            for name in {f"{p.split('prefect_dask_profiling/', 1)[1]}:{f}" for f, p in frames
                         if "prefect_dask_profiling/" in p}:
                functions[name] += int(count)
    return counts, functions


def print_spy(paths: dict[str, Path], runs: int) -> None:
    """CPU seconds per run of each script, by bucket, the profiled against the plain."""
    spied = {name: spy(path, runs) for name, path in paths.items()}
    found = {name: counts for name, (counts, _) in spied.items()}
    plain = found["plain"]
    for name, counts in found.items():
        if name == "plain":
            continue
        print(f"\n{name}: flow process CPU by where it goes, s per run "
              f"(py-spy, {runs} runs each; plain → profiled, added):")
        for key in sorted(counts.keys() | plain.keys(),
                          key=lambda k: plain[k] - counts[k])[:20]:
            mine, base = counts[key] / SPY_RATE / runs, plain[key] / SPY_RATE / runs
            print(f"  {key:<40} {base:6.2f} → {mine:6.2f}  {mine - base:+.2f}")
        total = sum(counts.values()) - sum(plain.values())
        print(f"  {'all samples':<40} added {total / SPY_RATE / runs:+.2f}")
        print("  the package's functions, inclusive, s per run:")
        for function, samples in spied[name][1].most_common(25):
            print(f"    {samples / SPY_RATE / runs:6.2f}  {function}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--variants", default="defaults",
                        help=f"profiled variants, comma-separated, of {sorted(VARIANTS)}")
    parser.add_argument("--importtime", action="store_true",
                        help="then run each script once under python -X importtime")
    parser.add_argument("--spy", type=int, default=0, metavar="RUNS",
                        help="then run each script RUNS times under py-spy")
    args = parser.parse_args()
    variants = ["plain", *args.variants.split(",")]
    with bench_cluster() as (tmp, cluster, client):
        procs = Processes(client, cluster.scheduler.pid)
        paths = {}
        for name in variants:
            paths[name] = Path(tmp) / f"flow_{name.replace('-', '_')}.py"
            paths[name].write_text(script(name, cluster.address, tmp + "/store"))
        for name in variants:  # warm-up: the store's first run, the server's first flow
            cold_run(paths[name], procs)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for i in range(args.pairs):
            for name in variants[i % len(variants):] + variants[:i % len(variants)]:
                row = cold_run(paths[name], procs)
                rows[name].append(row)
                print(f"  pair {i + 1}/{args.pairs} {name:<10} " +
                      "  ".join(f"{p} {row[p]:6.2f}" for p in PARTS) +
                      f"  (load {os.getloadavg()[0]:.2f})", flush=True)
        if args.pairs:
            print_results(rows)
        if args.importtime:
            print_import_times(paths)
        if args.spy:
            print_spy(paths, args.spy)


def print_results(rows: dict[str, list[dict[str, float]]]) -> None:
    """Medians and paired differences against the plain runs."""
    plain = rows["plain"]
    for name, mine in rows.items():
        if name == "plain":
            continue
        print(f"\n{name} vs plain, {len(mine)} pairs, a new process per run "
              "(CPU s; paired: median of the pairs' differences, 90% bootstrap interval):")
        for part in PARTS:
            added, low, high = paired_difference([r[part] for r in mine],
                                                 [r[part] for r in plain])
            print(f"  {part:<15} plain {statistics.median(r[part] for r in plain):6.2f}  "
                  f"profiled {statistics.median(r[part] for r in mine):6.2f}  "
                  f"added {added:+.2f} ({low:+.2f} to {high:+.2f})")
        for label, skip in (("all processes", ()), ("all, imports out", ("imports",))):
            total = [sum(r[p] for p in WHOLE) - sum(r[p] for p in skip) for r in mine]
            base = [sum(r[p] for p in WHOLE) - sum(r[p] for p in skip) for r in plain]
            added, low, high = paired_difference(total, base)
            print(f"  {label:<15} added {added:+.2f} ({low:+.2f} to {high:+.2f})")


if __name__ == "__main__":
    main()
