"""Runs in every Dask worker process (and in the flow process, as its own counter): the
storage requests of the process, counted by the :class:`StorageRequests` worker plugin and
read from the flow process by :mod:`~prefect_dask_profiling.timing.io_client`.

* **GDAL**: its network statistics (``CPL_VSIL_NETWORK_STATS_ENABLED``, GDAL >= 3.2), read
  through :mod:`ctypes` on the ``libgdal`` the process already loaded; GDAL is never
  imported here, and one it cannot attach to is remembered with the reason (``gdal_error``).
* **s3fs**: calls of ``S3FileSystem._call_s3`` by kind, through one counting wrapper per
  process (:func:`_s3fs_hook`); filesystems marked :data:`UNCOUNTED_ATTRIBUTE` (the run
  store's) are not counted.
* **Chunks**: the *source chunks* of the prefixes found reading (checked on at most
  :data:`CHECKS_PER_PREFIX` tasks per prefix and process), counted from the graph.
* **CPU**: the process's CPU and run-queue wait (:mod:`prefect_dask_profiling.timing.cpu`).

The counts are process-wide. GDAL's statistics log a batch of parallel range requests as
one GET: :class:`ParallelRanges` counts the rest from GDAL's debug lines. The limits (stages
that overlap, GDAL called outside rasterio) are in docs/raster-io.md. Nothing here raises
into the worker."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypedDict

from dask.utils import key_split
from distributed.diagnostics.plugin import WorkerPlugin

from prefect_dask_profiling.timing.cpu import process_cpu, threads_wait

PLUGIN_NAME = "dask-profiling-storage-requests"
# an fsspec filesystem with this attribute true is not counted (the run store's own calls)
UNCOUNTED_ATTRIBUTE = "dask_profiling_uncounted"
# Marks the process's one counting wrapper of ``S3FileSystem._call_s3`` (:func:`_s3fs_hook`).
S3FS_HOOK_ATTRIBUTE = "dask_profiling_counting_hook"
_S3FS_LOCK = threading.Lock()
STATS_OPTION = "CPL_VSIL_NETWORK_STATS_ENABLED"
METHODS = ("GET", "HEAD", "LIST", "PUT", "POST", "DELETE")
LIST_ACTIONS = ("ReadDir", "OpenDir", "ListBucket")
OPTION_PREFIXES = ("GDAL_", "CPL_", "VSI_", "AWS_")
# Options recorded but never compared between nights: where GDAL finds its data files.
# rasterio sets GDAL_DATA itself once an environment is entered in the process, so whether
# it is set when the options are read depends on that timing, not on the night (a regressed
# NDVI night's explanation named "GDAL_DATA ... -> unset" beside the real cause).
UNCOMPARED_OPTIONS = frozenset({"GDAL_DATA"})
SECRET_WORDS = ("SECRET", "KEY", "TOKEN", "PASSWORD", "CREDENTIAL", "SESSION", "SIGNATURE")
S3FS_KINDS = {"get_object": "GET", "head_object": "HEAD", "head_bucket": "HEAD",
              "list_objects_v2": "LIST", "list_objects": "LIST", "put_object": "PUT",
              "upload_part": "PUT", "delete_object": "DELETE", "delete_objects": "DELETE"}
# GDAL's defaults of the options that shape storage requests (GDAL 3.10 docs): recorded as
# in effect when unset, so a night that sets one shows as a change from its default
REQUEST_OPTION_DEFAULTS = {
    "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES", "GDAL_HTTP_MULTIRANGE": "PARALLEL",
    "GDAL_HTTP_MULTIPLEX": "YES", "GDAL_DISABLE_READDIR_ON_OPEN": "NO",
    "GDAL_INGESTED_BYTES_AT_OPEN": "16384", "CPL_VSIL_CURL_CHUNK_SIZE": "16384",
    "CPL_VSIL_CURL_CACHE_SIZE": "16384000", "CPL_VSIL_CURL_USE_HEAD": "YES",
    "VSI_CACHE": "NO", "GDAL_CACHEMAX": "5%"}
MAX_EXECUTING = 10_000
MAX_READERS = 1_000
# tasks of a prefix checked for GDAL requests before it is taken for a non-reading one
# (each check reads GDAL's statistics twice, ~0.2 ms with a dozen files)
CHECKS_PER_PREFIX = 3
MAX_SHAPES = 64
MAX_FILES = 256
# GDAL's debug categories of its network file systems (``GetDebugKey()`` in
# port/cpl_vsil_*.cpp); ``CPLDebug`` looks a category up anywhere in ``CPL_DEBUG``'s value
NETWORK_DEBUG = "S3,GS,AZURE,ADLS,OSS,SWIFT,WEBHDFS,VSICURL"
# where rasterio logs GDAL's messages: reads (``stack_errors``), then ``rasterio.Env``'s handler
RASTERIO_LOGGERS = ("rasterio._err", "rasterio._env")


class SourceCounts(TypedDict, total=False):
    """Cumulative requests of one source in one process: ``{METHOD: n, "bytes": n}``."""

    GET: int
    HEAD: int
    LIST: int
    PUT: int
    POST: int
    DELETE: int
    bytes: int


class WorkerCounters(TypedDict, total=False):
    """One reading of one process's counters (:func:`io_counters`).

    ``sources`` is ``{prefix: [source chunks, their bytes]}`` of every prefix whose tasks
    returned source chunks, ``readers`` the prefixes known to read; ``chunks`` and
    ``decoded_bytes`` are the readers' sums (older readings have only those).
    ``process`` is ``"worker"`` or ``"flow"``; ``gdal_error`` why GDAL is not counted.
    """

    pid: int
    instance: str
    time: float
    process: str
    gdal: SourceCounts | None
    gdal_error: str | None
    s3fs: SourceCounts | None
    chunks: int
    decoded_bytes: int
    sources: dict[str, list[int]]
    readers: list[str]
    errors: int
    shapes: dict[str, int]
    files: dict[str, int]
    cpu_s: float | None
    task_waits: dict[int, float] | None


# -- GDAL through ctypes ----------------------------------------------------------------------


def loaded_gdal_path() -> str | None:
    """Path of the ``libgdal`` this process has loaded (rasterio's), else None."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps", encoding="utf-8") as fh:
            for line in fh:
                if "libgdal" in line and ".so" in line:
                    return line.split()[-1]
    module = sys.modules.get("rasterio")
    if module is None or not getattr(module, "__file__", None):
        return None
    root = os.path.dirname(os.path.dirname(module.__file__))
    for folder in ("rasterio.libs", os.path.join("rasterio", ".libs")):
        found = sorted(glob.glob(os.path.join(root, folder, "libgdal*")))
        if found:
            return found[0]
    return None


class Gdal:
    """The few GDAL C functions this module needs, on an already loaded ``libgdal``."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        lib.VSINetworkStatsGetAsSerializedJSON.restype = ctypes.c_void_p
        lib.VSINetworkStatsGetAsSerializedJSON.argtypes = [ctypes.c_void_p]
        lib.VSIFree.argtypes = [ctypes.c_void_p]
        lib.GDALVersionInfo.restype = ctypes.c_char_p
        lib.GDALVersionInfo.argtypes = [ctypes.c_char_p]
        lib.CPLSetConfigOption.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.CPLGetConfigOption.restype = ctypes.c_char_p
        lib.CPLGetConfigOption.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        lib.CPLGetConfigOptions.restype = ctypes.POINTER(ctypes.c_char_p)
        lib.CSLDestroy.argtypes = [ctypes.POINTER(ctypes.c_char_p)]
        self.lib = lib
        self.path = path

    def enable_stats(self) -> None:
        """Turn network statistics on (GDAL reads the option again after a reset)."""
        self.lib.CPLSetConfigOption(STATS_OPTION.encode(), b"YES")
        self.lib.VSINetworkStatsReset()

    def stats_text(self) -> str:
        """GDAL's serialized statistics (cheap: a few microseconds on small stats)."""
        ptr = self.lib.VSINetworkStatsGetAsSerializedJSON(None)
        if not ptr:
            return ""
        try:
            return ctypes.string_at(ptr).decode("utf-8", "replace")
        finally:
            self.lib.VSIFree(ptr)

    def version(self) -> str:
        return self.lib.GDALVersionInfo(b"RELEASE_NAME").decode()

    def config_option(self, name: str) -> str | None:
        """An option's value as GDAL reads it (this thread's, the process's, the
        environment's), else None."""
        value = self.lib.CPLGetConfigOption(name.encode(), None)
        return None if value is None else value.decode("utf-8", "replace")

    def set_config_option(self, name: str, value: str | None) -> None:
        """Set (or, with None, unset) a process-wide GDAL option."""
        self.lib.CPLSetConfigOption(name.encode(), None if value is None else value.encode())

    def config_options(self) -> dict[str, str]:
        """Options set with ``CPLSetConfigOption`` (process-wide; e.g. by ``rasterio.Env``)."""
        ptr = self.lib.CPLGetConfigOptions()
        out: dict[str, str] = {}
        if not ptr:
            return out
        try:
            i = 0
            while ptr[i]:
                name, _, value = ptr[i].decode("utf-8", "replace").partition("=")
                out[name] = value
                i += 1
        finally:
            self.lib.CSLDestroy(ptr)
        return out


# -- parallel range requests, from GDAL's debug lines ------------------------------------------


class ParallelRanges(logging.Filter):
    """Counts the HTTP requests that GDAL's statistics fold into one, from its debug lines.

    Under ``GDAL_HTTP_MULTIRANGE=PARALLEL`` (GDAL's default) GDAL sends the ranges of one
    read at once and logs the batch as one GET (docs/raster-io.md). Its debug output names
    every request: ``Downloading <range> (<url>)...`` for each one, then one ``Download
    completed`` for the batch, where a single download ends with ``Got response_code``. A
    batch is the ``Downloading`` lines a thread logs in a row before ``Download completed``;
    :attr:`extra` adds the requests after its first.

    rasterio hands GDAL's messages to :data:`RASTERIO_LOGGERS`, on the thread that read.
    This filter sits on those loggers, lowered to DEBUG while it is installed, and drops
    every record their former level would have dropped: the user's handlers see what they
    saw before. One per process (:func:`acquire_ranges`), shared by every counter in it,
    as GDAL's statistics are.
    """

    extra: int  # requests of parallel batches after each batch's first, since the reset
    users: int  # counters of this process using it (:func:`release_ranges` at 0 uninstalls)
    debug_set: bool  # CPL_DEBUG was set to NETWORK_DEBUG here (unset again at uninstall)
    _floors: dict[str, int]  # logger -> the level it dropped below before
    _levels: dict[str, int]  # logger -> its own level before (restored at uninstall)
    _thread: threading.local  # .run: this thread's ``Downloading`` lines in a row
    _lock: threading.Lock

    def __init__(self) -> None:
        super().__init__()
        self.extra = self.users = 0
        self.debug_set = False
        self._floors, self._levels = {}, {}
        self._thread = threading.local()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        """Read one record; keep it only if the logger would have kept it without us."""
        try:
            self.read(record.getMessage() if record.levelno == logging.DEBUG else "")
        except Exception:  # never fail the user's logging call
            pass
        return record.levelno >= self._floors.get(record.name, logging.WARNING)

    def read(self, text: str) -> None:
        """One GDAL message of this thread (``""``: any other record, which ends a run)."""
        run = getattr(self._thread, "run", 0)
        if "Downloading " in text and "bytes, " not in text:  # not a SINGLE_GET request
            self._thread.run = run + 1
            return
        if run > 1 and "Download completed" in text:
            with self._lock:
                self.extra += run - 1
        self._thread.run = 0

    def reset(self) -> None:
        """Start again from zero (with GDAL's statistics: :meth:`Gdal.enable_stats`)."""
        with self._lock:
            self.extra = 0

    def install(self, gdal: Gdal) -> None:
        """Lower rasterio's loggers to DEBUG behind this filter, and turn GDAL's network
        debug lines on unless ``CPL_DEBUG`` is set already (then it is left as it is)."""
        for name in RASTERIO_LOGGERS:
            logger = logging.getLogger(name)
            self._floors[name], self._levels[name] = logger.getEffectiveLevel(), logger.level
            if self not in logger.filters:  # first: a filter before it could drop the lines
                logger.filters.insert(0, self)
            logger.setLevel(logging.DEBUG)
        if gdal.config_option("CPL_DEBUG") is None:
            gdal.set_config_option("CPL_DEBUG", NETWORK_DEBUG)
            self.debug_set = True

    def uninstall(self, gdal: Gdal | None) -> None:
        """Undo :meth:`install`: the loggers' levels, and ``CPL_DEBUG`` if it set it."""
        for name, level in self._levels.items():
            logger = logging.getLogger(name)
            logger.removeFilter(self)
            logger.setLevel(level)
        if self.debug_set and gdal is not None \
                and gdal.config_option("CPL_DEBUG") == NETWORK_DEBUG:
            gdal.set_config_option("CPL_DEBUG", None)

    def counting(self, gdal: Gdal) -> bool:
        """Whether GDAL logs its network requests where this filter reads them now: its
        ``CPL_DEBUG`` lets them through, and every logger still hands them to this filter
        (a later ``logging.config.dictConfig`` may have disabled or raised one)."""
        debug = gdal.config_option("CPL_DEBUG")
        if debug is None or debug.upper() not in ("ON", "", NETWORK_DEBUG):
            return False
        loggers = [logging.getLogger(name) for name in RASTERIO_LOGGERS]
        return all(not logger.disabled and logger.isEnabledFor(logging.DEBUG)
                   and self in logger.filters for logger in loggers)


_RANGES: ParallelRanges | None = None
_RANGES_LOCK = threading.Lock()


def acquire_ranges(gdal: Gdal) -> ParallelRanges:
    """The process's :class:`ParallelRanges`, installed on first use."""
    global _RANGES
    with _RANGES_LOCK:
        if _RANGES is None:
            _RANGES = ParallelRanges()
            _RANGES.install(gdal)
        _RANGES.users += 1
        return _RANGES


def release_ranges(gdal: Gdal | None) -> None:
    """One counter less; the last one uninstalls the filter."""
    global _RANGES
    with _RANGES_LOCK:
        if _RANGES is None:
            return
        _RANGES.users -= 1
        if _RANGES.users <= 0:
            _RANGES.uninstall(gdal)
            _RANGES = None


def gdal_counts(text: str) -> SourceCounts:
    """Requests and bytes from GDAL's serialized statistics (pure).

    ``LIST`` is the GETs of directory listings (``ReadDir``); ``GET`` is the rest.
    """
    if not text:
        return {}
    stats = json.loads(text)
    counts: dict[str, int] = {"bytes": 0}
    for method, entry in (stats.get("methods") or {}).items():
        counts[method] = counts.get(method, 0) + int(entry.get("count", 0))
        counts["bytes"] += int(entry.get("downloaded_bytes", 0))
    listed = 0
    for handler in (stats.get("handlers") or {}).values():
        for action, entry in (handler.get("actions") or {}).items():
            if action in LIST_ACTIONS:
                listed += int(((entry.get("methods") or {}).get("GET") or {}).get("count", 0))
    if listed:
        counts["LIST"] = listed
        counts["GET"] = counts.get("GET", 0) - listed
    return counts  # type: ignore[return-value]


def gdal_files(text: str, limit: int = MAX_FILES) -> dict[str, int]:
    """``{GDAL path: requests}`` of the files in GDAL's serialized statistics (pure)."""
    if not text:
        return {}
    out: dict[str, int] = {}
    for prefix, handler in (json.loads(text).get("handlers") or {}).items():
        for name, entry in (handler.get("files") or {}).items():
            if len(out) >= limit:
                return out
            path = name if name.startswith("/") else f"/{prefix}/{name}"
            out[path] = sum(int(m.get("count", 0))
                            for m in (entry.get("methods") or {}).values())
    return out


def curl_version() -> str | None:
    """libcurl's version string as loaded in this process (GDAL's), else None."""
    with contextlib.suppress(OSError):
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = {line.split()[-1] for line in fh if "libcurl" in line and ".so" in line}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            lib.curl_version.restype = ctypes.c_char_p
            return lib.curl_version().decode()
    return None


def is_secret(name: str) -> bool:
    """True for option names whose values must never be recorded."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def effective_options(environ: dict[str, str], config: dict[str, str],
                      defaults: dict[str, str] | None = None) -> dict[str, str]:
    """``GDAL_*``/``CPL_*``/``VSI_*``/``AWS_*`` options in effect, secrets as ``"<set>"`` (pure).

    A config option set in GDAL overrides the same name in the environment, as in GDAL;
    ``defaults`` fill the names neither sets (:data:`REQUEST_OPTION_DEFAULTS` when GDAL is
    loaded).
    """
    merged = dict(defaults or {})
    merged.update({k: v for k, v in environ.items() if k.startswith(OPTION_PREFIXES)})
    merged.update({k: v for k, v in config.items() if k.startswith(OPTION_PREFIXES)})
    return {k: ("<set>" if is_secret(k) else v) for k, v in sorted(merged.items())}


# -- the worker plugin ------------------------------------------------------------------------


class StorageRequests(WorkerPlugin):
    """Counts storage requests in one process (bounded; never raises).

    State is a handful of integers, the source chunks per key prefix (at most
    :data:`MAX_READERS` prefixes) and the GDAL statistics text of each source task executing
    right now (at most :data:`MAX_EXECUTING`).

    Parameters
    ----------
    gdal_library
        Path of the ``libgdal`` to read the statistics from; default: the one rasterio
        loaded in the process. A library without GDAL's network statistics leaves GDAL
        uncounted, with the reason in the readings.
    """

    name = PLUGIN_NAME

    def __init__(self, gdal_library: str | None = None) -> None:
        self.worker: Any = None
        self.gdal_library = gdal_library
        self.instance = f"{os.getpid()}-{id(self):x}-{time.time():.6f}"
        self.gdal: Gdal | None = None
        self.gdal_error: str | None = None
        self.ranges: ParallelRanges | None = None  # the process's, once GDAL is attached
        self.attach_attempts = 0
        self.s3fs: dict[str, int] | None = None
        self._s3fs_hook: Any = None  # the wrapper this counter is registered with
        self._s3fs_sink: Callable[[Any, Any, Any], None] | None = None
        self.errors = 0
        self.readers: set[str] = set()
        self.sources: dict[str, list[int]] = {}  # prefix -> [source chunks, decoded bytes]
        self._checked: dict[str, int] = {}  # prefix -> tasks checked without a request
        self.shapes: dict[str, int] = {}  # "rows x cols" of chunks read -> count
        # key -> (prefix, GDAL statistics at its start or None: not checked, source task)
        self._executing: dict[Any, tuple[str, str | None, bool]] = {}

    def setup(self, worker: Any) -> None:
        self.worker = worker
        self.start_counting()

    def start_counting(self) -> None:
        """Turn GDAL's statistics on in this process and attach (never raises)."""
        try:
            os.environ.setdefault(STATS_OPTION, "YES")
            # GDAL already in use: it read the option before we set it, so reset once
            self.attach(reset=True)
        except Exception:
            self.errors += 1

    def teardown(self, worker: Any) -> None:
        try:
            self._unpatch_s3fs()
            if self.ranges is not None:
                self.ranges = None
                release_ranges(self.gdal)
        except Exception:
            self.errors += 1

    def attach(self, reset: bool = False) -> None:
        """Start counting GDAL and s3fs once the process has loaded them (idempotent).

        GDAL is attached once: after rasterio finished importing, one attempt, whose
        failure is remembered in :attr:`gdal_error`. GDAL loaded after :meth:`setup` read
        the option from the environment at its first request, so its statistics are kept
        (``reset=False``): they are this process's requests since then.
        """
        if self.gdal is None and self.gdal_error is None and _rasterio_imported():
            self.attach_attempts += 1
            self.gdal, self.gdal_error = _attach_gdal(self.gdal_library, reset)
            if self.gdal_error is not None:
                self.errors += 1
            else:
                self.ranges = acquire_ranges(self.gdal)
                if reset:  # with GDAL's statistics
                    self.ranges.reset()
        if self.s3fs is None and "s3fs" in sys.modules:
            self._patch_s3fs()

    def _patch_s3fs(self) -> None:
        """Count this process's s3fs calls from now on (fresh counts), registered with the
        process's one counting wrapper."""
        from s3fs.core import S3FileSystem

        counts: dict[str, int] = {"bytes": 0}

        def sink(fs: Any, method: Any, out: Any) -> None:
            try:
                if not getattr(fs, UNCOUNTED_ATTRIBUTE, False):
                    kind = S3FS_KINDS.get(getattr(method, "__name__", method), "OTHER")
                    counts[kind] = counts.get(kind, 0) + 1
                    if kind == "GET" and isinstance(out, dict):
                        counts["bytes"] += int(out.get("ContentLength") or 0)
            except Exception:
                self.errors += 1

        with _S3FS_LOCK:
            hook = _s3fs_hook(S3FileSystem)
            hook.sinks = (*hook.sinks, sink)
        self._s3fs_hook, self._s3fs_sink = hook, sink
        self.s3fs = counts

    def _unpatch_s3fs(self) -> None:
        """Stop counting s3fs calls; the last counter of the process to stop restores
        s3fs's own method (unless another library wrapped it since: then the wrapper stays,
        counting nothing)."""
        hook, sink = self._s3fs_hook, self._s3fs_sink
        if hook is None:
            return
        from s3fs.core import S3FileSystem

        with _S3FS_LOCK:
            hook.sinks = tuple(s for s in hook.sinks if s is not sink)
            if not hook.sinks and S3FileSystem.__dict__.get("_call_s3") is hook:
                S3FileSystem._call_s3 = hook.__wrapped__
        self._s3fs_hook = self._s3fs_sink = None
        self.s3fs = None

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        try:
            if finish == "executing":
                if len(self._executing) < MAX_EXECUTING:
                    ts = self.worker.state.tasks.get(key)
                    source = ts is not None and not any(
                        _is_array(getattr(dep, "type", None)) for dep in ts.dependencies)
                    prefix = key_split(key)
                    check = source and prefix not in self.readers and self._checked.get(
                        prefix, 0) < CHECKS_PER_PREFIX
                    self._executing[key] = (
                        prefix, (self.gdal.stats_text() if self.gdal else "") if check
                        else None, source)
            elif start == "executing":
                entry = self._executing.pop(key, None)
                if entry is None or finish == "long-running":
                    return  # a seceded task waits on others: not a chunk of its own
                prefix, before, source = entry
                self.attach()
                if not source:
                    return
                ts = self.worker.state.tasks.get(key)
                if not _is_array(getattr(ts, "type", None)):
                    return
                self._count_source(prefix, int(getattr(ts, "nbytes", 0) or 0))
                if self.gdal is None:
                    return
                if before is not None:
                    self._classify(prefix, self.gdal.stats_text() != before)
                if prefix in self.readers:
                    self._count_shape(key)
        except Exception:
            self.errors += 1

    def _count_source(self, prefix: str, nbytes: int) -> None:
        """One more source chunk of ``prefix`` (bounded by :data:`MAX_READERS` prefixes)."""
        counted = self.sources.get(prefix)
        if counted is None:
            if len(self.sources) >= MAX_READERS:
                return
            counted = self.sources[prefix] = [0, 0]
        counted[0] += 1
        counted[1] += nbytes

    def _classify(self, prefix: str, fetched: bool) -> None:
        """A prefix is a reading one once a task of it fetched; checked at most a few times."""
        if fetched:
            if len(self.readers) < MAX_READERS:
                self.readers.add(prefix)
            self._checked.pop(prefix, None)
        elif prefix in self._checked or len(self._checked) < MAX_READERS:
            self._checked[prefix] = self._checked.get(prefix, 0) + 1

    def _count_shape(self, key: Any) -> None:
        """Remember the (rows, cols) of an array chunk just read (never unspills)."""
        data = getattr(self.worker.data, "fast", self.worker.data)
        shape = getattr(data.get(key) if hasattr(data, "get") else None, "shape", None)
        if not shape or len(shape) < 2:
            return
        name = f"{shape[-2]}x{shape[-1]}"
        if name in self.shapes or len(self.shapes) < MAX_SHAPES:
            self.shapes[name] = self.shapes.get(name, 0) + 1

    def counters(self, cpu: bool = True) -> WorkerCounters:
        """A reading of this process's cumulative counters (``cpu``: with the process's CPU)."""
        files: dict[str, int] = {}
        try:
            self.attach()
            text = self.gdal.stats_text() if self.gdal is not None else ""
            gdal = gdal_counts(text) if self.gdal is not None else None
            if gdal and self.ranges is not None and self.ranges.extra:
                gdal["GET"] = gdal.get("GET", 0) + self.ranges.extra
            files = gdal_files(text)
        except Exception:
            self.errors += 1
            gdal = None
        cpu_s, wait = process_cpu() if cpu else (None, None)
        sources = {p: list(v) for p, v in self.sources.items()}
        readers = sorted(self.readers)
        read = [sources[p] for p in readers if p in sources]
        return {"pid": os.getpid(), "instance": self.instance, "time": time.time(),
                "process": "worker" if self.worker is not None else "flow",
                "cpu_s": cpu_s, "task_waits": None if wait is None else self._task_waits(),
                "gdal": gdal, "gdal_error": self.gdal_error,
                "s3fs": dict(self.s3fs) if self.s3fs is not None else None,  # type: ignore
                "chunks": sum(v[0] for v in read), "decoded_bytes": sum(v[1] for v in read),
                "sources": sources, "readers": readers,
                "errors": self.errors, "shapes": dict(self.shapes), "files": files}

    def _task_waits(self) -> dict[int, float]:
        """Run-queue wait of the threads that run tasks now, by thread id (none yet: {})."""
        try:
            executors = getattr(self.worker, "executors", None) or {}
            return threads_wait([t.native_id for e in executors.values()
                                 for t in list(getattr(e, "_threads", ()) or ())
                                 if t.native_id is not None])
        except Exception:
            self.errors += 1
            return {}


def _s3fs_hook(cls: Any) -> Any:
    """The process's one counting wrapper of ``cls._call_s3``, installed on first use
    (call under ``_S3FS_LOCK``).

    Each counter adds its sink to the wrapper's ``sinks`` (a tuple, replaced whole: the
    calls read it on fsspec's I/O thread without a lock) and removes it when it stops.
    Wrappers chained one per counter restored each other's originals when two counters of
    one process stopped in the order they started, leaving a stopped counter's wrapper
    installed; one wrapper has no order.
    """
    current = cls.__dict__.get("_call_s3")
    if getattr(current, S3FS_HOOK_ATTRIBUTE, False):
        return current
    original = cls._call_s3

    async def counted(fs: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
        out = await original(fs, method, *args, **kwargs)
        for sink in counted.sinks:  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):  # a sink counts its own errors
                sink(fs, method, out)
        return out

    counted.sinks = ()  # type: ignore[attr-defined]
    counted.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(counted, S3FS_HOOK_ATTRIBUTE, True)
    cls._call_s3 = counted
    return counted


_ARRAY_TYPES: dict[type, bool] = {}


def _is_array(kind: Any) -> bool:
    """Whether a task result's type is an array chunk (an ``ndarray`` or a subclass)."""
    if not isinstance(kind, type):
        return False
    known = _ARRAY_TYPES.get(kind)
    if known is None:
        known = any(base.__name__ == "ndarray" for base in kind.__mro__)
        if len(_ARRAY_TYPES) < MAX_READERS:
            _ARRAY_TYPES[kind] = known
    return known


def _rasterio_imported() -> bool:
    """rasterio has finished importing (its GDAL is loaded) in this process."""
    module = sys.modules.get("rasterio")
    return getattr(module, "__gdal_version__", None) is not None


def _attach_gdal(library: str | None, reset: bool) -> tuple[Gdal | None, str | None]:
    """GDAL's statistics on ``library`` (default: the loaded one), or None and why not."""
    path = library or loaded_gdal_path()
    if path is None:
        return None, "libgdal not found in the process"
    try:
        gdal = Gdal(path)
        if reset:
            gdal.enable_stats()
    except (OSError, AttributeError) as exc:  # AttributeError: no network statistics
        return None, f"GDAL's network statistics unavailable in {path}: {exc}"
    return gdal, None


def _read_counters(dask_worker: Any) -> WorkerCounters | None:
    plugin = dask_worker.plugins.get(PLUGIN_NAME)
    return plugin.counters() if plugin is not None else None


def _raster_environment(dask_worker: Any = None) -> dict[str, Any]:
    """GDAL, rasterio and libcurl versions and the effective options of one process."""
    rasterio = sys.modules.get("rasterio")
    path = loaded_gdal_path() if rasterio is not None else None
    config: dict[str, str] = {}
    gdal_version = None
    counted = False
    if path is not None:
        gdal = Gdal(path)
        gdal_version = gdal.version()
        config = gdal.config_options()
        counted = _RANGES is not None and _RANGES.counting(gdal)
    if config.get("CPL_DEBUG") == NETWORK_DEBUG:  # ours (ParallelRanges), not the night's
        del config["CPL_DEBUG"]
    return {"gdal": gdal_version, "rasterio": getattr(rasterio, "__version__", None),
            "libcurl": curl_version() if path is not None else None,
            "options": effective_options(dict(os.environ), config,
                                         REQUEST_OPTION_DEFAULTS if path else None),
            "ranges_counted": counted}


def _block_shapes(paths: list[str]) -> dict[str, list[int]]:
    """``{path: [rows, cols]}`` of the first band's block of each file (run on a worker)."""
    import rasterio

    out = {}
    for path in paths:
        try:
            with rasterio.open(path) as ds:
                out[path] = list(ds.block_shapes[0])
        except Exception:
            continue
    return out
