"""Rates (``cost=``) that turn the resource-hours a run allocated into an estimated price.

Standard library only: the runner validates ``cost=`` with it in every Dask worker. With no
rate there is no price. Rates are per ``worker_hour``, ``thread_hour`` and ``gib_hour``, for
every worker or by ``resources``, ``workers`` and ``clusters`` patterns: **first match
wins**, in that order (docs/cost.md has the rules and examples)."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, cast

from prefect_dask_profiling.errors import InvalidInput

__all__ = ["ATTRIBUTES", "UNITS", "CostRates", "Rates", "parse_cost"]

UNITS = ("worker_hour", "thread_hour", "gib_hour")
ATTRIBUTES = ("resources", "workers", "clusters")  # first match wins, in this order
_KEYS = (*UNITS, *ATTRIBUTES, "currency")
Rule = tuple[str, "Rates"]


class RatesDoc(TypedDict, total=False):
    """One set of rates as plain data: the units that have a price (:data:`UNITS`)."""

    worker_hour: float
    thread_hour: float
    gib_hour: float


class CostSpec(RatesDoc, total=False):
    """The ``cost=`` option (:func:`parse_cost`): rates for every worker
    (:class:`RatesDoc`), or rates by worker attribute (``workers``: name patterns,
    ``resources``: Dask resource tags, ``clusters``: cluster class names), and the
    ``currency``."""

    currency: str
    workers: dict[str, RatesDoc]
    resources: dict[str, RatesDoc]
    clusters: dict[str, RatesDoc]


@dataclass(frozen=True)
class Rates:
    """Price per unit-hour of one kind of worker (``None``: that unit is not priced)."""

    worker_hour: float | None = None
    thread_hour: float | None = None
    gib_hour: float | None = None

    def price(self, worker_s: float, thread_s: float, gib_s: float) -> float:
        """The price of ``worker_s`` worker-, ``thread_s`` thread- and ``gib_s``
        GiB-seconds at these rates."""
        total = 0.0
        for rate, seconds in ((self.worker_hour, worker_s), (self.thread_hour, thread_s),
                              (self.gib_hour, gib_s)):
            if rate is not None:
                total += rate * seconds / 3600.0
        return total

    def describe(self, currency: str) -> str:
        """``0.12 USD per worker-hour + ...``, the priced units only."""
        parts = [f"{rate:g} {currency} per {unit.replace('_', '-')}"
                 for unit, rate in zip(UNITS, (self.worker_hour, self.thread_hour,
                                               self.gib_hour), strict=True)
                 if rate is not None]
        return " + ".join(parts)


@dataclass(frozen=True)
class CostRates:
    """The rates of ``cost=``: one set for every worker, or rates by worker attribute.

    Attributes
    ----------
    default
        Rates of every worker when no attribute rules are given.
    by_resource, by_name, by_cluster
        ``(pattern, rates)`` pairs by resource tag, worker name and cluster class name
        (``fnmatch``), tried in that order, each in the order given: the first match wins;
        a worker nothing matches is not priced.
    cluster
        The run's cluster class name that ``by_cluster`` is matched against (set by the
        runner, :meth:`with_cluster`); ``None``: unknown, no cluster rule matches.
    currency
        A label shown next to every price.
    """

    default: Rates | None = None
    by_name: tuple[Rule, ...] = field(default_factory=tuple)
    currency: str = "USD"
    by_resource: tuple[Rule, ...] = field(default_factory=tuple)
    by_cluster: tuple[Rule, ...] = field(default_factory=tuple)
    cluster: str | None = None

    @property
    def by_attribute(self) -> bool:
        """Whether the rates go by worker attribute (some workers may be unpriced)."""
        return bool(self.by_resource or self.by_name or self.by_cluster)

    def with_cluster(self, cluster: str | None) -> CostRates:
        """The same rates, their cluster rules matched against ``cluster``."""
        return replace(self, cluster=cluster)

    def rule_for(self, name: str, resources: Mapping[str, float] | None = None
                 ) -> tuple[str, str, Rates] | None:
        """The rule that prices a worker: ``(attribute, pattern, rates)``; ``None``: none."""
        held = [tag for tag, amount in (resources or {}).items() if _positive(amount)]
        for pattern, rates in self.by_resource:
            if any(fnmatch.fnmatchcase(tag, pattern) for tag in held):
                return "resources", pattern, rates
        for pattern, rates in self.by_name:
            if fnmatch.fnmatchcase(name, pattern):
                return "workers", pattern, rates
        if self.cluster is not None:
            for pattern, rates in self.by_cluster:
                if fnmatch.fnmatchcase(self.cluster, pattern):
                    return "clusters", pattern, rates
        return None

    def rates_for(self, name: str, resources: Mapping[str, float] | None = None
                  ) -> Rates | None:
        """The rates of the worker called ``name`` holding ``resources`` (``None``: not
        priced)."""
        if not self.by_attribute:
            return self.default
        rule = self.rule_for(name, resources)
        return rule[2] if rule is not None else None

    def unpriced(self, workers: Iterable[str | tuple[str, Mapping[str, float] | None]]
                 ) -> list[str]:
        """The names among ``workers`` (names, or ``(name, resources)`` pairs) that no rate
        covers, sorted."""
        return sorted({n for n, res in map(_pair, workers) if self.rates_for(n, res) is None})

    def unmatched(self, workers: Iterable[str | tuple[str, Mapping[str, float] | None]]
                  ) -> list[str]:
        """The rules (``workers 'gpu-*'``...) that priced none of ``workers``, in order."""
        used = {rule[:2] for rule in (self.rule_for(n, res) for n, res in map(_pair, workers))
                if rule is not None}
        return [f"{attribute} {pattern!r}" for attribute, rules in self._rules()
                for pattern, _ in rules if (attribute, pattern) not in used]

    def warnings(self, workers: Iterable[str | tuple[str, Mapping[str, float] | None]]
                 ) -> list[str]:
        """What to tell the user about ``workers`` (the first stage's): the workers no rate
        prices, and the rules that matched none of them."""
        if not self.by_attribute:
            return []
        workers = list(workers)
        out = []
        unpriced = self.unpriced(workers)
        if unpriced:
            out.append(f"cost: no rate ({self.describe()}) matches worker(s) "
                       f"{', '.join(unpriced)}: they are not priced, the run's cost leaves "
                       "them out")
        unused = self.unmatched(workers)
        if unused:
            where = f" (cluster class {self.cluster!r})" if self.by_cluster else ""
            out.append(f"cost: {', '.join(unused)} matched no worker{where}")
        return out

    def _rules(self) -> list[tuple[str, tuple[Rule, ...]]]:
        return [("resources", self.by_resource), ("workers", self.by_name),
                ("clusters", self.by_cluster)]

    def describe(self) -> str:
        """The rates in words, for the artifact and the CLI (say which rate was used)."""
        if not self.by_attribute:
            return self.default.describe(self.currency) if self.default else "none"
        return "; ".join(f"{attribute} {pattern!r}: {rates.describe(self.currency)}"
                         for attribute, rules in self._rules() for pattern, rates in rules)

    def to_dict(self) -> dict[str, Any]:
        """The rates as plain data, stored with a priced run (its allocation's ``rates``) so
        a price can be recomputed: ``currency``, ``default``, ``by_name`` and ``text``; each
        rule is ``[pattern, rates]``; ``by_resource``, ``by_cluster`` and ``cluster`` only
        when given."""
        def plain(rates: Rates | None) -> RatesDoc | None:
            if rates is None:
                return None
            return cast(RatesDoc, {u: getattr(rates, u) for u in UNITS
                                   if getattr(rates, u) is not None})

        out: dict[str, Any] = {"currency": self.currency, "default": plain(self.default),
                               "by_name": [[p, plain(r)] for p, r in self.by_name],
                               "text": self.describe()}
        if self.by_resource:
            out["by_resource"] = [[p, plain(r)] for p, r in self.by_resource]
        if self.by_cluster:
            out["by_cluster"] = [[p, plain(r)] for p, r in self.by_cluster]
            out["cluster"] = self.cluster
        return out


def _positive(amount: object) -> bool:
    return isinstance(amount, int | float) and not isinstance(amount, bool) and amount > 0


def _pair(worker: str | tuple[str, Mapping[str, float] | None]
          ) -> tuple[str, Mapping[str, float] | None]:
    return (worker, None) if isinstance(worker, str) else (worker[0], worker[1])


def _rate(value: object, key: str) -> float:
    """A rate: a finite real number >= 0, else :class:`InvalidInput` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"cost[{key!r}] must be a number (a price per unit-hour), "
                           f"got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"cost[{key!r}] must be a finite number >= 0, got {value!r}")
    return float(value)


def _rates(spec: Mapping[str, Any], where: str) -> Rates:
    """The unit rates in ``spec`` (a mapping of unit to rate); ``where`` prefixes keys."""
    unknown = [k for k in spec if k not in UNITS]
    if unknown:
        raise InvalidInput(f"cost: unknown unit {where}{unknown[0]!r}; the units are "
                           f"{', '.join(UNITS)}")
    if not spec:
        raise InvalidInput(f"cost{'[' + where.rstrip('.') + ']' if where else ''}: give at "
                           f"least one rate ({', '.join(UNITS)})")
    return Rates(**{unit: _rate(value, f"{where}{unit}") for unit, value in spec.items()})


def parse_cost(cost: Mapping[str, Any] | CostRates | None) -> CostRates | None:
    """Validate ``cost=`` and return its :class:`CostRates` (``None``: nothing priced).

    Raises
    ------
    InvalidInput
        A ``ValueError`` naming the key: an unknown key or unit, a rate that is negative or
        not a number, a pattern mapping that is not a mapping of patterns to rates.
    """
    if cost is None or isinstance(cost, CostRates):
        return cost
    if not isinstance(cost, Mapping):
        raise InvalidInput(f"cost must be a mapping of unit to rate, got {cost!r}")
    unknown = [k for k in cost if k not in _KEYS]
    if unknown:
        raise InvalidInput(f"cost: unknown key or unit {unknown[0]!r}; allowed: "
                           f"{', '.join(_KEYS)}")
    currency = cost.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise InvalidInput(f"cost['currency'] must be a non-empty string, got {currency!r}")
    units = {k: v for k, v in cost.items() if k in UNITS}
    given = [k for k in ATTRIBUTES if cost.get(k) is not None]
    if given and units:
        raise InvalidInput(f"cost: give either rates for every worker or rates by "
                           f"{' / '.join(given)}, not both; got {sorted(units)} (add a "
                           "'*' pattern for the other workers)")
    if not given:
        return CostRates(default=_rates(units, ""), currency=currency)
    rules = {key: _rules(cost[key], key) for key in given}
    return CostRates(by_name=rules.get("workers", ()), by_resource=rules.get("resources", ()),
                     by_cluster=rules.get("clusters", ()), currency=currency)


def _rules(patterns: object, key: str) -> tuple[Rule, ...]:
    """The ``(pattern, rates)`` pairs of ``cost[key]``, a mapping of patterns to rates."""
    what = {"workers": "worker name patterns", "resources": "resource tags",
            "clusters": "cluster class names"}[key]
    if not isinstance(patterns, Mapping) or not patterns:
        raise InvalidInput(f"cost[{key!r}] must map {what} to rates, got {patterns!r}")
    out = []
    for pattern, spec in patterns.items():
        if not isinstance(pattern, str) or not pattern or not isinstance(spec, Mapping):
            raise InvalidInput(f"cost[{key!r}][{pattern!r}] must be a mapping of unit to "
                               f"rate, got {spec!r}")
        out.append((pattern, _rates(spec, f"{key}.{pattern}.")))
    return tuple(out)
