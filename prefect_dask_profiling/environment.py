"""The software a run or a benchmark ran on: versions here, and mismatches across a cluster.

Stored with every run (the manifest's ``environment``) and every benchmark session (the
fingerprint in ``comparison.json``), so that a change in timings can be traced to an
upgrade; mismatched versions between the client, the scheduler and the workers are listed
because they are a common cause of slow or failing serialisation. Standard library only.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["FINGERPRINT_PACKAGES", "KEY_PACKAGES", "cluster_mismatches", "environment",
           "environment_fingerprint", "package_version", "package_versions",
           "version_mismatches"]

# Installed distributions recorded with a run or a benchmark session.
FINGERPRINT_PACKAGES = ("dask", "distributed", "prefect", "prefect-dask", "pandas", "numpy",
                        "cloudpickle", "tornado", "prefect-dask-profiling")
# Packages (as ``Client.get_versions`` names them) that must match across a cluster.
KEY_PACKAGES = ("python", "dask", "distributed", "msgpack", "cloudpickle", "numpy", "pandas",
                "toolz", "tornado", "lz4")


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def package_versions(names: tuple[str, ...] = FINGERPRINT_PACKAGES) -> dict[str, str | None]:
    """``{distribution: version or None}`` for ``names``."""
    return {name: package_version(name) for name in names}


def version_mismatches(versions: dict[str, Any]) -> list[str]:
    """Key packages whose versions differ between client, scheduler and workers (pure).

    Parameters
    ----------
    versions
        What ``Client.get_versions(check=False)`` returns.

    Returns
    -------
    One line per package that differs, e.g.
    ``"numpy: 2.1.0 on client, scheduler; 1.26.4 on worker tcp://10.0.0.5:4321"``.
    """
    sides = {"client": versions.get("client") or {},
             "scheduler": versions.get("scheduler") or {}}
    sides.update({f"worker {w}": v or {} for w, v in (versions.get("workers") or {}).items()})
    mismatches = []
    for pkg in KEY_PACKAGES:
        seen: dict[str, list[str]] = {}
        for side, info in sides.items():
            value = (info.get("packages") or {}).get(pkg)
            if pkg == "python":
                value = (info.get("host") or {}).get("python") or value
            if value is not None:
                seen.setdefault(str(value), []).append(side)
        if len(seen) > 1:
            detail = "; ".join(f"{v} on {', '.join(s)}" for v, s in seen.items())
            mismatches.append(f"{pkg}: {detail}")
    return mismatches


def cluster_mismatches(client: Client) -> list[str]:
    """:func:`version_mismatches` of the cluster behind ``client``; never raises.

    A dying cluster must not cost the run its summary: a failure to ask becomes one line.
    """
    try:
        versions = client.get_versions(check=False)
    except Exception as exc:  # any failure of a dying cluster
        return [f"versions not collected: {exc!r}"]
    return version_mismatches(versions)


def environment(client: Client | None = None) -> dict[str, Any]:
    """Python and the versions of :data:`FINGERPRINT_PACKAGES` here, and cluster mismatches.

    Keys are ``python``, the package names with ``-`` as ``_``, and ``mismatches`` (empty
    without a ``client``). This is the manifest's ``environment``.
    """
    env: dict[str, Any] = {"python": platform.python_version()}
    for name, version in package_versions().items():
        env[name.replace("-", "_")] = version
    env["mismatches"] = cluster_mismatches(client) if client is not None else []
    return env


def environment_fingerprint() -> dict[str, Any]:
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
