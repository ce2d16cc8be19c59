"""The software a run or a benchmark ran on: versions here, and mismatches across a cluster.

Stored with every run (the manifest's ``environment``) and every benchmark session (the
fingerprint in ``comparison.json``), so that a change in timings can be traced to an
upgrade; mismatched versions between the client, the scheduler and the workers are listed
because they are a common cause of slow or failing serialisation. Standard library only.
"""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["FINGERPRINT_PACKAGES", "KEY_PACKAGES", "ClusterVersions", "Environment",
           "Fingerprint", "RasterStack", "environment",
           "environment_fingerprint", "mismatch_detail", "mismatch_key", "package_version",
           "package_versions", "version_mismatches"]


class ProcessVersions(TypedDict, total=False):
    """One process's part of ``Client.get_versions()``: ``host`` (python, OS...) and
    ``packages`` (``{name: version}``)."""

    host: dict[str, str | None]
    packages: dict[str, str | None]


class ClusterVersions(TypedDict, total=False):
    """What ``Client.get_versions(check=False)`` returns (the parts read here)."""

    client: ProcessVersions
    scheduler: ProcessVersions
    workers: dict[str, ProcessVersions]


class RasterStack(TypedDict):
    """The workers' raster stack (``timing.io_client.raster_fingerprint``): a value the
    workers disagree on is their distinct values joined by `` | ``; secrets are ``"<set>"``.
    ``ranges_counted``: every worker counted the requests of GDAL's parallel batches
    (``timing.worker_io.ParallelRanges``; absent in runs stored before it)."""

    gdal: str | None
    rasterio: str | None
    libcurl: str | None
    options: dict[str, str | None]
    workers: int
    ranges_counted: NotRequired[bool]


class Environment(TypedDict):
    """The manifest's ``environment`` (:func:`environment`): Python, the distributions of
    :data:`FINGERPRINT_PACKAGES` (``-`` as ``_``; ``None`` when not installed), the
    cluster's mismatches and, when storage was counted and GDAL is loaded on the workers,
    their raster stack."""

    python: str
    dask: str | None
    distributed: str | None
    prefect: str | None
    prefect_dask: str | None
    pandas: str | None
    numpy: str | None
    cloudpickle: str | None
    tornado: str | None
    prefect_dask_profiling: str | None
    mismatches: list[str]
    mismatch_detail: list[str]
    raster: NotRequired[RasterStack]


class Fingerprint(TypedDict):
    """This machine and process (:func:`environment_fingerprint`, a bench session's)."""

    python: str
    implementation: str
    platform: str
    hostname: str
    commit: str | None
    packages: dict[str, str | None]
    argv: list[str]


# Installed distributions recorded with a run or a benchmark session.
FINGERPRINT_PACKAGES = ("dask", "distributed", "prefect", "prefect-dask", "pandas", "numpy",
                        "cloudpickle", "tornado", "prefect-dask-profiling")
# Packages (as ``Client.get_versions`` names them) that must match across a cluster.
KEY_PACKAGES = ("python", "dask", "distributed", "msgpack", "cloudpickle", "numpy", "pandas",
                "toolz", "tornado", "lz4")


