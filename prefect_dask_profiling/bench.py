"""The profiling protocol: apples-to-apples local vs remote benchmark sessions.

``dask-profiling bench --workload pkg.mod:fn --scheduler tcp://HOST:PORT --n 128,256
--seeds 1,2,3 --warmup 1 --repeats 3 --out DIR`` runs the same inputs (same ``n`` values,
seeds, aggregates per batch and warmup policy) on a local cluster and on the remote one:

1. **preflight** — worker visibility and metadata, the workload's module importable on
   every worker (what is missing is named), client / scheduler / worker version mismatches
   (listed), environment fingerprint, and a warning when the "remote" scheduler is on the
   loopback or on this machine;
2. **calibration** — :mod:`prefect_dask_profiling.calibrate` → effective threads;
3. **warmup** — ``warmup`` untimed batches per ``n`` (results forgotten before measuring);
4. **measured phase** — ``repeats`` batches per ``n``, each batch one aggregate per seed,
   under a Dask ``performance_report``, the :class:`~prefect_dask_profiling.plugin.TaskTimings`
   plugin, the task stream and before/after probes of the scheduler, fine performance
   metrics and worker transfer logs;
5. **signals → verdict** — :func:`extract_signals` (this module) builds the signal dict,
   :func:`prefect_dask_profiling.classify.classify` (pure) names the bottleneck.

Artifacts (the seed's layout)::

    DIR/<timestamp>/local/summary.json, local/performance_report.html
    DIR/<timestamp>/remote/summary.json, remote/performance_report.html
    DIR/<timestamp>/comparison.json, notes.md

Bad input (unknown workload, unreachable scheduler, no workers, workload not importable on
the workers) raises :class:`BenchInputError`, a ``ValueError``: the CLI prints it as one
line and exits 2.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
import json
import logging
import math
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect_dask_profiling import calibrate as calibration
from prefect_dask_profiling.classify import classify
from prefect_dask_profiling.jsonclean import json_clean

SCHEMA = "dask-profiling-bench/1"
KEY_PACKAGES = ("python", "dask", "distributed", "numpy", "pandas", "cloudpickle", "msgpack",
                "toolz", "tornado", "lz4")
HEARTBEAT_WAIT_S = 1.2
Progress = Callable[[str], None]


class BenchInputError(ValueError):
    """Bad benchmark input: printed as one line by the CLI (exit code 2)."""


@dataclass
class BenchConfig:
    """One benchmark session's inputs (identical on every side)."""

    workload: str
    n: list[int] = field(default_factory=lambda: [128, 256])
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    warmup: int = 1
    repeats: int = 3
    out: str = "benchmark_results/profiles"
    scheduler: str | None = None
    local: bool = True
    local_workers: int = 2
    local_threads: int = 1
    local_memory_limit: str | None = None
    calibration_repeats: int = 5
    connect_timeout: float = 5.0
    worker_wait: float = 3.0

    def validate(self) -> None:
        """Raise :class:`BenchInputError` naming the first bad field."""
        if not self.local and not self.scheduler:
            raise BenchInputError("nothing to run: --no-local needs --scheduler tcp://HOST:PORT")
        if not self.n or any(v < 1 for v in self.n):
            raise BenchInputError(f"--n must be positive integers, got {self.n}")
        if not self.seeds:
            raise BenchInputError("--seeds must list at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise BenchInputError(f"--seeds has duplicates: {self.seeds}")
        if self.warmup < 0:
            raise BenchInputError(f"--warmup must be >= 0, got {self.warmup}")
        if self.repeats < 1:
            raise BenchInputError(f"--repeats must be >= 1, got {self.repeats}")
        if self.calibration_repeats < 1:
            raise BenchInputError(
                f"--calibration-repeats must be >= 1, got {self.calibration_repeats}")
        if self.local and self.local_workers < 1:
            raise BenchInputError(f"--local-workers must be >= 1 (zero workers), got "
                                  f"{self.local_workers}")
        if self.local and self.local_threads < 1:
            raise BenchInputError(f"--local-threads must be >= 1, got {self.local_threads}")
        if self.scheduler is not None and "://" not in self.scheduler:
            raise BenchInputError(
                f"--scheduler must be an address like tcp://HOST:PORT, got {self.scheduler!r}")
        if self.connect_timeout <= 0:
            raise BenchInputError(f"--connect-timeout must be > 0, got {self.connect_timeout}")


@dataclass
class BenchResult:
    """Where a session wrote its artifacts, and what it found."""

    directory: Path
    summaries: dict[str, dict[str, Any]]
    comparison: dict[str, Any]
    notes: str


# -- input -----------------------------------------------------------------------------------


def parse_ints(text: str, option: str) -> list[int]:
    """``"128,256"`` → ``[128, 256]``; :class:`BenchInputError` naming ``option`` otherwise."""
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise BenchInputError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise BenchInputError(f"{option} must list at least one integer, got {text!r}")
    return values


def load_workload(spec: str) -> Callable[[int, int], Any]:
    """Import ``package.module:callable``.

    Raises
    ------
    BenchInputError
        Malformed spec, module not importable, attribute missing or not callable.
    """
    module_name, sep, attr = str(spec).partition(":")
    if not sep or not module_name or not attr:
        raise BenchInputError(
            f"--workload must look like package.module:callable, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BenchInputError(f"unknown workload {spec!r}: cannot import module "
                              f"{module_name!r} ({type(exc).__name__}: {exc})") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise BenchInputError(f"unknown workload {spec!r}: module {module_name!r} has no "
                                  f"attribute {attr!r}")
    if not callable(obj):
        raise BenchInputError(f"workload {spec!r} is not callable")
    return obj


# -- clusters --------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet_distributed() -> Iterator[None]:
    """Keep distributed's connection-retry chatter off stderr while we report ourselves."""
    logger = logging.getLogger("distributed")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def connect(address: str, timeout: float, worker_wait: float = 3.0):
    """Connect to a scheduler, fail fast; require at least one worker.

    Raises
    ------
    BenchInputError
        Unreachable scheduler (within ``timeout`` seconds) or a scheduler without workers.
    """
    from distributed import Client

    try:
        with _quiet_distributed():
            client = Client(address, timeout=f"{timeout}s", set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BenchInputError(f"cannot reach scheduler {address} within {timeout:g} s: "
                              f"{reason}") from None
    try:
        _require_workers(client, address, worker_wait)
    except BaseException:
        client.close()
        raise
    return client


def _require_workers(client, address: str, wait_s: float) -> None:
    try:
        client.wait_for_workers(1, timeout=wait_s)
    except TimeoutError:
        raise BenchInputError(f"scheduler {address} has zero workers (waited {wait_s:g} s): "
                              "start workers or check that they reach the scheduler") from None


@contextlib.contextmanager
def local_cluster(config: BenchConfig) -> Iterator[Any]:
    """A LocalCluster on 127.0.0.1 with ``config.local_workers`` × ``local_threads``."""
    from distributed import Client, LocalCluster

    kwargs: dict[str, Any] = {}
    if config.local_memory_limit:
        kwargs["memory_limit"] = config.local_memory_limit
    with _quiet_distributed(), LocalCluster(
            n_workers=config.local_workers, threads_per_worker=config.local_threads,
            processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR, **kwargs) as cluster, \
            Client(cluster, set_as_default=False) as client:
        _require_workers(client, cluster.scheduler_address, 30.0)
        yield client


# -- preflight -------------------------------------------------------------------------------


def _try_imports(modules: list[str]) -> dict[str, dict[str, Any]]:
    import importlib
    import importlib.metadata

    out: dict[str, dict[str, Any]] = {}
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            continue
        version = getattr(module, "__version__", None)
        if version is None:
            try:
                version = importlib.metadata.version(name.split(".")[0].replace("_", "-"))
            except Exception:
                version = None
        out[name] = {"ok": True, "version": version}
    return out


def _hostname() -> str:
    import socket

    return socket.gethostname()


def required_modules(workload: str) -> list[str]:
    """Modules the workers must import: the workload's module (and this package if it is in it)."""
    module = workload.partition(":")[0]
    mods = [module]
    top = module.split(".")[0]
    if top == "prefect_dask_profiling" and module != top:
        mods.insert(0, top)
    return mods


def _local_addresses() -> set[str]:
    addresses = {"127.0.0.1", "::1"}
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            for entry in entries:
                if entry.family in (socket.AF_INET, socket.AF_INET6):
                    addresses.add(entry.address.split("%")[0])
    except Exception:  # psutil is optional here; loopback still detected
        pass
    return addresses


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False


def host_warnings(side: str, scheduler_address: str, worker_hosts: dict[str, str],
                  worker_hostnames: dict[str, str], local_hostname: str,
                  local_addresses: set[str]) -> list[str]:
    """Honest warnings about how "remote" a remote cluster is (pure)."""
    if side != "remote":
        return []
    from distributed.comm import get_address_host

    out = []
    host = get_address_host(scheduler_address)
    if _is_loopback(host):
        out.append(f"remote scheduler {scheduler_address} is on the loopback: this is not a "
                   "remote cluster, so network transfer, latency and host heterogeneity are "
                   "not exercised (pitfall: loopback tests are not remote behaviour)")
    elif host in local_addresses:
        out.append(f"remote scheduler {scheduler_address} is an address of this machine: "
                   "the scheduler runs on the same host as the client")
    loop_workers = [w for w, h in worker_hosts.items() if _is_loopback(h)]
    if loop_workers and len(loop_workers) == len(worker_hosts) and not _is_loopback(host):
        out.append("every remote worker listens on the loopback")
    same = [w for w, h in worker_hostnames.items() if h == local_hostname]
    if same:
        out.append(f"{len(same)} of {len(worker_hostnames)} remote workers report this "
                   f"machine's hostname {local_hostname!r}: they share its CPU, memory and "
                   "disk with the local side even if their network is separate "
                   "(namespaces, containers)")
    return out


def version_mismatches(versions: dict[str, Any]) -> list[str]:
    """Key package versions that differ between client, scheduler and workers (pure)."""
    def packages(entry: dict[str, Any]) -> dict[str, Any]:
        return (entry or {}).get("packages") or {}

    sides = {"client": packages(versions.get("client")),
             "scheduler": packages(versions.get("scheduler"))}
    for addr, entry in (versions.get("workers") or {}).items():
        sides[addr] = packages(entry)
    out = []
    for package in KEY_PACKAGES:
        seen = {name: pk.get(package) for name, pk in sides.items() if package in pk}
        if len(set(map(str, seen.values()))) > 1:
            base = seen.get("client")
            differing = ", ".join(f"{name}={v}" for name, v in seen.items() if v != base)
            out.append(f"{package}: client={base}; differs on {differing}")
    return out


def environment_fingerprint(config: BenchConfig) -> dict[str, Any]:
    """Client-side environment: Python, platform, key packages, git commit, config."""
    import importlib.metadata

    packages = {}
    for name in ("dask", "distributed", "numpy", "pandas", "prefect-dask-profiling",
                 "cloudpickle", "tornado"):
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=False).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "hostname": socket.gethostname(),
            "commit": commit, "packages": packages, "argv": sys.argv,
            "config": asdict(config)}


