"""Small statistics shared by the servers' /stats pages and the benches."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile `q` in [0, 1] of `values` (None when empty); used by /stats and the benches."""
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]
