"""stage(): name validation, annotations, nesting and listener hooks (no cluster needed).

Attribution of real work to stages on a cluster is tested in test_plugin.py.
"""

from __future__ import annotations

from typing import Any

import dask
import pytest

from prefect_dask_profiling.stages import (
    StageAnnotations,
    current_stage,
    reset_listener,
    running_task_annotations,
    running_task_key,
    set_listener,
    stage,
    use_listener,
)
from prefect_dask_profiling.timing.plugin import DEFAULT_STAGE, RUN_ANNOTATION, STAGE_ANNOTATION


class Recorder:
    """A StageListener that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def stage_opened(self, name: str) -> Any:
        self.calls.append(("opened", name, dict(dask.get_annotations())))
        return f"token-{name}"

    def stage_closed(self, name: str, token: Any, error: BaseException | None) -> None:
        self.calls.append(("closed", name, token, error))


@pytest.mark.parametrize("name", ["", "  ", "a/b", "..", ".hidden", "x:y", "a\nb", " pad",
                                  "star*", "run", 3, None])
def test_invalid_names_raise_naming_stage(name) -> None:
    with pytest.raises(ValueError, match="stage"):
        with stage(name):
            pass


def test_invalid_name_does_not_call_listener() -> None:
    rec = Recorder()
    with use_listener(rec), pytest.raises(ValueError):
        with stage("a/b"):
            pass
    assert rec.calls == []


def test_annotations_and_current_stage_nest_and_restore() -> None:
    assert current_stage() == DEFAULT_STAGE
    with stage("read") as name:
        assert name == "read"
        assert current_stage() == "read"
        assert dask.get_annotations()[STAGE_ANNOTATION] == "read"
        with stage("inner"):
            assert current_stage() == "inner"
            assert dask.get_annotations()[STAGE_ANNOTATION] == "inner"
        assert current_stage() == "read"
        assert dask.get_annotations()[STAGE_ANNOTATION] == "read"
    assert current_stage() == DEFAULT_STAGE
    assert STAGE_ANNOTATION not in dask.get_annotations()


def test_current_stage_reads_a_plain_annotation() -> None:
    with dask.annotate(stage="outer"):
        assert current_stage() == "outer"


def test_stage_opens_a_dask_span() -> None:
    with stage("spanned"):
        assert dask.get_annotations()["span"]["name"][-1] == "spanned"


def test_run_tag_is_inherited() -> None:
    with stage("plain"):
        assert RUN_ANNOTATION not in dask.get_annotations()
    with dask.annotate(**{RUN_ANNOTATION: "task-timings-abc"}), stage("tagged"):
        assert dask.get_annotations()[RUN_ANNOTATION] == "task-timings-abc"


def test_running_task_annotations_outside_a_worker() -> None:
    assert running_task_annotations() == {}
    assert running_task_key() is None


def _running_key_and_annotations(x: int) -> tuple:
    return running_task_key(), running_task_annotations().get(STAGE_ANNOTATION)


def test_running_task_key_and_annotations_inside_a_worker_task() -> None:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        with dask.annotate(**{STAGE_ANNOTATION: "inside"}):
            future = client.submit(_running_key_and_annotations, 1, key="probe-key-1")
        assert future.result() == ("probe-key-1", "inside")


def test_listener_is_told_about_open_and_close() -> None:
    rec = Recorder()
    token = set_listener(rec)
    try:
        with stage("a"):
            with stage("b"):
                pass
    finally:
        reset_listener(token)
    assert [c[:3] if c[0] == "closed" else c[:2] for c in rec.calls] == [
        ("opened", "a"), ("opened", "b"), ("closed", "b", "token-b"), ("closed", "a", "token-a")]
    # the annotation is already active when the listener hears about the stage
    assert rec.calls[0][2][STAGE_ANNOTATION] == "a"
    assert all(c[3] is None for c in rec.calls if c[0] == "closed")
    with stage("after-reset"):
        pass
    assert len(rec.calls) == 4


def test_listener_sees_the_error_and_it_propagates() -> None:
    rec = Recorder()
    with use_listener(rec), pytest.raises(KeyError, match="boom"):
        with stage("failing"):
            raise KeyError("boom")
    closed = rec.calls[-1]
    assert closed[:3] == ("closed", "failing", "token-failing")
    assert isinstance(closed[3], KeyError)
    assert current_stage() == DEFAULT_STAGE


def test_no_listener_is_fine() -> None:
    with use_listener(None), stage("quiet"):
        assert current_stage() == "quiet"


def test_stage_annotations_keys_are_the_plugin_constants() -> None:
    """The typed annotation keys are the names the scheduler plugin reads."""
    assert set(StageAnnotations.__annotations__) == {STAGE_ANNOTATION, RUN_ANNOTATION}