def preflight(client, side: str, config: BenchConfig) -> dict[str, Any]:
    """Check and describe one side's cluster before running anything.

    Raises
    ------
    BenchInputError
        Zero workers, or the workload's module not importable on some worker (named).
    """
    info = client.scheduler_info(n_workers=-1)
    workers = info.get("workers", {})
    if not workers:
        raise BenchInputError(f"{side}: scheduler {info.get('address')} has zero workers")
    _by_value()
    modules = required_modules(config.workload)
    imports = client.run(_try_imports, modules)
    missing = [f"{w}: {m} ({r['error']})" for w, res in imports.items()
               for m, r in res.items() if not r["ok"]]
    if missing:
        raise BenchInputError(f"{side}: workload not importable on {len(missing)} worker "
                              f"module(s) — install it there (same wheel) — " +
                              "; ".join(missing[:4]) + (" …" if len(missing) > 4 else ""))
    versions = client.get_versions(check=False)
    hostnames = client.run(_hostname)
    pyver = {w: ((v or {}).get("packages") or {}).get("python")
             for w, v in (versions.get("workers") or {}).items()}
    worker_rows = [{"address": addr, "name": w.get("name"), "host": w.get("host"),
                    "hostname": hostnames.get(addr), "nthreads": w.get("nthreads"),
                    "memory_limit": w.get("memory_limit"), "python": pyver.get(addr),
                    "workload_versions": {m: r.get("version")
                                          for m, r in imports.get(addr, {}).items()}}
                   for addr, w in sorted(workers.items())]
    warnings = host_warnings(side, info.get("address", ""),
                             {a: w.get("host") or "" for a, w in workers.items()}, hostnames,
                             socket.gethostname(), _local_addresses())
    mismatches = version_mismatches(versions)
    warnings += [f"version mismatch: {m}" for m in mismatches]
    return {
        "scheduler": info.get("address"),
        "n_workers": len(workers),
        "total_threads": sum(int(w.get("nthreads") or 0) for w in workers.values()),
        "workers": worker_rows,
        "versions": {"client": _key_versions(versions.get("client")),
                     "scheduler": _key_versions(versions.get("scheduler")),
                     "workers": {a: _key_versions(v)
                                 for a, v in (versions.get("workers") or {}).items()}},
        "mismatches": mismatches,
        "required_modules": modules,
        "warnings": warnings,
    }


