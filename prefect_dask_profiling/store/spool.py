"""The local spool: files a store could not take wait here, byte-identical, until delivered.

One folder per store, named by a hash of the store's identity — its public URL plus the
options that change where data goes (the endpoint), never its credentials — so two stores
never share a spool, even with the same bucket name on two endpoints. Inside, files keep
their path relative to the store's root; ``store.json`` says which store the folder is for.

Delivery (:func:`deliver`) sends a run's files in the order that keeps every listed run
complete (:func:`~prefect_dask_profiling.store.layout.write_rank`), removes each delivered
file, and stops at the first failure of the store itself. Two processes delivering the same
spool at once are kept apart by an exclusive lock on the spool folder; without a lock
(or on another machine) exclusive creates compared byte for byte still make it safe.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from prefect_dask_profiling.errors import StoreConflict
from prefect_dask_profiling.store import layout

META = "store.json"


class SpoolMeta(TypedDict):
    """The spool's ``store.json``: the store the files are for (redacted) and, when known,
    where the spool was written from."""

    url: str
    where: NotRequired[str]
SPOOL_ENV = "DASK_PROFILING_SPOOL"
PARTIAL = ".part"

try:  # POSIX advisory locks; elsewhere delivery relies on exclusive creates alone
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


# The store already holds other bytes at a spooled file's path; the file stays spooled.
Clash = StoreConflict


@dataclass
class UploadResult:
    """Outcome of delivering a spool: files uploaded, files still in the spool, warnings."""

    uploaded: int = 0
    failed: int = 0
    warnings: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    # pipeline of each run in ``runs`` (views such as the fleet file are written for them)
    pipelines: dict[str, str] = field(default_factory=dict)
    busy: bool = False
    out_of_time: bool = False


def default_spool_dir() -> Path:
    """``$DASK_PROFILING_SPOOL`` or ``~/.cache/dask-profiling/spool``."""
    env = os.environ.get(SPOOL_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dask-profiling" / "spool"


def spool_key(url: str, where: dict[str, str] | None = None) -> str:
    """The folder name of a store's spool: a hash of its public URL and ``where`` options.

    Without ``where`` (a local store, AWS S3) the key is the hash of the URL alone, as
    spools written by earlier versions are named.
    """
    identity = url if not where else f"{url}\n{json.dumps(where, sort_keys=True)}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


class Spool:
    """The spool folder of one store.

    Parameters
    ----------
    root
        The spool directory shared by all stores (:func:`default_spool_dir`).
    url
        The store's public URL (no credentials).
    where
        Options that change where the store's data goes (``endpoint_url``...), from
        :func:`~prefect_dask_profiling.store.url.location_options`.
    """

    def __init__(self, root: str | os.PathLike, url: str,
                 where: dict[str, str] | None = None) -> None:
        self.root = Path(root).expanduser()
        self.url = url
        self.where = dict(where or {})
        self.dir = self.root / spool_key(url, self.where)

    def __repr__(self) -> str:
        return f"Spool({str(self.dir)!r})"

    def write(self, files: list[tuple[str, bytes]]) -> Path:
        """Keep ``files`` (``(path relative to the store root, bytes)``); the spool folder.

        Each file is written to a temporary name and renamed, so a crash never leaves a
        half-written file to be delivered. ``OSError`` when the spool itself is unwritable.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / META
        if not meta.exists():
            doc: SpoolMeta = {"url": self.url}
            if self.where:
                doc["where"] = self.where
            atomic_write(meta, json.dumps(doc, indent=2).encode())
        for rel, data in files:
            atomic_write(self.dir / rel, data)
        return self.dir

    def forget(self, rel: str) -> None:
        """Drop one spooled file if present (a superseded index marker, say)."""
        (self.dir / rel).unlink(missing_ok=True)

    def pending(self) -> list[str]:
        """Spooled paths (relative to the store root) in delivery order."""
        if not self.dir.is_dir():
            return []
        # os.walk skips a folder that vanishes while it is listed (another process delivering
        # the same spool prunes emptied folders); Path.rglob raises FileNotFoundError there.
        rels = [(Path(top) / name).relative_to(self.dir).as_posix()
                for top, _, names in os.walk(self.dir) for name in names
                if name != META and not name.endswith(PARTIAL)]
        return sorted(rels, key=lambda rel: (layout.write_rank(rel), rel))

    @contextlib.contextmanager
    def locked(self) -> Iterator[bool]:
        """Hold the delivery lock (an exclusive ``flock`` on the spool folder itself, so no
        lock file is left behind); yields ``False`` when another process holds it."""
        if fcntl is None:
            yield True
            return
        try:
            fd = os.open(self.dir, os.O_RDONLY)
        except OSError:  # no spool folder: nothing to deliver, nobody to exclude
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing releases the lock

    def prune(self) -> None:
        """Remove empty folders, and the spool folder once only ``store.json`` is left."""
        if not self.dir.is_dir():
            return
        # deepest first; os.walk skips folders another deliverer removed meanwhile
        for top, folders, _ in os.walk(self.dir, topdown=False):
            for name in folders:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(top, name))
        with contextlib.suppress(OSError):
            if [p.name for p in self.dir.iterdir()] == [META]:
                (self.dir / META).unlink(missing_ok=True)
                self.dir.rmdir()


def deliver(spool: Spool, send: Callable[[str, bytes, float | None], None], *,
            deadline: float | None = None,
            progress: Callable[[int, int], None] | None = None,
            describe: Callable[[BaseException], str] = repr) -> UploadResult:
    """Send the spool's files with ``send(rel, data, timeout)``, in delivery order.

    Parameters
    ----------
    spool
        What to deliver.
    send
        Writes one file to the store; raises :class:`Clash` when the store holds other bytes
        there (that run is then left whole in the spool), anything else when the store fails
        (delivery stops: everything left stays for next time). ``timeout`` is the time left
        before ``deadline`` (``None``: the store's own timeout).
    deadline
        ``time.monotonic()`` value after which no further file is started.
    progress
        ``progress(done, total)`` after each file.
    describe
        One line for a store failure (redacted by the caller).
    """
    result = UploadResult()
    order = spool.pending()
    blocked: set[tuple[str, str]] = set()
    stop: str | None = None
    delivered_runs: set[tuple[str, str]] = set()
    for n, rel in enumerate(order, 1):
        run = layout.run_of(rel)
        left = None if deadline is None else deadline - time.monotonic()
        if stop is None and left is not None and left <= 0:
            stop, result.out_of_time = "out of time", True
        if stop is not None or (run is not None and run in blocked):
            result.failed += 1
            if run is not None:
                blocked.add(run)
        else:
            try:
                data = (spool.dir / rel).read_bytes()
            except FileNotFoundError:  # delivered meanwhile by another process
                data = None
            try:
                if data is not None:
                    send(rel, data, left)
                    (spool.dir / rel).unlink(missing_ok=True)
                    result.uploaded += 1
                    if run is not None and rel.endswith("/" + layout.MANIFEST):
                        delivered_runs.add(run)
            except Clash as exc:
                result.failed += 1
                result.warnings.append(str(exc))
                if run is not None:
                    blocked.add(run)
            except Exception as exc:
                result.failed += 1
                stop = "store failed"
                result.warnings.append(
                    f"could not upload spooled files to {spool.url} ({describe(exc)}); they "
                    "stay in the spool")
        if progress is not None:
            progress(n, len(order))
    spool.prune()
    result.runs = sorted(run_id for _, run_id in delivered_runs)
    result.pipelines = {run_id: pipeline for pipeline, run_id in delivered_runs}
    return result


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(4)}{PARTIAL}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
