"""Pages stored gzip-compressed: how they are compressed, and read back whatever their age.

A stage's report is HTML with base64 arrays in it, 1-4.5 MB for a big stage, that gzip
shrinks 7-8 times (docs/reports.md). On S3 the store keeps a page (``.html``)
compressed, with ``Content-Encoding: gzip``, so a browser opening its link decodes it
transparently; a local store keeps it plain, because a browser opening a file does not
decode it (docs/store.md). Readers tell the two apart by gzip's magic bytes, so reports
stored before, uncompressed, stay readable.
"""

from __future__ import annotations

import gzip
import zlib

from prefect_dask_profiling.errors import DamagedRecord

#: The first two bytes of every gzip stream (RFC 1952); no HTML page starts with them.
GZIP_MAGIC = b"\x1f\x8b"
#: gzip's level for pages: 6 stores a huge stage's report within 3% of level 9's size at a
#: fifth of its CPU, and 14% smaller than level 1 (``benchmarks/report_scale.py --gzip``;
#: docs/reports.md).
GZIP_LEVEL = 6
#: What a stored page says it is (with ``Content-Encoding: gzip`` when compressed).
HTML_CONTENT_TYPE = "text/html; charset=utf-8"
PAGE_SUFFIX = ".html"


def is_page(rel: str) -> bool:
    """Whether ``rel`` (a path in a store) is a page kept compressed on S3: an ``.html``
    file (a stage's report, a run's trend page)."""
    return rel.endswith(PAGE_SUFFIX)


def gzip_page(data: bytes, level: int = GZIP_LEVEL) -> bytes:
    """``data`` gzip-compressed at ``level``, byte-identical for identical ``data`` (no
    time stamp in the header): a page sent again after a lost answer compares equal."""
    return gzip.compress(data, compresslevel=level, mtime=0)


def is_gzip(data: bytes) -> bool:
    """Whether ``data`` starts like a gzip stream (its magic bytes)."""
    return data[:2] == GZIP_MAGIC


def page_bytes(data: bytes, where: str = "the page") -> bytes:
    """The page as it was written: ``data`` decompressed when it is gzip (a page stored on
    S3 since reports are compressed), else ``data`` as it is (an older, plain page).

    Raises
    ------
    DamagedRecord
        ``data`` starts like gzip but does not decompress (cut short or changed); the
        message names ``where``.
    """
    if not is_gzip(data):
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise DamagedRecord(f"{where} is a damaged gzip stream ({len(data)} bytes): "
                            f"{exc}") from None