def _key_versions(entry: dict[str, Any] | None) -> dict[str, Any]:
    packages = (entry or {}).get("packages") or {}
    return {k: packages.get(k) for k in KEY_PACKAGES if k in packages}


# -- probes (run on the scheduler / workers; shipped by value) -------------------------------


def _scheduler_probe(dask_scheduler) -> dict[str, Any]:
    import time

    return {"time": time.time(), "loop_cpu": time.thread_time(),
            "ticks": int(getattr(dask_scheduler, "_tick_counter", 0)),
            "tick_total": float(dask_scheduler.digests_total.get("tick-duration", 0.0)),
            "tick_interval": float(getattr(dask_scheduler, "_tick_interval", 0.02))}


def _fine_metrics(dask_scheduler) -> dict[Any, float]:
    # tuple keys only: the str keys (latency, tick-duration, ...) grow on every heartbeat
    return {k: float(v) for k, v in dask_scheduler.cumulative_worker_metrics.items()
            if isinstance(k, tuple) and isinstance(v, (int, float))}


def _worker_probe(dask_worker, since: float) -> dict[str, Any]:
    exec_s = 0.0
    for key, value in dask_worker.digests_total.items():
        if (isinstance(key, tuple) and len(key) >= 3 and key[0] == "execute"
                and key[-1] == "seconds" and key[-2] in ("thread-cpu", "thread-noncpu")):
            exec_s += value
    incoming = [(e.get("who"), e.get("total", 0), e.get("duration", 0.0))
                for e in dask_worker.transfer_incoming_log if e.get("start", 0) >= since]
    return {"executed": int(dask_worker.state.executed_count), "exec_s": float(exec_s),
            "incoming": incoming, "schedstat": _schedstat()}


def _schedstat() -> tuple[float, float, float] | None:
    """(monotonic s, CPU s, run-queue wait s) summed over this process's threads (Linux).

    CPU plus run-queue wait is the CPU the process *wanted*: on a shared host the wait is
    CPU stolen by neighbours, which thread-cpu alone would hide.
    """
    import os
    import time

    cpu = wait = 0
    base = f"/proc/{os.getpid()}/task"
    try:
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/schedstat") as fh:
                    a, b, _ = fh.read().split()
            except (OSError, ValueError):
                continue
            cpu += int(a)
            wait += int(b)
    except OSError:
        return None
    return time.monotonic(), cpu / 1e9, wait / 1e9


def _by_value() -> None:
    import cloudpickle

    calibration._by_value()
    if __name__ not in cloudpickle.list_registry_pickle_by_value():
        cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- one side --------------------------------------------------------------------------------


def _as_futures(client, obj: Any, workload: str) -> list:
    import dask
    from distributed import Future

    if dask.is_dask_collection(obj):
        return [client.compute(obj)]
    if isinstance(obj, Future):
        return [obj]
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(f, Future) for f in obj):
        return list(obj)
    raise BenchInputError(f"workload {workload} returned {type(obj).__name__}: expected a "
                          "Dask collection, a Future or a list of futures")


def run_batch(client, fn: Callable[[int, int], Any], workload: str, n: int,
              seeds: list[int]) -> dict[str, Any]:
    """One aggregate per seed, submitted together; waits, then forgets the results."""
    from distributed import wait

    start = time.time()
    t0 = time.perf_counter()
    aggregates = [_as_futures(client, fn(n, seed), workload) for seed in seeds]
    wait([f for agg in aggregates for f in agg])
    wall = time.perf_counter() - t0
    end = time.time()
    ok, errors = _outcome(aggregates)
    keys = [f.key for agg in aggregates for f in agg]
    del aggregates
    calibration.wait_forgotten(client, keys)
    return {"n": n, "start": start, "end": end, "wall_s": wall, "aggregates": len(seeds),
            "succeeded": ok, "errors": errors}


