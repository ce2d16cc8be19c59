"""The runner's options pass through once (issue 57): built and checked once, read as they are.

``ProfilingOptions`` builds the run's ``Rules`` with itself; its readers (the run's end, the
history read early, the live ETA) take that instance, and a copy made for a store, a
cluster's cost rates or the pickled runner shares it.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import fields, replace

import cloudpickle
import pytest
from helpers.run_records import record_stages

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.options import ProfilingOptions, check_renderer
from prefect_dask_profiling.regression import rule as rule_mod
from prefect_dask_profiling.regression.rule import RegressionRule, Rules
from prefect_dask_profiling.run.pipeline import DEFAULT_OPTIONS, finish_run, read_history_early
from prefect_dask_profiling.store.manifest import RunContext
from prefect_dask_profiling.store.runs import RunStore, new_run_id


def test_the_rules_are_built_with_the_options_and_kept():
    options = ProfilingOptions(threshold=3.0, history=5, check_options={"min_share": 0.0},
                               cost_regression="fail")
    assert options.rules is options.rules
    assert options.rules == Rules(RegressionRule(threshold=3.0, history=5, min_share=0.0,
                                                 cost_regression="fail"))


def test_a_copy_that_leaves_the_rules_alone_shares_them():
    options = ProfilingOptions(check_options={"min_share": 0.0})
    moved = options.evolve(store="memory://elsewhere", storage_options=None)
    assert moved.store == "memory://elsewhere" and moved.rules is options.rules
    assert options.store is None  # the original is untouched (frozen)
    again = pickle.loads(cloudpickle.dumps(options))
    assert again == options and again.rules == options.rules


def test_a_copy_that_changes_the_rules_builds_and_checks_them_again():
    options = ProfilingOptions()
    stricter = options.evolve(threshold=4.0)
    assert stricter.rules.regression.threshold == 4.0 and options.rules.regression.threshold == 2.0
    with pytest.raises(InvalidInput, match="threshold"):
        options.evolve(threshold=0.5)
    with pytest.raises(InvalidInput, match="no field"):
        options.evolve(renderer="flow")
    assert replace(options, history=3).rules.regression.history == 3


def test_the_check_options_given_are_copied_not_shared():
    given = {"min_share": 0.0}
    options = ProfilingOptions(check_options=given)
    given["min_share"] = 0.5  # the caller's dict changes later: the options do not
    assert options.check_options == {"min_share": 0.0}
    assert options.rules.regression.min_share == 0.0


def test_the_renderer_is_no_option_and_only_flow_is_taken():
    assert "report_renderer" not in {f.name for f in fields(ProfilingOptions)}
    assert check_renderer("flow") == "flow"
    with pytest.raises(InvalidInput, match="report_renderer='dask' was removed"):
        check_renderer("dask")
    with pytest.raises(InvalidInput, match="report_renderer must be one of"):
        check_renderer(None)
    with pytest.raises(TypeError):
        ProfilingOptions(report_renderer="flow")  # type: ignore[call-arg]


def test_a_run_is_judged_by_the_rules_of_its_options_built_no_other_time(
        inproc_client, tmp_path, monkeypatch):
    options = ProfilingOptions(on_regression="warn", check_options={"min_share": 0.0})
    built: list[tuple] = []
    for cls in (rule_mod.Rules, rule_mod.RegressionRule):
        original = cls.from_options.__func__

        def counting(klass, *args, _original=original, **kwargs):
            built.append(args)
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_options", classmethod(counting))
    store = RunStore(str(tmp_path / "store"), spool_dir=tmp_path / "spool")
    record = record_stages(inproc_client, {"read": 200})
    ctx = RunContext(run_id=new_run_id(), pipeline="nightly", version="1")
    early = read_history_early(RunStore(store.url), ctx, options.rules)
    result = finish_run(store, record, ctx, [], options, early_history=early)
    assert result.judged and result.judgement.rules is options.rules
    assert result.manifest["history_read"]["when"] == "run start"  # the same rules: kept
    assert built == []  # neither the history read nor the judgement built rules again


def test_finish_run_without_options_leaves_the_failure_to_the_caller():
    assert DEFAULT_OPTIONS.on_regression == "warn"
    assert DEFAULT_OPTIONS.rules == ProfilingOptions().rules


def test_the_runner_takes_every_option_as_a_keyword_with_its_default():
    """A new option is a field of ``ProfilingOptions`` only: the runner's signature lists
    it with the same name and default, and the runner passes it on without naming it."""
    import inspect

    from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner

    parameters = inspect.signature(ProfiledDaskTaskRunner).parameters
    keywords = {name: p.default for name, p in parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}
    defaults = {f.name: (f.default if f.default_factory is dataclasses.MISSING
                         else f.default_factory()) for f in fields(ProfilingOptions)}
    assert keywords == {**defaults, "profiling": None, "report_renderer": "flow"}
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    assert parameters["threshold"].annotation == "float"
    assert parameters["cost"].annotation == "CostSpec | None"  # what a caller gives
    runner = ProfiledDaskTaskRunner(threshold=3.0, check_options={"min_share": 0.0},
                                    otel="off", eta_interval=60.0)
    assert runner.profiling == ProfilingOptions(threshold=3.0, check_options={"min_share": 0.0},
                                                otel="off", eta_interval=60.0)
    assert ProfiledDaskTaskRunner(check_options=None).profiling == ProfilingOptions()


def test_a_misspelt_option_is_refused_naming_it_and_the_option_it_looks_like():
    from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner

    with pytest.raises(InvalidInput, match=r"unknown profiling option 'thresold' "
                                           r"\(did you mean 'threshold'\?\)"):
        ProfiledDaskTaskRunner(thresold=3.0)
    with pytest.raises(InvalidInput, match="unknown profiling option 'colour';"):
        ProfilingOptions.from_keywords({"colour": "red"})


def test_options_given_whole_and_as_keywords_are_refused_not_dropped():
    from prefect_dask_profiling.prefect.runner import ProfiledDaskTaskRunner

    with pytest.raises(InvalidInput, match=r"not both: got profiling= and \['threshold'\]"):
        ProfiledDaskTaskRunner(profiling=ProfilingOptions(), threshold=3.0)


def test_the_callers_dicts_are_copied_so_a_later_change_does_not_reach_the_options():
    storage = {"key": "a"}
    check = {"min_share": 0.0}
    options = ProfilingOptions(storage_options=storage, check_options=check)
    storage["key"] = "b"
    check["min_share"] = 0.5
    assert options.storage_options == {"key": "a"}
    assert options.check_options == {"min_share": 0.0}
