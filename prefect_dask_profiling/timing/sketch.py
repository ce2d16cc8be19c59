"""A small mergeable quantile sketch with a bounded relative error.

Log-spaced buckets in the style of DDSketch: a value ``x`` lands in bucket
``ceil(log(x) / log(gamma))`` with ``gamma = (1 + alpha) / (1 - alpha)``, and every
quantile read back is within ``alpha`` (relative) of a value of the sample at that rank.
Memory depends on the spread of the values (about 230 buckets per decade at the default
``alpha``), never on how many were added. Stdlib only: it runs inside the scheduler.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefect_dask_profiling.timing.types import SketchData

DEFAULT_ALPHA = 0.005
_ZERO = 1e-9


class QuantileSketch:
    """Mergeable quantile sketch with relative error ``alpha``.

    Parameters
    ----------
    alpha
        Relative accuracy of every quantile, e.g. ``0.005`` for 0.5%.
    """

    __slots__ = ("alpha", "_log_gamma", "counts", "zeros", "n")

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        self.alpha = alpha
        self._log_gamma = math.log((1 + alpha) / (1 - alpha))
        self.counts: dict[int, int] = {}
        self.zeros = 0
        self.n = 0

    def add(self, x: float) -> None:
        """Add one non-negative value (negative values count as zero)."""
        self.n += 1
        if x <= _ZERO:
            self.zeros += 1
            return
        i = math.ceil(math.log(x) / self._log_gamma)
        counts = self.counts
        counts[i] = counts.get(i, 0) + 1

    def merge(self, other: QuantileSketch) -> None:
        """Fold ``other`` (same ``alpha``) into this sketch."""
        if other.alpha != self.alpha:
            raise ValueError("cannot merge sketches with different alpha")
        self.n += other.n
        self.zeros += other.zeros
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c

    def quantile(self, q: float) -> float:
        """The value at quantile ``q`` (nearest rank), ``nan`` when empty."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        if self.n == 0:
            return math.nan
        rank = q * (self.n - 1)
        seen = self.zeros
        if rank < seen:
            return 0.0
        gamma = math.exp(self._log_gamma)
        for i in sorted(self.counts):
            seen += self.counts[i]
            if rank < seen:
                return 2 * gamma**i / (gamma + 1)
        return 2 * gamma ** max(self.counts) / (gamma + 1)

    def to_dict(self) -> SketchData:
        """Plain-data form (msgpack and JSON friendly)."""
        return {"alpha": self.alpha, "zeros": self.zeros, "n": self.n,
                "counts": [[i, c] for i, c in self.counts.items()]}

    @classmethod
    def from_dict(cls, data: SketchData) -> QuantileSketch:
        """Inverse of :meth:`to_dict`."""
        sketch = cls(data["alpha"])
        sketch.zeros = int(data["zeros"])
        sketch.n = int(data["n"])
        sketch.counts = {int(i): int(c) for i, c in data["counts"]}
        return sketch
