"""The process's one background worker: order, context, drain, periodic jobs, exit."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from prefect_dask_profiling.run.background import Background

marker = contextvars.ContextVar("marker", default="unset")


def test_jobs_run_in_submission_order_on_one_thread():
    service = Background(name="test-order")
    seen: list[tuple[int, str]] = []
    futures = [service.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
               for i in range(20)]
    assert service.drain(timeout=30)
    assert all(f.done() for f in futures)
    assert [i for i, _ in seen] == list(range(20))
    assert {name for _, name in seen} == {"test-order"}


def test_a_job_sees_the_submitters_context():
    service = Background()
    token = marker.set("flow-run-1")
    try:
        future = service.submit(marker.get)
    finally:
        marker.reset(token)
    assert future.result(timeout=30) == "flow-run-1"


def test_a_failing_job_keeps_its_exception_and_the_queue_goes_on():
    service = Background()

    def boom() -> None:
        raise RuntimeError("report not drawn")

    failed = service.submit(boom)
    after = service.submit(lambda: "next")
    assert after.result(timeout=30) == "next"
    with pytest.raises(RuntimeError, match="report not drawn"):
        failed.result(timeout=0)


def test_drain_is_bounded_and_says_what_is_left(caplog):
    service = Background()
    release = threading.Event()
    service.submit(release.wait, 30, label="slow report")
    service.submit(lambda: None, label="queued link")
    assert not service.drain(timeout=0.2)
    assert "queued link" in caplog.text
    release.set()
    assert service.drain(timeout=30)
    assert service.pending() == 0


def test_periodic_jobs_repeat_until_cancelled_and_are_not_waited_for():
    service = Background()
    ticks: list[float] = []
    three = threading.Event()

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) >= 3:
            three.set()

    periodic = service.every(0.01, tick, label="eta")
    assert service.drain(timeout=5)  # a periodic job is never waited for
    assert three.wait(timeout=60)
    periodic.cancel()
    service.submit(lambda: None).result(timeout=30)  # a run in progress has finished
    count = len(ticks)
    service.submit(time.sleep, 0.05).result(timeout=30)
    assert len(ticks) <= count + 1  # at most the run queued before the cancel
    assert ticks == sorted(ticks)


def test_a_failing_periodic_job_runs_again():
    service = Background()
    runs: list[int] = []
    twice = threading.Event()

    def flaky() -> None:
        runs.append(1)
        if len(runs) >= 2:
            twice.set()
        raise OSError("store down")

    periodic = service.every(0.01, flaky)
    try:
        assert twice.wait(timeout=60)
    finally:
        periodic.cancel()


@dataclass
class Count:
    """A typed job: counts its runs, says the context it ran in."""

    runs: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    label: ClassVar[str] = "count"

    def run(self) -> int:
        self.runs.append(marker.get())
        if len(self.runs) >= 2:
            self.done.set()
        return len(self.runs)


def test_a_typed_job_runs_in_the_context_it_was_posted_with():
    service = Background(name="test-typed")
    marker.set("caller")
    assert service.post(Count()).result(timeout=30) == 1
    other = contextvars.Context()
    other.run(marker.set, "flow run")
    job = Count()
    service.post(job, context=other).result(timeout=30)
    assert job.runs == ["flow run"]
    marker.set("unset")


def test_a_typed_job_can_repeat_under_its_label():
    service = Background(name="test-typed-every")
    job = Count()
    periodic = service.every(0.01, job)
    try:
        assert job.done.wait(timeout=60) and periodic.label == "count"
    finally:
        periodic.cancel()


@pytest.mark.parametrize("call, message", [
    (lambda s: s.post(lambda: None), r"run\(\) method"),
    (lambda s: s.every(1, "not a job"), "job or a callable"),
    (lambda s: s.every(0, lambda: None), "interval > 0"),
    (lambda s: s.every(-1, lambda: None), "interval > 0"),
    (lambda s: s.drain(timeout=-1), "timeout >= 0"),
    (lambda s: s.submit("not callable"), "callable"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(Background())


def test_one_instance_per_process():
    assert Background.instance() is Background.instance()


def test_the_process_drains_its_queue_at_exit(tmp_path):
    """A flow process that returns while a report is being stored still stores it."""
    out = tmp_path / "stored.txt"
    code = (
        "import time\n"
        "from prefect_dask_profiling.run.background import Background\n"
        "def store():\n"
        "    time.sleep(0.5)\n"
        f"    open({str(out)!r}, 'w').write('report')\n"
        "Background.instance().submit(store)\n"
        "Background.instance().every(0.01, lambda: None)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert out.read_text() == "report"
