"""Small helpers shared by every part: safe names, positive numbers, JSON-clean values,
shipping a module by value to processes that do not have this package installed, and the
names a package serves on first use."""

from __future__ import annotations

import importlib
import math
import re
import sys
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

from prefect_dask_profiling.errors import InvalidInput

MAX_LENGTH = 128

_ARTIFACT_KEY = re.compile(r"[^a-z0-9]+")


def validate_name(value: object, field: str) -> str:
    """Return ``value`` if it is safe as one path segment, else raise :class:`InvalidInput`.

    Parameters
    ----------
    value
        The candidate name (pipeline, stage, run id, version, ...).
    field
        What the name is, for the error message.

    Raises
    ------
    InvalidInput
        Naming ``field`` and what is wrong with the value.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string, got {type(value).__name__}")
    if not value or not value.strip():
        raise InvalidInput(f"{field} must not be empty")
    if value != value.strip():
        raise InvalidInput(f"{field} must not start or end with whitespace: {value!r}")
    if len(value) > MAX_LENGTH:
        raise InvalidInput(f"{field} is longer than {MAX_LENGTH} characters")
    if any(unicodedata.category(ch)[0] in "CZ" and ch != " " for ch in value):
        raise InvalidInput(f"{field} must not contain control or separator characters: {value!r}")
    if "/" in value or "\\" in value or ":" in value:
        raise InvalidInput(f"{field} must not contain '/', '\\\\' or ':': {value!r}")
    if value in (".", "..") or ".." in value or value.startswith("."):
        raise InvalidInput(f"{field} must not contain '..' or start with '.': {value!r}")
    if any(ch in value for ch in "*?[]{}#%\"'<>|"):
        raise InvalidInput(f"{field} must not contain glob or URL special characters: {value!r}")
    return value


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from ``parts``."""
    key = "-".join(_ARTIFACT_KEY.sub("-", p.lower()).strip("-") for p in parts if p)
    key = re.sub(r"-{2,}", "-", key).strip("-")
    return key or "dask-profiling"


def positive_int(value: object, field: str, *, minimum: int = 1) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) of at least ``minimum``.

    Raises
    ------
    InvalidInput
        Naming ``field`` and the allowed range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{field} must be an integer >= {minimum}, got {value!r}")
    return value


def positive_number(value: object, field: str, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float if it is a finite real number > 0 (>= 0 with ``allow_zero``).

    Raises
    ------
    InvalidInput
        Naming ``field`` and the allowed range.
    """
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise InvalidInput(f"{field} must be a finite number {bound}, got {value!r}")
    return float(value)


def finite_number(value: Any, *, minimum: float | None = None) -> float | None:
    """``value`` as a float when it is a finite real number (at least ``minimum``), else None.

    For figures read from stored JSON and tables, where a value may be missing, text, a
    ``bool``, NaN or infinite: each of these is "no number" (``None``).
    """
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number) or (minimum is not None and number < minimum):
        return None
    return number


def float_or_nan(value: Any) -> float:
    """``float(value)``, NaN when it is not a number; infinities are kept (a ratio from 0)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def ship_by_value(*module_names: str) -> None:
    """Pickle the named (already imported) modules by value.

    Code that runs inside a scheduler or worker we do not control must not need this
    package installed there; cloudpickle then sends the functions' code along.
    """
    import cloudpickle

    registered = cloudpickle.list_registry_pickle_by_value()
    for name in module_names:
        if name not in registered:
            cloudpickle.register_pickle_by_value(sys.modules[name])


def json_clean(value: Any) -> Any:
    """Recursively turn ``value`` into plain JSON data.

    Non-finite floats become ``None``, numpy scalars become Python scalars, tuples and
    sets become lists, timestamps become ISO strings.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_clean(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):  # numpy / pandas scalars
        try:
            return json_clean(item())
        except (TypeError, ValueError):
            pass
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover
        pass
    return str(value)


def lazy_exports(module: str, homes: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` (PEP 562) for ``module`` that serve each name of
    ``homes`` from its home module (absolute, or relative to ``module``: ``".runs"``) on
    first use, so importing ``module`` imports none of them.

    ``module`` stays a plain :class:`types.ModuleType` (cloudpickle pickles only those by
    reference), and its ``dir()`` lists the names as if they were there.
    """
    def __getattr__(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name], module), name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[module]), *homes})

    return __getattr__, __dir__
