"""Analytic intervals over trials: Student's t for one mean, Welch's t on the log of a ratio of two means.

Trials are the independent unit, and there are few of them (3-5 is typical), so the intervals here are the
ones whose coverage holds at small K under roughly normal trial-to-trial noise; the simulation tests check it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def _special() -> Any:
    # Imported on first use: scipy costs ~0.2 s, which `tokbench --help` should not pay. The ufuncs, not
    # scipy.stats' distribution objects, because verdict simulations call these thousands of times.
    from scipy import special  # type: ignore[import-untyped]

    return special


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile at probability p with df degrees of freedom (df may be fractional or inf)."""
    return float(_special().stdtrit(df, p))


def t_quantiles(p: float, df: np.ndarray) -> np.ndarray:
    return np.asarray(_special().stdtrit(df, p), dtype=float)


def normal_cdf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_special().ndtr(x), dtype=float)


def chi2_quantile(p: float, df: int) -> float:
    """x with P(X <= x) = p for a chi-square with df degrees of freedom."""
    return float(_special().chdtri(df, 1 - p))


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval for the mean; None with fewer than two values."""
    arr = np.asarray(values, dtype=float)
    n = arr.size
    if n < 2:
        return None
    mean = float(arr.mean())
    half = t_quantile(0.5 + confidence / 2, n - 1) * float(arr.std(ddof=1)) / math.sqrt(n)
    return mean - half, mean + half


@dataclass(frozen=True, slots=True)
class RatioInterval:
    """B's mean over A's mean with a confidence interval; `se_log` is the standard error of log(ratio)."""

    ratio: float
    low: float
    high: float
    se_log: float
    df: float


def ratio_interval(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, confidence: float = 0.95
) -> RatioInterval | None:
    """Interval for mean(b) / mean(a), each side's trials independent, variances not assumed equal.

    log(mean_b / mean_a) is roughly normal with variance cv_a²/n_a + cv_b²/n_b (the delta method); its
    standard error gets Welch-Satterthwaite degrees of freedom, and the t interval is mapped back with exp. On
    the log scale a +5% and a -4.8% change are symmetric, and the interval can never cross zero throughput.
    None when a side has fewer than two trials or a non-positive mean (no ratio to speak of).
    """
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    if xa.size < 2 or xb.size < 2:
        return None
    ma, mb = float(xa.mean()), float(xb.mean())
    if ma <= 0 or mb <= 0:
        return None
    va = float(xa.var(ddof=1)) / (xa.size * ma * ma)
    vb = float(xb.var(ddof=1)) / (xb.size * mb * mb)
    var = va + vb
    log_ratio = math.log(mb / ma)
    if (
        var == 0.0
    ):  # identical trials on both sides: the data carry no noise estimate, the interval is a point
        return RatioInterval(mb / ma, mb / ma, mb / ma, 0.0, math.inf)
    df = var * var / (va * va / (xa.size - 1) + vb * vb / (xb.size - 1))
    se = math.sqrt(var)
    half = t_quantile(0.5 + confidence / 2, df) * se
    return RatioInterval(mb / ma, math.exp(log_ratio - half), math.exp(log_ratio + half), se, df)
