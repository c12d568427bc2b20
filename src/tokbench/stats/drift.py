"""Drift within one side's trials: a least-squares trend of log(value) over trial order, tested by the t of
its slope. A server that warms up, throttles or shares its machine moves its figures along the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokbench.stats.intervals import t_quantile

DRIFT_ALPHA = 0.01  # strict: this is a warning on every compared level and side, not a verdict
MIN_TRIALS = 4  # a trend through 3 points has one degree of freedom: no test worth printing


@dataclass(frozen=True, slots=True)
class Trend:
    change_pct: float  # along the fitted trend, from the first trial to the last
    significant: bool  # the slope's two-sided t test rejects "no trend" at DRIFT_ALPHA


def trend(values: Sequence[float] | np.ndarray, alpha: float = DRIFT_ALPHA) -> Trend | None:
    """The trend of positive per-trial values in execution order; None with fewer than MIN_TRIALS."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n < MIN_TRIALS or not np.all(np.isfinite(v) & (v > 0)):
        return None
    y = np.log(v)
    x = np.arange(n, dtype=float) - (n - 1) / 2
    slope = float(x @ (y - y.mean()) / (x @ x))
    resid = y - y.mean() - slope * x
    se = math.sqrt(float(resid @ resid) / (n - 2) / float(x @ x))
    t_crit = t_quantile(1 - alpha / 2, n - 2)
    significant = abs(slope) > t_crit * se if se > 0 else slope != 0
    return Trend(100 * math.expm1(slope * (n - 1)), significant)
