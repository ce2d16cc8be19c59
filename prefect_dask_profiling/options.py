"""The runner's options: one frozen :class:`ProfilingOptions`, every check of them, once.

``ProfiledDaskTaskRunner`` builds it from its keyword arguments (or takes it whole as
``profiling=``), validated before any cluster starts, and passes it **as it is** to every
reader: the run's end (:func:`~prefect_dask_profiling.run.pipeline.finish_run`), the Prefect
session, the live ETA. The rules a run is judged by (:attr:`ProfilingOptions.rules`) are
built once, with the options. A new option is a field here (with its check in
``__post_init__``) and a read where it is used.

Standard library only (with the package's own pandas-free checks): the options travel inside
the runner to every Dask worker, which unpickles them around every Prefect task and must not
load pandas or numpy for it (``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from prefect_dask_profiling._util import positive_int, positive_number, validate_name
from prefect_dask_profiling.cost.rates import CostRates, parse_cost
from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.forecast.model import (
    DEFAULT_ETA_INTERVAL_S,
    check_eta_interval,
    check_margin,
    parse_deadline,
)
from prefect_dask_profiling.regression.rule import (
    COST_REGRESSION_MODES,
    CheckOptions,
    RegressionRule,
    Rules,
)
from prefect_dask_profiling.store.url import check_store_url, redacted_options

__all__ = ["COST_REGRESSION", "ON_REGRESSION", "OTEL_MODES", "RENDERERS", "STAGE_REPORTS",
           "ProfilingOptions", "check_otel_mode", "check_renderer", "with_option_keywords"]

ON_REGRESSION = ("fail", "warn")
STAGE_REPORTS = ("auto", True, False)
COST_REGRESSION = COST_REGRESSION_MODES  # ("warn", "fail", "off")
#: The values of the ``otel`` option: ``"auto"`` makes spans when a provider is configured.
OTEL_MODES = ("auto", "off")
#: The report renderers: the flow process draws every report (docs/reports.md).
RENDERERS = ("flow",)
_REMOVED_RENDERERS = {"dask": (
    "report_renderer='dask' was removed: it replaced the scheduler's get_task_stream and "
    "get_profile to bound Dask's own report; reports are drawn in the flow process with "
    "Dask's report builders (docs/reports.md); use report_renderer='flow' (the default)")}
#: The fields the rules are built from (:attr:`ProfilingOptions.rules`).
RULE_FIELDS = frozenset({"threshold", "history", "check_options", "cost_regression"})


def check_otel_mode(mode: object) -> str:
    """``mode`` when it is one of :data:`OTEL_MODES`; else :class:`InvalidInput` naming them.

    Validated with the other options, before any cluster starts.
    """
    if mode not in OTEL_MODES:
        raise InvalidInput(f"otel must be one of {OTEL_MODES}, got {mode!r}")
    return str(mode)


def check_renderer(renderer: object) -> str:
    """``renderer`` if it names a report renderer (``"flow"``, the only one); otherwise
    :class:`InvalidInput` naming the choices, or why a removed renderer went.

    The runner still takes ``report_renderer=`` for the scripts that spell out the default;
    nothing reads it (it is no field of :class:`ProfilingOptions`).
    """
    if isinstance(renderer, str) and renderer in _REMOVED_RENDERERS:
        raise InvalidInput(_REMOVED_RENDERERS[renderer])
    if renderer not in RENDERERS:
        raise InvalidInput(f"report_renderer must be one of {RENDERERS}, got {renderer!r}")
    return str(renderer)


@dataclass(frozen=True)
class ProfilingOptions:
    """What the runner adds to ``DaskTaskRunner``; validated before any cluster starts.

    Parameters
    ----------
    store
        fsspec URL of the run store: a folder, ``s3://bucket/prefix``, any fsspec URL;
        default env ``DASK_PROFILING_STORE``, else ``./.dask-profiling``. A flow parameter
        named ``store`` overrides it (``@profiled``).
    storage_options
        Passed to fsspec/s3fs (e.g. ``endpoint_url``, ``key``/``secret`` for S3); default
        env ``DASK_PROFILING_STORAGE_OPTIONS`` (JSON), else none. ``repr()`` never shows
        their secrets.
    pipeline
        History key; default the flow's name.
    version
        Pipeline version; default the flow's explicit ``@flow(version=...)``, else
        ``"unversioned"``. A new version starts a new baseline. Prefect's automatic source
        hash is recorded (``source_hash``) but does not split the history.
    report_retention_days
        Days per-stage reports are kept: the S3 lifecycle expiry of ``reports/``,
        ``dask-profiling sweep`` locally.
    stage_reports
        ``True`` (default): a Dask performance report for every stage, drawn in the flow
        process from data copied off the scheduler, on a background thread while the next
        stage runs (the flow waits for them only at ``finish()``; docs/reports.md);
        ``"auto"``: a report for each stage that ran at least ``report_min_seconds``, and
        for every stage that regressed or drifted, rendered at ``finish()``; ``False``:
        none. The run's trend page follows: every night with ``True``, otherwise only on a
        night that flags (a healthy night then loads no Bokeh, which a new process pays
        about 1.3 CPU-s for: docs/scaling.md, cold runs).
    report_min_seconds
        In ``"auto"`` mode, the shortest stage (wall seconds) that always gets its report;
        a shorter one that did not regress has a note saying so in the manifest.
    on_regression
        ``"fail"``: the flow run ends **Failed** with ``RegressionDetected`` (its
        ``on_failure`` hooks fire); ``"warn"``: report only.
    retry_on_regression
        ``False`` (default): a regression ends the flow run Failed **without** Prefect's
        flow retries (``@flow(retries=N)`` is for flaky infrastructure; a regression is not
        flaky, and a retry re-runs the whole pipeline). ``True``: a regression fails the
        attempt like any error, and Prefect retries it while retries are left (each
        attempt is stored as a run of its own, with its ``attempt`` in the manifest;
        docs/verdict.md#how-a-run-ends).
    threshold
        Ratio to the baseline median that counts as a regression (> 1).
    history
        How many earlier healthy runs form the baseline.
    sample_interval
        Seconds between worker memory/CPU samples.
    check_options
        The other settings of :class:`~prefect_dask_profiling.regression.rule.RegressionRule`
        by name (``z_threshold``, ``min_seconds``, ``min_share``, ``min_history``, ...); each
        value is checked here.
    store_timeout
        Upper bound in seconds for any one call to the store; when the store does not
        answer, the run's files wait in the local spool (``dask-profiling upload-pending``).
    cost
        Rates that price the resource-hours the cluster allocated (an estimate; see
        docs/cost.md): ``{"worker_hour": 0.12}``, any of ``worker_hour``, ``thread_hour``,
        ``gib_hour`` (and ``currency``), or rates by worker attribute, first match wins:
        ``{"resources": {"GPU": {...}}}`` (a Dask resource tag the worker holds),
        ``{"workers": {"gpu-*": {...}}}`` (its name), ``{"clusters": {"FargateCluster":
        {...}, "*": {...}}}`` (this runner's cluster class)
        (:func:`~prefect_dask_profiling.cost.rates.parse_cost`).
        ``None`` (default): resource-hours only, no price anywhere (docs/cost.md).
    cost_regression
        ``"warn"`` (default): a stage whose idle worker-hours grew against the baseline
        (``threshold`` x its median) is named in the manifest, the artifact and a warning;
        informational, it never fails the run. ``"fail"``: judged like storage requests
        (one night suspected, the next confirms or clears it) and a confirmed idle
        regression is a regression of the run (it fails the flow under
        ``on_regression="fail"``). ``"off"``: not judged (docs/cost.md).
    deadline
        When the run's data must be ready: a time of day with a time zone
        (``"06:00 Europe/Berlin"``: its first occurrence after the flow run's scheduled
        start) or a ``timedelta`` from the scheduled start (``expected_start_time``). The
        live ETA then emits ``dask-profiling.run.at-risk`` / ``on-track`` / ``late``
        (docs/eta.md).
    deadline_margin
        Seconds (or a ``timedelta``) before the deadline the ETA's upper end must stay.
    eta_interval
        Seconds (or a ``timedelta``) between two ETA updates inside a stage (default 30).
    otel
        ``"auto"`` (default): when the flow process has an OpenTelemetry SDK
        ``TracerProvider``, the run's stages become spans under the flow-run span once the
        run is stored (docs/observability.md); without one nothing is built. ``"off"``:
        never.
    """

    store: str | None = None
    storage_options: dict[str, Any] | None = None
    pipeline: str | None = None
    version: str | None = None
    report_retention_days: int = 30
    stage_reports: bool | str = True
    report_min_seconds: float = 20.0
    on_regression: str = "fail"
    retry_on_regression: bool = False
    threshold: float = RegressionRule.threshold
    history: int = RegressionRule.history
    sample_interval: float = 1.0
    check_options: CheckOptions = field(default_factory=CheckOptions)
    store_timeout: float = 10.0
    cost: CostRates | None = field(default=None, metadata={"given": "CostSpec | None"})
    cost_regression: str = "warn"
    deadline: str | timedelta | None = None
    deadline_margin: float | timedelta = 0.0
    eta_interval: float | timedelta = DEFAULT_ETA_INTERVAL_S
    otel: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost", parse_cost(self.cost))
        for name in ("check_options", "storage_options"):  # the caller's dict may change
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, dict(value))
        if self.check_options is None:
            object.__setattr__(self, "check_options", CheckOptions())
        check_otel_mode(self.otel)
        if self.cost_regression not in COST_REGRESSION:
            raise InvalidInput(f"cost_regression must be one of {COST_REGRESSION}, "
                               f"got {self.cost_regression!r}")
        parse_deadline(self.deadline)  # each refused here, naming its option
        check_margin(self.deadline_margin)
        check_eta_interval(self.eta_interval)
        positive_int(self.report_retention_days, "report_retention_days")
        if self.on_regression not in ON_REGRESSION:
            raise InvalidInput(f"on_regression must be one of {ON_REGRESSION}, "
                               f"got {self.on_regression!r}")
        if not isinstance(self.retry_on_regression, bool):
            raise InvalidInput("retry_on_regression must be True or False, "
                               f"got {self.retry_on_regression!r}")
        # threshold, history and check_options are refused here if bad; the rules are built
        # once, here, and travel with the options to every reader (the judge, the history
        # read, the live ETA)
        object.__setattr__(self, "_rules", None)
        self.rules  # noqa: B018 - built (and checked) here
        positive_number(self.sample_interval, "sample_interval (seconds)", allow_zero=True)
        if not any(self.stage_reports is v or self.stage_reports == v == "auto"
                   for v in STAGE_REPORTS):
            raise InvalidInput(f"stage_reports must be one of {STAGE_REPORTS}, "
                               f"got {self.stage_reports!r}")
        positive_number(self.report_min_seconds, "report_min_seconds", allow_zero=True)
        positive_number(self.store_timeout, "store_timeout (seconds)")
        if self.pipeline is not None:
            validate_name(self.pipeline, "pipeline")
        if self.version is not None:
            validate_name(self.version, "version")
        if self.store is not None:
            check_store_url(self.store)
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise InvalidInput("storage_options must be a dict")

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any]) -> ProfilingOptions:
        """The options from a runner's keyword arguments, each checked.

        A name that is no field raises :class:`InvalidInput` naming it and the field it
        most looks like, instead of Python's ``TypeError`` about ``__init__``.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        for name in keywords:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidInput(f"unknown profiling option {name!r}{hint}; the options "
                                   f"are {', '.join(names)}")
        return cls(**keywords)

    def __repr__(self) -> str:
        """Every field, with the credential values of ``storage_options`` as ``***``."""
        fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                           if f.name != "storage_options")
        return (f"ProfilingOptions(storage_options="
                f"{redacted_options(self.storage_options)!r}, {fields})")

    @property
    def rules(self) -> Rules:
        """The rules a run with these options is judged by: built once, when the options
        are (a copy made by :meth:`evolve` shares them)."""
        rules: Rules | None = self.__dict__.get("_rules")
        if rules is None:  # unpickled from a copy that had none: build them this once
            rules = Rules.from_options(self.threshold, self.history, self.check_options,
                                       self.cost_regression)
            object.__setattr__(self, "_rules", rules)
        return rules

    def evolve(self, **changes: Any) -> ProfilingOptions:
        """A copy with ``changes``, for values the caller has already checked (the runner's
        cluster-matched ``cost``, the pickled copy without ``storage_options``, a store URL
        passed through :func:`~prefect_dask_profiling.store.url.check_store_url`).

        The rules already built are kept unless a field they read changes (``threshold``,
        ``history``, ``check_options``, ``cost_regression``): then the copy is built and
        checked anew (:func:`dataclasses.replace`).
        """
        if changes.keys() & RULE_FIELDS:
            return replace(self, **changes)
        unknown = sorted(changes.keys() - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise InvalidInput(f"ProfilingOptions has no field {unknown}")
        new = copy.copy(self)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        return new


def with_option_keywords(function: Any) -> Any:
    """``function`` (taking ``**options``) shown with a keyword per field of
    :class:`ProfilingOptions`, its default and type, in place of ``**options``.

    The runner takes its options as ``**options`` and passes them on as they are, so a new
    option is a field here and nothing in the runner; ``help()``, ``inspect.signature`` and
    the editors that read it still list every option. A field whose value is parsed when
    the options are built shows the type a caller gives (its ``given`` metadata: ``cost``
    takes a :class:`~prefect_dask_profiling.cost.rates.CostSpec` dict).
    """
    own = inspect.signature(function)
    fixed = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    keywords = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                  default=_default(f), annotation=f.metadata.get("given", f.type))
                for f in dataclasses.fields(ProfilingOptions)]
    function.__signature__ = own.replace(parameters=fixed + keywords)
    return function


def _default(option: dataclasses.Field) -> Any:
    """The default of ``option``, made by its factory when it has one."""
    if option.default_factory is not dataclasses.MISSING:
        return option.default_factory()
    return option.default
