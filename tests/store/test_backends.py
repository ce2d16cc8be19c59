"""Store backends: one class per kind of storage, chosen once from the URL's protocol.

No server: an S3 store's filesystem is built without a request, a local and a
``memory://`` store are used for real, and a backend of a test's own is added by its one
line in ``BACKENDS`` (what docs/architecture.md says adding a backend takes).
"""

from __future__ import annotations

import pytest

from prefect_dask_profiling.store import layout
from prefect_dask_profiling.store.backends import BACKENDS, FsspecBackend, LocalBackend, S3Backend
from prefect_dask_profiling.store.backends.base import Backend, FileInfo
from prefect_dask_profiling.store.runs import RunStore


@pytest.mark.parametrize(("url", "backend", "kind"), [
    ("{tmp}/store", LocalBackend, "local"),
    ("file://{tmp}/store", LocalBackend, "local"),
    ("s3://bucket/prefix", S3Backend, "s3"),
    ("s3a://bucket/prefix", S3Backend, "s3"),
    ("memory://backend-test", FsspecBackend, "memory"),
])
def test_the_protocol_chooses_the_backend(tmp_path, url, backend, kind):
    store = RunStore(url.format(tmp=tmp_path), {}, spool_dir=tmp_path / "spool")
    assert type(store.backend) is backend and store.kind == kind
    assert (store.fs, store.root, store.url) == (store.backend.fs, store.backend.root,
                                                 store.backend.url)
    with pytest.raises(AttributeError):
        store.kind = "s3"  # read-only: the backend says what it is


def test_only_s3_keeps_lifecycle_rules_and_signs_links(tmp_path):
    local = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    assert local.backend.lifecycle(30) is None and local.ensure_lifecycle(30) is None
    assert local.backend.link_expiry(120) is None
    s3 = RunStore("s3://bucket/pfx", {}, spool_dir=tmp_path / "spool")
    plan = s3.backend.lifecycle(30)
    assert plan is not None and (plan.container, plan.expiring) == ("bucket", "pfx/reports/")
    assert s3.backend.link_expiry(10**9) == 7 * 24 * 3600


class TracingBackend(Backend):
    """A backend of this test's own: fsspec's defaults, every ``find`` noted."""

    name = "tracing"
    found: list[str] = []

    def find(self, rel: str) -> dict[str, FileInfo]:
        TracingBackend.found.append(rel)
        return super().find(rel)


def test_a_new_backend_is_its_class_and_one_mapping_line(tmp_path, monkeypatch):
    monkeypatch.setitem(BACKENDS, "memory", TracingBackend)
    store = RunStore("memory://tracing-test", spool_dir=tmp_path / "spool")
    assert isinstance(store.backend, Backend) and store.kind == "tracing"
    store._put(layout.fleet_file("ndvi", "20260216T020000Z-3faee9"), b"x", False)
    assert list(store._find(layout.FLEET)) == [
        layout.fleet_file("ndvi", "20260216T020000Z-3faee9")]
    assert TracingBackend.found == [layout.FLEET]
