"""Measured-to-bound ratios and the checks.json entry they make.

An upper bound holds when measured / bound <= 1, a lower bound (all of ours are >= 0) when
bound / measured <= 1. ATOL enters the
denominator so that a ratio stays <= 1 when both sides vanish together (a deterministic simulator gives zero
bias and a zero bound): ratio <= 1 then means measured <= bound + ATOL, ATOL being float64 round-off on
quantities of order dr = 1. An entry holds when its largest ratio is <= 1 + RTOL and every claim is true.
"""

from __future__ import annotations

from typing import Any

import numpy as np

ATOL = 1e-12
RTOL = 1e-9


def upper_ratio(measured, bound) -> np.ndarray:
    return np.asarray(measured) / (np.asarray(bound) + ATOL)


def lower_ratio(bound, measured) -> np.ndarray:
    """bound / measured for a bound >= 0; +inf where measured <= -ATOL (the bound then fails)."""
    measured = np.asarray(measured) + ATOL
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(measured > 0, np.asarray(bound) / measured, np.inf)


def max_ratio(ratios, where=True) -> float:
    """Largest ratio over the entries selected by `where` (-inf if none is)."""
    return float(np.max(np.where(where, ratios, -np.inf)))


def entry(ratio: float, instances: int, claims: dict[str, bool] | None = None,
          **details: Any) -> dict[str, Any]:
    """{"instances", "max_ratio", "holds", "claims", ...details} for checks.json."""
    claims = {name: bool(ok) for name, ok in (claims or {}).items()}
    holds = ratio <= 1.0 + RTOL and all(claims.values())
    return {"instances": instances, "max_ratio": ratio, "holds": bool(holds), "claims": claims, **details}
