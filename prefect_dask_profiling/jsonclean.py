"""Make values JSON-clean: no NaN/inf, no numpy scalars, no tuples of NaN."""

from __future__ import annotations

import math
from typing import Any


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
