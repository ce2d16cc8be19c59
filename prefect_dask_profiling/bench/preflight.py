"""Preflight of one side of a benchmark session, before anything is measured.

:func:`preflight` describes the workers, checks that the workload's module imports on each
(naming what is missing), lists version mismatches of :data:`KEY_PACKAGES` and warns when
the "remote" scheduler or its workers are on this machine. What runs on the workers is
shipped by value."""

from __future__ import annotations

import ipaddress
import socket
from typing import TYPE_CHECKING, cast

from prefect_dask_profiling._util import ship_by_value
from prefect_dask_profiling.bench.config import BenchConfig, BenchInputError
from prefect_dask_profiling.environment import KEY_PACKAGES, version_mismatches

if TYPE_CHECKING:
    from distributed import Client

    from prefect_dask_profiling.bench.types import (
        ImportCheck,
        KeyVersions,
        Preflight,
        PreflightWorker,
    )
    from prefect_dask_profiling.environment import ClusterVersions, ProcessVersions



def _try_imports(modules: list[str]) -> dict[str, ImportCheck]:
    import importlib
    import importlib.metadata

    out: dict[str, ImportCheck] = {}
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


def preflight(client: Client, side: str, config: BenchConfig) -> Preflight:
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
    ship_by_value(__name__)  # the worker-side checks must not need this package
    modules = required_modules(config.workload)
    imports = client.run(_try_imports, modules)
    missing = [f"{w}: {m} ({r['error']})" for w, res in imports.items()
               for m, r in res.items() if not r["ok"]]
    if missing:
        raise BenchInputError(f"{side}: workload not importable on {len(missing)} worker "
                              f"module(s) — install it there (same wheel) — " +
                              "; ".join(missing[:4]) + (" …" if len(missing) > 4 else ""))
    versions = cast("ClusterVersions", client.get_versions(check=False))
    hostnames = client.run(_hostname)
    pyver = {w: ((v or {}).get("packages") or {}).get("python")
             for w, v in (versions.get("workers") or {}).items()}
    worker_rows: list[PreflightWorker] = [
        {"address": addr, "name": w.get("name"), "host": w.get("host"),
         "hostname": hostnames.get(addr), "nthreads": w.get("nthreads"),
         "memory_limit": w.get("memory_limit"), "python": pyver.get(addr),
         "workload_versions": {m: r.get("version") for m, r in imports.get(addr, {}).items()}}
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


def _key_versions(entry: ProcessVersions | None) -> KeyVersions:
    packages = (entry or {}).get("packages") or {}
    return {k: packages.get(k) for k in KEY_PACKAGES if k in packages}