@functools.lru_cache(maxsize=256)
def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None when it is not installed.

    Read once per process: looking a distribution up scans ``sys.path`` (about 10 ms each,
    tens of milliseconds at the end of every run), and what a process has imported does not
    change when a package is upgraded on disk under it, so the first answer is also the
    truer one.
    """
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_versions(names: tuple[str, ...] = FINGERPRINT_PACKAGES) -> dict[str, str | None]:
    """``{distribution: version or None}`` for ``names``."""
    return {name: package_version(name) for name in names}


def version_mismatches(versions: ClusterVersions) -> list[str]:
    """Key packages whose versions differ between client, scheduler and workers (pure).

    Each line names the *roles* holding each version, never a worker's address: addresses
    change from run to run, and a mismatch that lasts for months must read the same every
    night so that only a real change is reported as new (:func:`mismatch_key`). The
    addresses are in :func:`mismatch_detail`.

    Parameters
    ----------
    versions
        What ``Client.get_versions(check=False)`` returns.

    Returns
    -------
    One line per package that differs, versions in the order client, scheduler, workers,
    e.g. ``"numpy: 2.1.0 on client, scheduler; 1.26.4 on workers"``.
    """
    return [_line(pkg, {v: _roles(sides) for v, sides in seen.items()})
            for pkg, seen in _differing(versions).items()]


def mismatch_detail(versions: ClusterVersions) -> list[str]:
    """:func:`version_mismatches` with each worker's address, for people to act on (pure).

    E.g. ``"numpy: 2.1.0 on client, scheduler; 1.26.4 on worker tcp://10.0.0.5:4321"``.
    Not comparable across runs (addresses change); compare :func:`version_mismatches`.
    """
    return [_line(pkg, seen) for pkg, seen in _differing(versions).items()]


def mismatch_key(line: str) -> str:
    """The comparable form of a mismatch line: package, and the roles holding each version.

    Idempotent on :func:`version_mismatches` lines, and turns lines stored before them (which
    named each worker, ``"... on worker tcp://10.0.0.5:4321, worker tcp://..."``) into the
    same form, so old baselines compare with new runs. A line that is not a mismatch (e.g.
    ``"versions not collected: ..."``) is returned unchanged.
    """
    pkg, sep, rest = line.partition(": ")
    if not sep or " on " not in rest:
        return line
    seen: dict[str, list[str]] = {}
    for part in rest.split("; "):
        version, on, sides = part.rpartition(" on ")
        if not on:
            return line
        seen[version] = [s.strip() for s in sides.split(", ") if s.strip()]
    return _line(pkg, {v: _roles(sides) for v, sides in seen.items()})


_ROLES = ("client", "scheduler", "workers")


def _differing(versions: ClusterVersions) -> dict[str, dict[str, list[str]]]:
    """``{package: {version: [side, ...]}}`` for the key packages seen in two versions."""
    sides = {"client": versions.get("client") or {},
             "scheduler": versions.get("scheduler") or {}}
    workers = versions.get("workers") or {}
    sides.update({f"worker {w}": workers[w] or {} for w in sorted(workers, key=str)})
    out = {}
    for pkg in KEY_PACKAGES:
        seen: dict[str, list[str]] = {}
        for side, info in sides.items():
            value = (info.get("packages") or {}).get(pkg)
            if pkg == "python":
                value = (info.get("host") or {}).get("python") or value
            if value is not None:
                seen.setdefault(str(value), []).append(side)
        if len(seen) > 1:
            out[pkg] = seen
    return out


def _roles(sides: list[str]) -> list[str]:
    """``client``, ``scheduler`` and ``workers`` (for any ``worker <address>``), in order."""
    named = {"workers" if s.startswith("worker") else s for s in sides}
    return [r for r in _ROLES if r in named] + sorted(named - set(_ROLES))


def _line(pkg: str, seen: dict[str, list[str]]) -> str:
    """``"pkg: v1 on a, b; v2 on c"``, versions ordered by the first role holding them."""
    def order(item: tuple[str, list[str]]) -> tuple[int, str]:
        first = item[1][0] if item[1] else ""
        role = "workers" if first.startswith("worker") else first
        return (_ROLES.index(role) if role in _ROLES else len(_ROLES), item[0])

    return f"{pkg}: " + "; ".join(f"{v} on {', '.join(s)}" for v, s in sorted(seen.items(),
                                                                               key=order))


def _cluster_mismatches(client: Client) -> tuple[list[str], list[str]]:
    """:func:`version_mismatches` of the cluster behind ``client`` (comparable lines, lines
    with addresses); never raises. A dying cluster must not cost the run its summary: a
    failure to ask is one line in each (its type only in the comparable one: the message may
    carry an address)."""
    try:
        versions = client.get_versions(check=False)
    except Exception as exc:  # any failure of a dying cluster
        return ([f"versions not collected: {type(exc).__name__}"],
                [f"versions not collected: {exc!r}"])
    return version_mismatches(versions), mismatch_detail(versions)


def environment(client: Client | None = None) -> Environment:
    """Python and the versions of :data:`FINGERPRINT_PACKAGES` here, and cluster mismatches.

    Keys are ``python``, the package names with ``-`` as ``_``, ``mismatches`` (comparable
    across runs, :func:`version_mismatches`) and ``mismatch_detail`` (the same with worker
    addresses, :func:`mismatch_detail`); both empty without a ``client``. This is the
    manifest's ``environment``.
    """
    env: dict[str, object] = {"python": platform.python_version()}
    for name, version in package_versions().items():
        env[name.replace("-", "_")] = version
    mismatches, detail = _cluster_mismatches(client) if client is not None else ([], [])
    env["mismatches"] = mismatches
    env["mismatch_detail"] = detail
    return cast(Environment, env)


def environment_fingerprint() -> Fingerprint:
    """This machine and process: Python, platform, hostname, git commit, packages, argv.

    The git commit is that of the current directory's repository, if any.
    """
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=False).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
            "platform": platform.platform(), "hostname": socket.gethostname(),
            "commit": commit, "packages": package_versions(), "argv": list(sys.argv)}
