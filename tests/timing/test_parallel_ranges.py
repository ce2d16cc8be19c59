"""GDAL's parallel range requests, counted from its debug lines (``ParallelRanges``).

GDAL's statistics log a batch of parallel range requests as one GET. The filter reads GDAL's
debug lines as rasterio logs them and adds each batch's requests after its first. The lines
here are GDAL 3.10's, as rasterio 1.4 hands them to ``rasterio._err``; that a real GDAL on
process workers writes them so is checked end to end against a logging proxy in
``tests/flows/test_raster_odc_requests.py``.
"""

from __future__ import annotations

import logging
import logging.config
import random
import threading
from collections.abc import Iterator

import pytest

from prefect_dask_profiling.timing.worker_io import (
    NETWORK_DEBUG,
    RASTERIO_LOGGERS,
    Gdal,
    ParallelRanges,
    loaded_gdal_path,
)

URL = "http://127.0.0.1:9/bucket/scene/red.tif"


def parallel(ranges: int) -> list[str]:
    """GDAL's lines for one ``PARALLEL`` batch of ``ranges`` requests."""
    return [f"S3: Downloading {i * 9000}-{i * 9000 + 8191} ({URL})..." for i in range(ranges)
            ] + ["S3: Download completed"]


def single() -> list[str]:
    """One download of a ``Read`` (``SERIAL``, or a batch of one range)."""
    return [f"S3: Downloading 81920-114687 ({URL})...", "S3: Got response_code=206"]


def single_get(ranges: int) -> list[str]:
    """One ``SINGLE_GET`` request holding ``ranges`` ranges."""
    return [f"S3: Downloading 1-2, ..., 3-4 ({ranges * 9000} bytes, {URL})..."]


def night(rng: random.Random, reads: int) -> tuple[list[str], int]:
    """A thread's GDAL lines over ``reads`` reads of mixed kinds, and the requests GDAL's
    statistics leave out (each parallel batch's after its first)."""
    lines, missed = [f"S3: GetFileSize({URL})=376104  response_code=206"], 0
    for _ in range(reads):
        kind, n = rng.choice(("parallel", "single", "single_get")), rng.randint(1, 6)
        if kind == "parallel":
            lines += parallel(n)
            missed += n - 1
        else:
            lines += single() if kind == "single" else single_get(n)
            if rng.random() < 0.2:
                lines.append("Could not find 'Content-Type: multipart/byteranges; boundary='")
    return lines, missed


@pytest.fixture
def gdal() -> Iterator[Gdal]:
    """rasterio's GDAL with ``CPL_DEBUG`` unset for the test, restored after it (a profiled
    run earlier in this process leaves its counter, and so its ``CPL_DEBUG``, installed)."""
    import rasterio  # noqa: F401  (loads GDAL)

    lib = Gdal(loaded_gdal_path())
    before = lib.config_option("CPL_DEBUG")
    lib.set_config_option("CPL_DEBUG", None)
    try:
        yield lib
    finally:
        lib.set_config_option("CPL_DEBUG", before)


@pytest.fixture
def installed(gdal):
    ranges = ParallelRanges()
    ranges.install(gdal)
    try:
        yield ranges
    finally:
        ranges.uninstall(gdal)


@pytest.mark.parametrize("seed", range(5))
def test_threads_reading_at_once_count_each_batchs_requests_after_the_first(installed, seed):
    rng = random.Random(seed)
    nights = [night(random.Random(rng.random()), rng.randint(1, 60)) for _ in range(4)]
    log = logging.getLogger(RASTERIO_LOGGERS[0])

    def read(lines: list[str]) -> None:
        for line in lines:
            level = logging.WARNING if line.startswith("Could not") else logging.DEBUG
            log.log(level, "%s", line)

    threads = [threading.Thread(target=read, args=(lines,)) for lines, _ in nights]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert installed.extra == sum(missed for _, missed in nights)
    installed.reset()
    assert installed.extra == 0


def test_a_batch_cut_short_by_another_record_adds_nothing():
    ranges = ParallelRanges()
    for line in parallel(3)[:-1]:
        ranges.read(line)
    ranges.read("")  # an error record of the same thread: the batch failed
    ranges.read("S3: Download completed")
    assert ranges.extra == 0
    for line in parallel(3):
        ranges.read(line)
    assert ranges.extra == 2


def test_the_users_handlers_get_no_record_they_did_not_get_before(installed):
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign]
    root = logging.getLogger()
    root.addHandler(handler)  # NOTSET: it takes whatever its loggers let through
    try:
        log = logging.getLogger(RASTERIO_LOGGERS[0])
        for line in parallel(4):
            log.debug("%s", line)
        log.warning("%s", "a GDAL warning")
    finally:
        root.removeHandler(handler)
    assert installed.extra == 3
    assert [r.getMessage() for r in seen] == ["a GDAL warning"]


def test_install_turns_gdals_network_debug_on_and_uninstall_restores_everything(gdal):
    levels = {name: logging.getLogger(name).level for name in RASTERIO_LOGGERS}
    assert gdal.config_option("CPL_DEBUG") is None
    ranges = ParallelRanges()
    ranges.install(gdal)
    try:
        assert gdal.config_option("CPL_DEBUG") == NETWORK_DEBUG
        assert ranges.counting(gdal)
    finally:
        ranges.uninstall(gdal)
    assert gdal.config_option("CPL_DEBUG") is None
    assert {name: logging.getLogger(name).level for name in RASTERIO_LOGGERS} == levels
    assert not any(ranges in logging.getLogger(name).filters for name in RASTERIO_LOGGERS)


@pytest.mark.parametrize(("preset", "counting"), [("ON", True), ("GTiff", False)])
def test_a_users_cpl_debug_is_left_alone(gdal, preset, counting):
    gdal.set_config_option("CPL_DEBUG", preset)
    ranges = ParallelRanges()
    ranges.install(gdal)
    try:
        assert gdal.config_option("CPL_DEBUG") == preset
        assert ranges.counting(gdal) is counting, "GTiff's debug lines only: not counted"
    finally:
        ranges.uninstall(gdal)
    assert gdal.config_option("CPL_DEBUG") == preset


def test_a_logging_config_that_disables_rasterios_loggers_stops_the_count_and_says_so(
        installed, gdal):
    logger = logging.getLogger(RASTERIO_LOGGERS[0])
    assert installed.counting(gdal)
    logger.disabled = True  # what dictConfig(disable_existing_loggers=True) does
    try:
        assert not installed.counting(gdal), "the run must say its requests are a lower bound"
    finally:
        logger.disabled = False
    assert installed.counting(gdal)


def test_a_users_filter_on_rasterios_logger_does_not_hide_the_lines(gdal):
    log = logging.getLogger(RASTERIO_LOGGERS[0])
    quiet = logging.Filter("nothing")  # drops every record (its name matches no logger)
    log.addFilter(quiet)
    ranges = ParallelRanges()
    ranges.install(gdal)
    try:
        for line in parallel(5):
            log.debug("%s", line)
    finally:
        ranges.uninstall(gdal)
        log.removeFilter(quiet)
    assert ranges.extra == 4
