"""Bad input: names that become storage paths, malformed store content, runner arguments.

Each bad input must get one clear error naming the problem (an ``InvalidInput`` naming the
field, a one-line CLI error with exit code 2) or be skipped by history with a warning —
and nothing may ever be written outside the store's root.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefect_dask_profiling.cli import app
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner
from prefect_dask_profiling.regression.baseline import load_baseline
from prefect_dask_profiling.stages import stage
from prefect_dask_profiling.store.runs import TASKS_COLUMNS, RunStore, new_run_id

pytestmark = pytest.mark.timeout(120)

FIELDS = ("pipeline", "stage", "run_id", "version")
SETTINGS = settings(max_examples=40, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))
SEPARATORS = ["/", "\\", "..", "\x00", ":", "\n", "\t", "\r", "*", "?", "%", "#", "'"]
dangerous_names = st.one_of(
    st.sampled_from(["", " ", ".", "..", "../x", "a/../../b", "/etc/passwd", "C:\\x",
                     "..\\..\\x", ".hidden", "s3://bucket/key", "file:///etc", "x" * 129,
                     " lead", "trail ", "a\u2028b", "a\u00a0b", "%2e%2e%2f", "~/../x"]),
    st.builds(lambda a, sep, b: a + sep + b, st.text(max_size=8),
              st.sampled_from(SEPARATORS), st.text(max_size=8)),
)
TASKS = pd.DataFrame([{"stage": "s", "prefix": "p", "tasks": 1, "total_s": 1.0,
                       "p50_s": 1.0, "p95_s": 1.0, "gb_out": 0.0}], columns=TASKS_COLUMNS)


def names_with(field: str, value: str) -> dict[str, str]:
    names = {"pipeline": "pipe", "stage": "st", "run_id": new_run_id(), "version": "1"}
    names[field] = value
    return names


def write_everything(root: Path, names: dict[str, str]) -> None:
    """Every store write a name reaches: report, run (tables, manifest, index), accept."""
    store = RunStore(str(root), {})
    store.write_report(names["pipeline"], names["run_id"], names["stage"], "<html/>")
    store.write_run(names["pipeline"], names["run_id"], {"tasks": TASKS},
                    {"version": names["version"], "status": "healthy"})
    store.accept(names["pipeline"], names["version"], names["run_id"])


def entry_points(store: RunStore, field: str, names: dict[str, str]) -> list:
    """Every store call that takes ``field``, with the other names valid."""
    p, s, r, v = (names[k] for k in FIELDS)
    calls = {
        "pipeline": [lambda: store.write_report(p, r, s, "<html/>"),
                     lambda: store.write_run(p, r, {"tasks": TASKS}, {"version": v}),
                     lambda: store.accept(p, v, r), lambda: store.list_runs(p),
                     lambda: store.read_manifest(p, r), lambda: store.accepted(p, v)],
        "run_id": [lambda: store.write_report(p, r, s, "<html/>"),
                   lambda: store.write_run(p, r, {"tasks": TASKS}, {"version": v}),
                   lambda: store.accept(p, v, r), lambda: store.read_manifest(p, r)],
        "stage": [lambda: store.write_report(p, r, s, "<html/>")],
        "version": [lambda: store.write_run(p, r, {"tasks": TASKS}, {"version": v}),
                    lambda: store.accept(p, v, r), lambda: store.list_runs(p, v),
                    lambda: store.accepted(p, v)],
    }
    return calls[field]


def files_outside(parent: Path, root: Path) -> list[str]:
    """Anything below ``parent`` that is not inside ``root`` (resolved)."""
    root = root.resolve()
    out = []
    for dirpath, _dirs, files in os.walk(parent):
        for name in files:
            path = Path(dirpath, name).resolve()
            if root not in path.parents:
                out.append(str(path))
    return out


@pytest.mark.parametrize("field", FIELDS)
@SETTINGS
@given(value=dangerous_names)
def test_dangerous_names_get_one_clear_error_naming_the_field(field, value, bad_input):
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(str(Path(tmp, "store")), {})
        for call in entry_points(store, field, names_with(field, value)):
            message = bad_input.expect_error(call, field)
            assert message.split(" ")[0] == field  # the field comes first, then the value
            assert not any(Path(tmp).rglob("*")), "something was written for a rejected name"


@pytest.mark.parametrize("field", FIELDS)
@SETTINGS
@given(value=st.text(max_size=24))
def test_any_name_is_either_rejected_by_field_or_stays_inside_the_root(field, value):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp, "store")
        try:
            write_everything(root, names_with(field, value))
        except ValueError as exc:
            assert str(exc).startswith(field) and "\n" not in str(exc)
        assert files_outside(Path(tmp), root) == []


@SETTINGS
@given(value=dangerous_names)
def test_dangerous_names_are_refused_by_the_runner_and_stage(value, bad_input):
    bad_input.expect_error(lambda: ProfiledDaskTaskRunner(pipeline=value), "pipeline")
    bad_input.expect_error(lambda: ProfiledDaskTaskRunner(version=value), "version")

    def open_stage():
        with stage(value):
            pass

    bad_input.expect_error(open_stage, "stage")


# -- bad runner arguments: a clear error before any cluster starts --------------------------


@pytest.mark.parametrize("kwargs, needle", [
    ({"report_retention_days": -1}, "report_retention_days"),
    ({"report_retention_days": 0}, "report_retention_days"),
    ({"report_retention_days": 1.5}, "report_retention_days"),
    ({"report_retention_days": True}, "report_retention_days"),
    ({"threshold": 1}, "threshold"),
    ({"threshold": 1.0}, "threshold"),
    ({"threshold": 0.5}, "threshold"),
    ({"threshold": -3}, "threshold"),
    ({"threshold": float("nan")}, "threshold"),
    ({"threshold": "2"}, "threshold"),
    ({"on_regression": "explode"}, "on_regression"),
    ({"on_regression": "FAIL"}, "on_regression"),
    ({"on_regression": None}, "on_regression"),
    ({"store": "nosuchproto://bucket/x"}, "unknown protocol 'nosuchproto'"),
    ({"store": "gopher://host/x"}, "unknown protocol 'gopher'"),
    ({"store": ""}, "store"),
    ({"history": 0}, "history"),
    ({"history": -2}, "history"),
    ({"sample_interval": -1}, "sample_interval"),
    ({"store_timeout": 0}, "store_timeout"),
    ({"store_timeout": -1}, "store_timeout"),
    ({"store_timeout": float("inf")}, "store_timeout"),
    ({"storage_options": "key=secret"}, "storage_options"),
    ({"check_options": {"bogus": 1}}, "check_options"),
    ({"check_options": {"z_threshold": -1}}, "z_threshold must be a finite number > 0"),
    ({"check_options": {"min_share": 5}}, "min_share must be a finite number between 0 and 1"),
    ({"check_options": {"min_history": 0}}, "min_history must be a whole number >= 1"),
    ({"check_options": {"min_seconds": -3}}, "min_seconds must be a finite number >= 0"),
    ({"check_options": {"min_history": True}}, "min_history"),
    ({"check_options": {"mad_floor": float("nan")}}, "mad_floor"),
    ({"check_options": "z_threshold=1"}, "check_options must be a dict"),
    ({"address": "tcp://127.0.0.1:1", "cluster_class": "distributed.LocalCluster"},
     "address"),
    ({"address": "tcp://127.0.0.1:1", "cluster_kwargs": {"n_workers": 1}}, "address"),
])
def test_bad_runner_arguments_fail_before_any_cluster_starts(kwargs, needle, bad_input):
    import distributed

    before = set(distributed.core.Server._instances) if hasattr(
        distributed.core.Server, "_instances") else set()
    # an address with cluster arguments is refused by prefect-dask's own runner: a ValueError
    exc = ValueError if "address" in kwargs else InvalidInput
    bad_input.expect_error(lambda: ProfiledDaskTaskRunner(**kwargs), needle, exc=exc)
    after = set(distributed.core.Server._instances) if hasattr(
        distributed.core.Server, "_instances") else set()
    assert after == before  # no scheduler or worker was started


# -- malformed store content -----------------------------------------------------------------

PIPE, VERSION = "malformed", "1"


def _write(store: RunStore, second: int, tasks: pd.DataFrame = TASKS) -> str:
    run_id = new_run_id(datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC))
    store.write_run(PIPE, run_id, {"tasks": tasks},
                    {"version": VERSION, "status": "healthy", "state": "COMPLETED"})
    return run_id


def _run_dir(store: RunStore, run_id: str) -> Path:
    return Path(store.root, "runs", PIPE, run_id)


def _truncated(store, run_id):
    path = _run_dir(store, run_id) / "tasks.csv"
    path.write_bytes(path.read_bytes()[:30])


def _schema(store, run_id):
    path = _run_dir(store, run_id) / "manifest.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "schema_version": 99}))


def _no_manifest(store, run_id):
    (_run_dir(store, run_id) / "manifest.json").unlink()


def _foreign_json(store, run_id):
    (_run_dir(store, run_id) / "manifest.json").write_text('["not", "a", "manifest"]')


def _binary(store, run_id):
    (_run_dir(store, run_id) / "manifest.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")


BROKEN = {  # case: (how the run's tasks table is written, what is then done to the run)
    "truncated CSV": (TASKS, _truncated),
    "manifest of another schema version": (TASKS, _schema),
    "missing columns": (TASKS.drop(columns=["total_s", "p95_s"]), None),
    "NaN in a column": (TASKS.assign(total_s=float("nan")), None),
    "inf in a column": (TASKS.assign(p95_s=float("inf")), None),
    "non-numeric column": (TASKS.assign(tasks="many"), None),
    "run folder without manifest": (TASKS, _no_manifest),
    "manifest that is not ours (JSON list)": (TASKS, _foreign_json),
    "manifest that is not ours (binary)": (TASKS, _binary),
}


@pytest.fixture(scope="module")
def malformed_store(tmp_path_factory) -> tuple[RunStore, str, dict[str, str]]:
    store = RunStore(str(tmp_path_factory.mktemp("malformed") / "store"), {})
    good = _write(store, 0)
    broken = {}
    for second, (case, (tasks, damage)) in enumerate(BROKEN.items(), 1):
        run_id = _write(store, second, tasks)
        if damage is not None:
            damage(store, run_id)
        broken[case] = run_id
    root = Path(store.root)
    (root / "index" / PIPE / VERSION / "README.txt").write_text("not ours")  # unknown status
    (root / "index" / PIPE / VERSION / "junk.healthy").write_bytes(b"")  # empty marker
    (root / "runs" / PIPE / "orphan-without-marker").mkdir(parents=True)
    (root / "runs" / PIPE / "orphan-without-marker" / "tasks.csv").write_text("stage\n")
    return store, good, broken


@pytest.mark.parametrize("case", list(BROKEN))
def test_history_names_each_malformed_run_in_one_line(tmp_path, case, bad_input):
    """A malformed night in the history is left out and named in one line; it costs the
    judgement at most itself (issue 56: it used to stop the judgement of every later
    night)."""
    store = RunStore(str(tmp_path / "store"), {})
    good = _write(store, 0)
    tasks, damage = BROKEN[case]
    run_id = _write(store, 1, tasks)
    if damage is not None:
        damage(store, run_id)
    base = load_baseline(store, PIPE, VERSION, n=20)
    named = [why for run, why in base.skipped if run == run_id]
    clear = len(named) == 1 and "\n" not in named[0] and base.runs == [good]
    bad_input.counted(clear)
    assert clear, (case, base.skipped, base.runs)


def test_history_says_which_index_markers_it_skipped(malformed_store, bad_input, caplog):
    store, good, broken = malformed_store
    with caplog.at_level(logging.WARNING):
        base = load_baseline(store, PIPE, VERSION, n=20)
    assert base.runs == [good] and set(broken.values()) <= {r for r, _ in base.skipped}
    for marker in ("README.txt", "junk.healthy"):
        bad_input.counted(marker in caplog.text)
        assert marker in caplog.text


@pytest.mark.parametrize("case", list(BROKEN))
def test_cli_says_what_is_wrong_in_one_line(malformed_store, case, bad_input):
    store, _good, broken = malformed_store
    result = CliRunner().invoke(app, ["show", broken[case], "--pipeline", PIPE, "--store",
                                      store.url])
    lines = [line for line in result.output.splitlines() if line.strip()]
    clear = (result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
             and broken[case] in lines[0] and "Traceback" not in result.output)
    bad_input.counted(clear)
    assert clear, (result.exit_code, result.output)


@pytest.mark.parametrize("args, needle", [
    (["show", "../../etc", "--pipeline", PIPE], "run_id"),
    (["show", "no-such-run", "--pipeline", PIPE], "no-such-run"),
    (["show", "x", "--pipeline", "nope"], "unknown pipeline 'nope'"),
    (["compare", "a", "b", "--pipeline", PIPE], "not found"),
    (["check", "--pipeline", PIPE, "--run", "{good}", "--threshold", "1"], "threshold"),
    (["check", "--pipeline", PIPE, "--run", "x/y"], "run_id"),
    (["runs", "--pipeline", "../x"], "pipeline"),
    (["accept", "missing", "--pipeline", PIPE], "missing"),
    (["sweep", "--older-than", "-3d"], "--older-than"),
    (["sweep", "--older-than", "soon"], "--older-than"),
    (["report", "r", "../s", "--pipeline", PIPE], "run"),
])
def test_cli_bad_arguments_get_one_line_and_exit_2(malformed_store, args, needle, bad_input):
    store, good, _broken = malformed_store
    args = [a.replace("{good}", good) for a in args]
    result = CliRunner().invoke(app, [*args, "--store", store.url])
    lines = [line for line in result.output.splitlines() if line.strip()]
    clear = (result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
             and needle in lines[0])
    bad_input.counted(clear)
    assert clear, (result.exit_code, result.output)
