"""Rates that turn the resource-hours a run allocated into an estimated price.

Standard library only: the runner validates ``cost=`` with it, and the runner is unpickled in
every Dask worker. With no rate there is no price: the summaries then carry resource-hours
only, never a dollar figure.

A rate is given per unit (``worker_hour``, ``thread_hour``, ``gib_hour``: one worker, one
thread, one GiB of a worker's memory limit, for one hour); units add up. ``workers`` maps a
worker name pattern (``fnmatch``, first match wins) to its own rates, for clusters whose
workers cost different amounts::

    cost={"worker_hour": 0.12}
    cost={"thread_hour": 0.02, "gib_hour": 0.004, "currency": "EUR"}
    cost={"workers": {"gpu-*": {"worker_hour": 2.9}, "*": {"worker_hour": 0.12}}}
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prefect_dask_profiling.errors import InvalidInput

__all__ = ["UNITS", "CostRates", "Rates", "parse_cost"]

UNITS = ("worker_hour", "thread_hour", "gib_hour")
_KEYS = (*UNITS, "workers", "currency")


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
    """The rates of ``cost=``: one set for every worker, or one per worker name pattern.

    Attributes
    ----------
    default
        Rates of every worker when ``by_name`` is empty.
    by_name
        ``(pattern, rates)`` pairs, tried in order on each worker's name (``fnmatch``);
        a worker no pattern matches is not priced.
    currency
        A label shown next to every price.
    """

    default: Rates | None = None
    by_name: tuple[tuple[str, Rates], ...] = field(default_factory=tuple)
    currency: str = "USD"

    def rates_for(self, name: str) -> Rates | None:
        """The rates of the worker called ``name`` (``None``: not priced)."""
        if not self.by_name:
            return self.default
        for pattern, rates in self.by_name:
            if fnmatch.fnmatchcase(name, pattern):
                return rates
        return None

    def unpriced(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that no rate covers, sorted."""
        return sorted({n for n in names if self.rates_for(n) is None})

    def describe(self) -> str:
        """The rates in words, for the artifact and the CLI (say which rate was used)."""
        if not self.by_name:
            return self.default.describe(self.currency) if self.default else "none"
        return "; ".join(f"workers {pattern!r}: {rates.describe(self.currency)}"
                         for pattern, rates in self.by_name)

    def to_dict(self) -> dict[str, Any]:
        """The rates as plain data (stored with the run, so a price can be recomputed)."""
        def plain(rates: Rates | None) -> dict[str, float] | None:
            if rates is None:
                return None
            return {u: getattr(rates, u) for u in UNITS if getattr(rates, u) is not None}

        return {"currency": self.currency, "default": plain(self.default),
                "by_name": [[p, plain(r)] for p, r in self.by_name],
                "text": self.describe()}


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
    patterns = cost.get("workers")
    if patterns is not None and units:
        raise InvalidInput("cost: give either rates for every worker or 'workers' "
                           f"(rates per name pattern), not both; got {sorted(units)}")
    if patterns is None:
        return CostRates(default=_rates(units, ""), currency=currency)
    if not isinstance(patterns, Mapping) or not patterns:
        raise InvalidInput("cost['workers'] must map worker name patterns to rates, "
                           f"got {patterns!r}")
    by_name = []
    for pattern, spec in patterns.items():
        if not isinstance(pattern, str) or not isinstance(spec, Mapping):
            raise InvalidInput(f"cost['workers'][{pattern!r}] must be a mapping of unit to "
                               f"rate, got {spec!r}")
        by_name.append((pattern, _rates(spec, f"workers.{pattern}.")))
    return CostRates(by_name=tuple(by_name), currency=currency)