def _outcome(aggregates: list[list]) -> tuple[int, list[str]]:
    """Aggregates that succeeded, and the first error of each failed one."""
    ok, errors = 0, []
    for agg in aggregates:
        bad = [f for f in agg if f.status != "finished"]
        if not bad:
            ok += 1
            continue
        try:
            exc = bad[0].exception(timeout=5)
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        except Exception as err:  # cancelled or lost
            errors.append(f"{bad[0].status}: {err!r}"[:300])
    return ok, errors


def run_side(client, side: str, config: BenchConfig, fn: Callable[[int, int], Any],
             directory: Path, progress: Progress) -> dict[str, Any]:
    """Preflight, calibrate, warm up and measure one side; write its summary.json."""
    with client.as_current():  # performance_report and get_client() inside workloads
        return _run_side(client, side, config, fn, directory, progress)


def _run_side(client, side: str, config: BenchConfig, fn: Callable[[int, int], Any],
              directory: Path, progress: Progress) -> dict[str, Any]:
    from distributed import performance_report

    from prefect_dask_profiling import plugin
    from prefect_dask_profiling.summary import summarise, utilisation

    out = directory / side
    out.mkdir(parents=True, exist_ok=True)
    pre = preflight(client, side, config)
    progress(f"{side}: {pre['n_workers']} workers, {pre['total_threads']} threads "
             f"at {pre['scheduler']}")
    for w in pre["warnings"]:
        progress(f"{side}: warning: {w}")
    cal = calibration.calibrate(client, repeats=config.calibration_repeats)
    progress(f"{side}: calibrated, effective threads {cal.effective_threads:.2f} of "
             f"{cal.total_threads}" + (" (unstable)" if cal.unstable else ""))
    for n in config.n:
        for _ in range(config.warmup):
            run_batch(client, fn, config.workload, n, config.seeds)
    if config.warmup:
        progress(f"{side}: warmed up ({config.warmup} batch(es) per n)")

    name = plugin.install(client, scope="run", sample_interval=0.5)
    batches: list[dict[str, Any]] = []
    try:
        client.get_task_stream(start=0, stop=0)  # make sure the task stream is recording
        fine0 = client.run_on_scheduler(_fine_metrics)
        since = time.time()
        report = out / "performance_report.html"
        with performance_report(filename=str(report)):
            workers0 = client.run(_worker_probe, since=since)
            sched0 = client.run_on_scheduler(_scheduler_probe)
            for n in config.n:
                for r in range(config.repeats):
                    batch = run_batch(client, fn, config.workload, n, config.seeds)
                    batches.append(batch)
                    progress(f"{side}: n={n} repeat {r + 1}/{config.repeats}: "
                             f"{batch['wall_s']:.2f} s, {batch['succeeded']}/"
                             f"{batch['aggregates']} ok")
            sched1 = client.run_on_scheduler(_scheduler_probe)
            workers1 = client.run(_worker_probe, since=since)
        stream = client.get_task_stream(start=since)
        fine1 = _settled_fine_metrics(client)
        record = plugin.collect(client, name)
    finally:
        with contextlib.suppress(Exception):
            plugin.uninstall(client, name)

    measurement = {
        "batches": batches, "stream": stream, "fine_before": fine0, "fine_after": fine1,
        "scheduler_before": sched0, "scheduler_after": sched1, "workers_before": workers0,
        "workers_after": workers1, "threads": pre["total_threads"],
        "nthreads": {w["address"]: w["nthreads"] for w in pre["workers"]},
        "calibration": cal.to_dict(), "record": record,
    }
    signals = extract_signals(measurement)
    verdict = classify(signals)
    prefixes = summarise(record, by="prefix")
    util = utilisation(record)
    metrics = side_metrics(batches, pre["total_threads"], cal.effective_threads, signals)
    summary = {
        "schema": SCHEMA, "side": side, "created": datetime.now(UTC).isoformat(),
        "config": {"workload": config.workload, "n": config.n, "seeds": config.seeds,
                   "warmup": config.warmup, "repeats": config.repeats,
                   "aggregates_per_batch": len(config.seeds)},
        "preflight": pre, "calibration": cal.to_dict(), "metrics": metrics,
        "batches": batches, "signals": signals,
        "bottleneck": {k: verdict[k] for k in ("primary", "secondary", "confidence",
                                                "signals", "sources", "disagreements",
                                                "compatible", "note", "actions", "scores")},
        "prefixes": prefixes.to_dict("records"),
        "utilisation": util.reset_index().to_dict("records"),
        "warnings": pre["warnings"] + cal.notes + record.warnings,
        "artifacts": {"performance_report": str(report)},
    }
    summary = json_clean(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    progress(f"{side}: {metrics['throughput_agg_s']:.3g} agg/s; bottleneck "
             f"{verdict['primary']} ({verdict['confidence']})")
    return summary


def _settled_fine_metrics(client) -> dict[Any, float]:
    """Fine metrics reach the scheduler with heartbeats: wait until two reads agree."""
    time.sleep(HEARTBEAT_WAIT_S)
    last = client.run_on_scheduler(_fine_metrics)
    for _ in range(5):
        time.sleep(0.6)
        now = client.run_on_scheduler(_fine_metrics)
        if now == last:
            break
        last = now
    return last


# -- signals ---------------------------------------------------------------------------------


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or not den or den != den:
        return None
    return num / den


def fine_signals(delta: dict[Any, float]) -> dict[str, float | None]:
    """Signals from a delta of ``scheduler.cumulative_worker_metrics``."""
    def total(pred: Callable[[tuple], bool]) -> float:
        return sum(v for k, v in delta.items() if isinstance(k, tuple) and pred(k))

    def execute(activity: str) -> float:
        return total(lambda k: k[0] == "execute" and k[-2] == activity and k[-1] == "seconds")

    cpu, noncpu = execute("thread-cpu"), execute("thread-noncpu")
    overhead = execute("executor") + execute("other")
    network = total(lambda k: k[0] == "gather-dep" and k[-2] == "network"
                    and k[-1] == "seconds")
    disk = total(lambda k: "disk" in str(k[-2]) and k[-1] == "seconds")
    code = cpu + noncpu
    return {
        "fine.thread_cpu_s": cpu, "fine.thread_noncpu_s": noncpu,
        "fine.overhead_s": overhead, "fine.network_s": network, "fine.disk_s": disk,
        "fine.cpu_fraction": _ratio(cpu, code),
        "fine.code_share": _ratio(code, code + overhead + network + disk),
        "fine.overhead_share": _ratio(overhead, code + overhead),
        "fine.network_share": _ratio(network, code + network),
        "fine.disk_share": _ratio(disk, code + disk),
    }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def task_signals(stream: list[dict[str, Any]], batches: list[dict[str, Any]], threads: int,
                 workers: list[str]) -> dict[str, Any]:
    """Signals from task start/stop records (the task stream) and the batch windows."""
    from dask.utils import key_split

    compute: list[tuple[str, str, float, float]] = []
    transfer_s = disk_s = 0.0
    for rec in stream:
        for ss in rec.get("startstops") or ():
            action, d = ss.get("action"), ss["stop"] - ss["start"]
            if action == "compute":
                compute.append((rec.get("worker"), key_split(rec.get("key")), ss["start"],
                                ss["stop"]))
            elif action == "transfer":
                transfer_s += d
            elif action in ("disk-read", "disk-write"):
                disk_s += d
    wall = sum(b["wall_s"] for b in batches)
    durations = [stop - start for _, _, start, stop in compute]
    compute_s = sum(durations)
    median = _quantile(durations, 0.5)
    p95 = _quantile(durations, 0.95)
    skew, slow = _worker_skew(compute)
    return {
        "tasks.count": len(compute), "tasks.compute_s": compute_s,
        "tasks.median_s": median, "tasks.p95_s": p95,
        "tasks.typical_s": _weighted_median(durations),
        "tasks.p95_p50": _ratio(p95, median),
        "tasks.per_s": _ratio(len(compute), wall),
        "tasks.busy_fraction": _ratio(compute_s, threads * wall),
        "tasks.transfer_share": _ratio(transfer_s, compute_s + transfer_s),
        "tasks.disk_share": _ratio(disk_s, compute_s),
        "tasks.worker_skew": skew,
        "tasks.tail_fraction": _tail_fraction(compute, batches, workers),
        "context.slow_worker": slow,
    }


def _weighted_median(durations: list[float]) -> float | None:
    """Duration of the task a random compute-second falls in (time-weighted median).

    The plain median of a graph with a few big tasks and many tiny ones is tiny; this is
    the granularity where the time actually goes.
    """
    total = sum(durations)
    if not durations or total <= 0:
        return None
    acc = 0.0
    for d in sorted(durations):
        acc += d
        if acc >= total / 2:
            return d
    return durations[-1]


def _worker_skew(compute: list[tuple[str, str, float, float]]) -> tuple[float | None, str | None]:
    """Slowest / fastest worker's median task time, each task normalised by its prefix."""
    by_prefix: dict[str, list[float]] = {}
    for _, prefix, start, stop in compute:
        by_prefix.setdefault(prefix, []).append(stop - start)
    medians = {p: statistics.median(v) for p, v in by_prefix.items()
               if len(v) >= 4 and statistics.median(v) >= 0.001}
    per_worker: dict[str, list[float]] = {}
    for worker, prefix, start, stop in compute:
        if prefix in medians:
            per_worker.setdefault(worker, []).append((stop - start) / medians[prefix])
    worker_medians = {w: statistics.median(v) for w, v in per_worker.items() if len(v) >= 3}
    if len(worker_medians) < 2:
        return None, None
    slow = max(worker_medians, key=worker_medians.get)
    fastest = min(worker_medians.values())
    return (_ratio(worker_medians[slow], fastest), slow)


def _tail_fraction(compute: list[tuple[str, str, float, float]], batches: list[dict[str, Any]],
                   workers: list[str]) -> float | None:
    """Mean share of each batch during which workers sat idle waiting for the last one."""
    if len(workers) < 2:
        return None
    weighted = total = 0.0
    for b in batches:
        tasks = [t for t in compute if t[2] >= b["start"] - 0.05 and t[3] <= b["end"] + 0.05]
        if not tasks:
            continue
        first = min(t[2] for t in tasks)
        end = max(t[3] for t in tasks)
        span = end - first
        if span <= 0:
            continue
        last = {w: first for w in workers}
        for w, _, _, stop in tasks:
            if w in last:
                last[w] = max(last[w], stop)
        idle = sum(end - s for s in last.values()) / (len(workers) * span)
        weighted += idle * span
        total += span
    return weighted / total if total else None


def scheduler_signals(before: dict[str, Any], after: dict[str, Any], n_tasks: int,
                      typical_s: float | None, wall: float) -> dict[str, float | None]:
    """Signals from the scheduler's event-loop thread CPU and tick counters.

    ``wall`` is the measured time (sum of batch walls); the loop's CPU between batches
    (forgetting results) is small and counted against it. ``typical_s`` is the
    time-weighted median task duration.
    """
    cpu = after["loop_cpu"] - before["loop_cpu"]
    ticks = after["ticks"] - before["ticks"]
    per_task = _ratio(cpu, n_tasks)
    mean_tick = _ratio(after["tick_total"] - before["tick_total"], ticks)
    return {"scheduler.cpu_s": cpu, "scheduler.cpu_per_task_s": per_task,
            "scheduler.overhead_ratio": _ratio(per_task, typical_s),
            "scheduler.loop_busy": _ratio(cpu, wall),
            "scheduler.tick_mean_ms": None if mean_tick is None else mean_tick * 1000,
            "scheduler.tick_lag": _ratio(mean_tick, after.get("tick_interval"))}


def transfer_signals(workers_after: dict[str, Any], threads: int,
                     wall: float) -> dict[str, float | None]:
    """Signals from the workers' incoming transfer logs."""
    entries = [e for w in workers_after.values() for e in w.get("incoming", [])]
    nbytes = float(sum(e[1] or 0 for e in entries))
    seconds = float(sum(e[2] or 0.0 for e in entries))
    return {"transfer.count": len(entries), "transfer.mb_moved": nbytes / 1e6,
            "transfer.mb_per_transfer": _ratio(nbytes / 1e6, len(entries)),
            "transfer.seconds": seconds,
            "transfer.bandwidth_mb_s": _ratio(nbytes / 1e6, seconds),
            "transfer.wait_fraction": _ratio(seconds, threads * wall)}


def worker_signals(before: dict[str, Any], after: dict[str, Any], record,
                   nthreads: dict[str, int], window: tuple[float, float]) -> dict[str, Any]:
    """Signals from the worker processes: heartbeat CPU samples, per-worker fine metrics and
    run-queue accounting (``worker.cpu_demand`` = CPU used + CPU waited for, per thread)."""
    per_task = {}
    for w, a in after.items():
        b = before.get(w, {"executed": 0, "exec_s": 0.0})
        executed = a["executed"] - b["executed"]
        if executed >= 3:
            per_task[w] = (a["exec_s"] - b["exec_s"]) / executed
    skew = None
    if len(per_task) >= 2 and min(per_task.values()) > 0:
        skew = max(per_task.values()) / min(per_task.values())
    wanted = available = 0.0
    for w, a in after.items():
        b = before.get(w) or {}
        if not a.get("schedstat") or not b.get("schedstat"):
            continue
        (t1, c1, q1), (t0, c0, q0) = a["schedstat"], b["schedstat"]
        wanted += (c1 - c0) + (q1 - q0)
        available += (t1 - t0) * max(int(nthreads.get(w) or 1), 1)
    demand = min(wanted / available, 1.0) if available > 0 else None
    samples = record.samples
    s = samples[(samples["time"] >= window[0]) & (samples["time"] <= window[1])]
    cpu_fraction = None
    if not s.empty:
        threads = s["worker"].map(lambda w: max(int(nthreads.get(w) or 1), 1))
        cpu_fraction = float((s["cpu"] / (100.0 * threads)).clip(upper=1.0).mean())
    return {"worker.seconds_per_task_skew": skew, "worker.cpu_fraction": cpu_fraction,
            "worker.cpu_demand": demand, "worker.samples": len(s)}


def memory_signals(record, window: tuple[float, float]) -> dict[str, float | None]:
    """Signals from worker memory and spill samples."""
    samples = record.samples
    s = samples[(samples["time"] >= window[0] - 1) & (samples["time"] <= window[1] + 1)]
    if s.empty:
        return {"memory.spilled_peak_mb": None, "memory.managed_peak_fraction": None}
    limits = dict(zip(record.workers["worker"], record.workers["memory_limit"], strict=True))
    frac = None
    with_limit = s[s["worker"].map(lambda w: bool(limits.get(w)))]
    if not with_limit.empty:
        frac = float(((with_limit["managed"] + with_limit["spilled"]) /
                      with_limit["worker"].map(limits)).max())
    return {"memory.spilled_peak_mb": float(s["spilled"].max()) / 1e6,
            "memory.managed_peak_fraction": frac}


def extract_signals(m: dict[str, Any]) -> dict[str, Any]:
    """Build the classifier's signal dict from one side's measurement (I/O already done).

    Parameters
    ----------
    m
        ``batches, stream, fine_before/after, scheduler_before/after, workers_before/after,
        threads, nthreads, calibration, record`` as gathered by :func:`run_side`.
    """
    batches = m["batches"]
    wall = sum(b["wall_s"] for b in batches)
    window = (min(b["start"] for b in batches), max(b["end"] for b in batches))
    signals: dict[str, Any] = {}
    signals.update(fine_signals(_delta(m["fine_after"], m["fine_before"])))
    tasks = task_signals(m["stream"], batches, m["threads"], sorted(m["nthreads"]))
    signals.update(tasks)
    signals.update(scheduler_signals(m["scheduler_before"], m["scheduler_after"],
                                     tasks["tasks.count"], tasks["tasks.typical_s"], wall))
    signals.update(transfer_signals(m["workers_after"], m["threads"], wall))
    signals.update(worker_signals(m["workers_before"], m["workers_after"], m["record"],
                                  m["nthreads"], window))
    signals.update(memory_signals(m["record"], window))
    cal = m["calibration"]
    spreads = [w["spread"] for w in cal["workers"]]
    signals["calibration.min_index"] = cal.get("min_index")
    signals["calibration.max_spread"] = max(spreads) if spreads else None
    t = m["record"].tasks
    if not t.empty:
        top = t.groupby("prefix")["compute_s"].sum().sort_values(ascending=False)
        signals["context.top_prefix"] = str(top.index[0])
    return signals


def side_metrics(batches: list[dict[str, Any]], threads: int, effective_threads: float,
                 signals: dict[str, Any]) -> dict[str, Any]:
    """Throughput (raw, per thread, per effective thread), task stats, busy fraction, success."""
    wall = sum(b["wall_s"] for b in batches)
    total = sum(b["aggregates"] for b in batches)
    ok = sum(b["succeeded"] for b in batches)
    throughput = _ratio(ok, wall) or 0.0
    per_n = {}
    for n in dict.fromkeys(b["n"] for b in batches):
        bs = [b for b in batches if b["n"] == n]
        w = sum(b["wall_s"] for b in bs)
        per_n[str(n)] = {"aggregates": sum(b["aggregates"] for b in bs),
                         "succeeded": sum(b["succeeded"] for b in bs),
                         "wall_s": w, "median_batch_s": statistics.median(b["wall_s"] for b in bs),
                         "throughput_agg_s": _ratio(sum(b["succeeded"] for b in bs), w)}
    return {
        "aggregates": total, "succeeded": ok, "success_rate": _ratio(ok, total),
        "wall_s": wall, "throughput_agg_s": throughput,
        "threads": threads, "effective_threads": effective_threads,
        "throughput_per_thread": _ratio(throughput, threads),
        "throughput_per_effective_thread": _ratio(throughput, effective_threads),
        "busy_fraction": signals.get("tasks.busy_fraction"),
        "tasks": signals.get("tasks.count"), "task_median_s": signals.get("tasks.median_s"),
        "task_p95_s": signals.get("tasks.p95_s"), "task_compute_s": signals.get("tasks.compute_s"),
        "thread_cpu_s": signals.get("fine.thread_cpu_s"),
        "thread_noncpu_s": signals.get("fine.thread_noncpu_s"),
        "cpu_fraction": signals.get("fine.cpu_fraction"),
        "per_n": per_n,
        "errors": [e for b in batches for e in b["errors"]][:10],
    }


# -- comparison ------------------------------------------------------------------------------

TABLE_METRICS = ("throughput_agg_s", "throughput_per_thread", "throughput_per_effective_thread",
                 "threads", "effective_threads", "busy_fraction", "success_rate",
                 "task_median_s", "task_p95_s", "cpu_fraction", "wall_s", "tasks")


def compare(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The local-vs-remote comparison and the seed's interpretation rubric (pure)."""
    sides = list(summaries)
    table = []
    for metric in TABLE_METRICS:
        row: dict[str, Any] = {"metric": metric}
        for side in sides:
            row[side] = summaries[side]["metrics"].get(metric)
        if "local" in summaries and "remote" in summaries:
            row["remote_vs_local"] = _ratio(row["remote"], row["local"])
        table.append(row)
    configs = [summaries[s]["config"] for s in sides]
    identical = all(c == configs[0] for c in configs)
    return {
        "schema": SCHEMA, "sides": sides, "identical_inputs": identical,
        "config": configs[0] if configs else {}, "table": table,
        "verdicts": {s: {k: summaries[s]["bottleneck"][k]
                         for k in ("primary", "secondary", "confidence", "note")}
                     for s in sides},
        "rubric": rubric(summaries),
        "warnings": {s: summaries[s]["warnings"] for s in sides},
    }


def rubric(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The seed's interpretation rubric applied to local vs remote (pure)."""
    out: list[str] = []
    for side, s in summaries.items():
        if s["calibration"].get("unstable"):
            out.append(f"{side}: calibration unstable: rerun calibration with more repeats "
                       "before trusting per-effective-thread numbers")
    if not ("local" in summaries and "remote" in summaries):
        out.append("only one side measured: no local-vs-remote comparison")
        return out
    loc, rem = summaries["local"]["metrics"], summaries["remote"]["metrics"]
    if (loc.get("success_rate") or 0) != (rem.get("success_rate") or 0):
        out.append(f"success rate differs (local {loc.get('success_rate'):.0%}, remote "
                   f"{rem.get('success_rate'):.0%}): treat correctness/stability as the first "
                   "bottleneck before performance")
    raw = _ratio(rem.get("throughput_agg_s"), loc.get("throughput_agg_s"))
    per_thread = _ratio(rem.get("throughput_per_thread"), loc.get("throughput_per_thread"))
    per_eff = _ratio(rem.get("throughput_per_effective_thread"),
                     loc.get("throughput_per_effective_thread"))
    busy = rem.get("busy_fraction")
    if raw is not None and raw < 0.9 and per_thread is not None and 0.8 <= per_thread <= 1.25:
        out.append(f"remote raw throughput is lower (x{raw:.2f}) but per-thread is similar "
                   f"(x{per_thread:.2f}): fixed orchestration overhead likely dominates at "
                   "this N; try larger N")
    if raw is not None and raw > 1.1 and busy is not None and busy < 0.5:
        out.append(f"remote raw throughput is higher (x{raw:.2f}) but busy fraction is low "
                   f"({busy:.2f}): capacity is under-used; scaling headroom with a larger "
                   "workload")
    if (per_eff is not None and per_thread is not None and per_eff < 0.5
            and per_eff < 0.7 * per_thread):
        out.append(f"per-effective-thread throughput collapses remotely (x{per_eff:.2f} vs "
                   f"x{per_thread:.2f} per thread): calibration unstable or heterogeneity "
                   "dominates; rerun calibration with more repeats")
    for side in summaries:
        b = summaries[side]["bottleneck"]
        out.append(f"{side}: {b['primary']}-bound (secondary {b['secondary']}, "
                   f"{b['confidence']} confidence)")
    lp, rp = (summaries[s]["bottleneck"]["primary"] for s in ("local", "remote"))
    if lp != rp:
        out.append(f"the bottleneck changes between sides (local {lp}, remote {rp}): an "
                   "optimisation for one side may not help the other")
    return out


# -- notes.md --------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def notes_markdown(summaries: dict[str, dict[str, Any]], comparison: dict[str, Any],
                   environment: dict[str, Any]) -> str:
    """notes.md in the seed's reporting template (pure)."""
    sides = list(summaries)
    cfg = comparison["config"]
    lines = ["# Dask profiling session", "", "## 1. Run context", "",
             f"- commit: `{environment.get('commit') or 'unknown'}`",
             f"- workload: `{cfg.get('workload')}`; n = {cfg.get('n')}; seeds = "
             f"{cfg.get('seeds')}; warmup = {cfg.get('warmup')} batch(es) per n; repeats = "
             f"{cfg.get('repeats')}; aggregates per batch = {cfg.get('aggregates_per_batch')}",
             f"- identical inputs on every side: {comparison['identical_inputs']}",
             f"- client: Python {environment.get('python')} on {environment.get('hostname')} "
             f"({environment.get('platform')})"]
    for side in sides:
        pre = summaries[side]["preflight"]
        topo = ", ".join(f"{w['address']} ({w['hostname']}, {w['nthreads']} thr)"
                         for w in pre["workers"])
        lines.append(f"- {side} topology: scheduler {pre['scheduler']}; {pre['n_workers']} "
                     f"workers / {pre['total_threads']} threads: {topo}")
        for w in summaries[side]["warnings"]:
            lines.append(f"  - warning: {w}")
    lines += ["", "## 2. Metric table", "",
              "| metric | " + " | ".join(sides) + (" | remote/local |" if len(sides) == 2
                                                   else " |"),
              "|---|" + "---|" * len(sides) + ("---|" if len(sides) == 2 else "")]
    for row in comparison["table"]:
        cells = [_fmt(row.get(s)) for s in sides]
        if len(sides) == 2:
            cells.append(_fmt(row.get("remote_vs_local")))
        lines.append(f"| {row['metric']} | " + " | ".join(cells) + " |")
    lines += ["", "## 3. Bottleneck diagnosis", ""]
    for side in sides:
        b = summaries[side]["bottleneck"]
        lines += [f"### {side}", "",
                  f"- primary: **{b['primary']}**; secondary: {b['secondary'] or '–'}; "
                  f"confidence: {b['confidence']}", f"- {b['note']}", "",
                  "| signal | source | value | threshold | supports |", "|---|---|---|---|---|"]
        for e in b["signals"]:
            lines.append(f"| {e['signal']} | {e['source']} | {_fmt(e['value'])} | "
                         f"{e['op']} {_fmt(e['threshold'])} | "
                         f"{'yes' if e['supports'] else 'no'} |")
        if b["disagreements"]:
            lines += ["", "Signals that disagree:"]
            lines += [f"- {d}" for d in b["disagreements"]]
        lines.append("")
    lines += ["Interpretation (seed rubric):", ""]
    lines += [f"- {r}" for r in comparison["rubric"]]
    lines += ["", "## 4. Recommended actions", ""]
    first = summaries["remote"] if "remote" in summaries else summaries[sides[0]]
    for i, action in enumerate(first["bottleneck"]["actions"][:3], 1):
        lines.append(f"{i}. {action}")
    lines.append("")
    return "\n".join(lines)


# -- session ---------------------------------------------------------------------------------


def _session_dir(root: Path) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = root / stamp
    i = 1
    while path.exists():
        path = root / f"{stamp}-{i}"
        i += 1
    return path


def run_bench(config: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """Run the whole protocol; write the artifacts; return them.

    Raises
    ------
    BenchInputError
        Bad input, found before anything is measured.
    """
    progress = progress or (lambda message: None)
    config.validate()
    fn = load_workload(config.workload)
    remote_client = None
    if config.scheduler:
        remote_client = connect(config.scheduler, config.connect_timeout, config.worker_wait)
    try:
        directory = _session_dir(Path(config.out))
        summaries: dict[str, dict[str, Any]] = {}
        if config.local:
            progress(f"local: starting {config.local_workers} workers × "
                     f"{config.local_threads} threads")
            with local_cluster(config) as client:
                summaries["local"] = run_side(client, "local", config, fn, directory, progress)
        if remote_client is not None:
            summaries["remote"] = run_side(remote_client, "remote", config, fn, directory,
                                           progress)
    finally:
        if remote_client is not None:
            remote_client.close()
    environment = environment_fingerprint(config)
    comparison = json_clean(compare(summaries))
    comparison["environment"] = json_clean(environment)
    notes = notes_markdown(summaries, comparison, environment)
    (directory / "comparison.json").write_text(json.dumps(comparison, indent=2) + "\n")
    (directory / "notes.md").write_text(notes)
    progress(f"artifacts in {directory}")
    return BenchResult(directory, summaries, comparison, notes)


def cli_bench(*, workload: str, scheduler: str | None, local: bool, local_workers: int,
              local_threads: int, local_memory_limit: str | None, n: str, seeds: str,
              warmup: int, repeats: int, calibration_repeats: int, out: str,
              connect_timeout: float, as_json: bool) -> None:
    """Body of ``dask-profiling bench`` (the CLI stays a thin wrapper)."""
    from rich.console import Console

    from prefect_dask_profiling.cli import console, emit_json, print_table

    err = Console(stderr=True)
    config = BenchConfig(workload=workload, n=parse_ints(n, "--n"),
                         seeds=parse_ints(seeds, "--seeds"), warmup=warmup, repeats=repeats,
                         out=out, scheduler=scheduler, local=local, local_workers=local_workers,
                         local_threads=local_threads, local_memory_limit=local_memory_limit,
                         calibration_repeats=calibration_repeats,
                         connect_timeout=connect_timeout)
    started = time.monotonic()

    def progress(message: str) -> None:
        err.print(f"[dim]{time.monotonic() - started:6.1f}s[/dim] {message}", highlight=False)

    if err.is_terminal:
        with err.status("benchmarking…"):
            result = run_bench(config, progress)
    else:
        result = run_bench(config, progress)
    if as_json:
        emit_json({"directory": str(result.directory), "comparison": result.comparison})
        return
    import pandas as pd

    print_table(pd.DataFrame(result.comparison["table"]), title="local vs remote")
    for side, s in result.summaries.items():
        b = s["bottleneck"]
        console.print(f"{side}: [bold]{b['primary']}[/bold]-bound (secondary "
                      f"{b['secondary']}, {b['confidence']}): {b['note']}", highlight=False)
    console.print(f"artifacts: {result.directory}", highlight=False)
