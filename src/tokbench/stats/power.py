"""Power: the smallest change K trials per side can detect (MDE), the trials needed for a given change or to
settle an inconclusive verdict, and the A/A calibration that measures the noise floor those rest on.

All on the log scale of the verdicts (intervals.ratio_interval): with per-trial coefficient of variation cv on
each side and n trials per side, log(B/A) has standard error ≈ cv·sqrt(2/n) and n-1 + n-1 degrees of freedom.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tokbench.errors import InsufficientDataError
from tokbench.records import LevelResult, RunResult
from tokbench.stats.drift import trend
from tokbench.stats.intervals import chi2_quantile, normal_cdf, t_quantile, t_quantiles
from tokbench.stats.summary import metric_values

POWER = 0.80
ALPHA = 0.05
MAX_TRIALS = 1000  # beyond this "more than 1000 trials" is the useful answer
_N = np.arange(2, MAX_TRIALS + 1)
_GRID = np.unique(np.round(np.geomspace(2, MAX_TRIALS, 40)).astype(int))


def _z_sum(n: np.ndarray, alpha: float, power: float) -> np.ndarray:
    """t_{1-α/2} + t_{power} at the pooled degrees of freedom of n trials per side."""
    df = 2 * n - 2
    return np.asarray(t_quantiles(1 - alpha / 2, df) + t_quantiles(power, df))


@functools.lru_cache(maxsize=8)
def _z_sum_table(alpha: float, power: float) -> np.ndarray:
    """_z_sum for every n in 2..MAX_TRIALS (the quantiles are the slow part of a verdict)."""
    return _z_sum(_N, alpha, power)


def half_width_pct(cv: float, n_per_side: int, alpha: float = ALPHA) -> float | None:
    """Expected half-width (in %) of the comparison's interval with n trials per side at this CV: an
    equivalence margin below about twice this cannot promise `no_difference` for identical configurations."""
    if n_per_side < 2:
        return None
    t = t_quantile(1 - alpha / 2, 2 * n_per_side - 2)
    return 100 * math.expm1(t * cv * math.sqrt(2 / n_per_side))


def mde_pct(cv: float, n_per_side: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """Smallest true change (in %) that n trials per side detect with probability `power`: the interval
    excludes zero. None for n < 2."""
    if n_per_side < 2:
        return None
    k = float(_z_sum(np.array([n_per_side]), alpha, power)[0])
    return 100 * math.expm1(k * cv * math.sqrt(2 / n_per_side))


def trials_for_change(
    change_pct: float, cv_a: float, cv_b: float | None = None, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """Trials per side so that a true change of `change_pct` gives an interval excluding zero with probability
    `power`. None when more than MAX_TRIALS would be needed (or the change is zero)."""
    cv_b = cv_a if cv_b is None else cv_b
    effect = abs(math.log1p(change_pct / 100))
    if effect == 0:
        return None
    if cv_a == 0 and cv_b == 0:
        return 2
    se = np.sqrt((cv_a**2 + cv_b**2) / _N)
    ok = _z_sum_table(alpha, power) * se <= effect
    return int(_N[ok][0]) if ok.any() else None


def decide_probability(
    delta_pct: float, cv_a: float, cv_b: float, margin_pct: float, n: np.ndarray, alpha: float = ALPHA
) -> np.ndarray:
    """For each n (trials per side): the probability that a comparison reaches a verdict (its interval
    excludes zero, or lies inside ±margin) when the true change is `delta_pct` and the per-trial CVs are
    cv_a, cv_b. The estimate of log(B/A) is taken as normal around the truth and the interval's half-width as
    its expected value (t quantile at Welch's degrees of freedom times the standard error)."""
    var_a, var_b = cv_a**2 / n, cv_b**2 / n
    se = np.sqrt(var_a + var_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(se > 0, (var_a + var_b) ** 2 / ((var_a**2 + var_b**2) / (n - 1)), np.inf)
    h = t_quantiles(1 - alpha / 2, df) * se
    e = math.log1p(delta_pct / 100)
    lo_bound, hi_bound = math.log1p(-margin_pct / 100), math.log1p(margin_pct / 100)

    def mass(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        # P(lo <= estimate <= hi), zero for empty ranges; a zero standard error puts all mass on e.
        with np.errstate(divide="ignore", invalid="ignore"):
            p = normal_cdf((hi - e) / se) - normal_cdf((lo - e) / se)
        point = ((lo <= e) & (e <= hi)).astype(float)
        return np.where(hi >= lo, np.where(se > 0, p, point), 0.0)

    # Inconclusive: the interval holds zero (|estimate| <= h) and reaches past a margin bound.
    whole = mass(-h, h)
    split = mass(-h, np.minimum(h, lo_bound + h)) + mass(np.maximum(-h, hi_bound - h), h)
    inconclusive = np.where(lo_bound + h >= hi_bound - h, whole, split)
    return np.asarray(1.0 - inconclusive)


def trials_to_decide(
    delta_pct: float, cv_a: float, cv_b: float, margin_pct: float, alpha: float = ALPHA, power: float = POWER
) -> int | None:
    """Trials per side that would settle an inconclusive comparison if the observed change and noise are the
    truth: the smallest n whose probability of a verdict (a direction, or no_difference inside ±margin) is at
    least `power`. None when MAX_TRIALS would not do."""
    # Coarse geometric grid first, then every n up to the first grid point that decides: t quantiles at
    # fractional df are slow, and the probability grows with n (more trials, narrower interval).
    ok = decide_probability(delta_pct, cv_a, cv_b, margin_pct, _GRID, alpha) >= power
    if not ok.any():
        return None
    i = int(np.argmax(ok))
    if i == 0:
        return int(_GRID[0])
    fine = np.arange(_GRID[i - 1] + 1, _GRID[i] + 1)
    fine_ok = decide_probability(delta_pct, cv_a, cv_b, margin_pct, fine, alpha) >= power
    return int(fine[np.argmax(fine_ok)])


# ---- calibration from an A/A run ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LevelCalibration:
    """Noise floor of one metric at one level, from K trials against one unchanged server."""

    concurrency: int
    trials: int
    mean: float
    cv_pct: float  # sd / mean across trials, in %
    cv_upper_pct: float | None  # 95% upper confidence bound of the CV (chi-square on the variance)
    half_width_pct: float | None  # expected ± of a comparison's 95% interval with K trials per side
    mde_pct: float | None  # smallest change K trials per side detect at 80% power, alpha 0.05
    detect_pct: float | None  # the change asked about (--detect)
    trials_for_detect: int | None  # trials per side for that change; None: more than MAX_TRIALS
    drift_pct: float | None  # fitted trend over the trials in execution order, first to last (stats.drift)
    drift_significant: bool = False  # that trend passes the drift test: the CV holds a trend, not only noise


def calibrate(
    run: RunResult, metric: str = "agg_tok_s", detect_pct: float | None = None
) -> list[LevelCalibration]:
    """Per level of an A/A run: the CV across trials, the MDE with the same K per side, and the K a
    `detect_pct` change needs. InsufficientDataError when no level has two trials."""
    out = []
    for level in run.levels:
        ordered = metric_values(
            LevelResult(level.concurrency, tuple(sorted(level.trials, key=lambda t: t.order))), metric
        )
        k = len(ordered)
        if k < 2:
            continue
        arr = np.asarray(ordered)
        mean = float(arr.mean())
        sd = float(arr.std(ddof=1))
        cv = sd / mean if mean > 0 else math.inf
        cv_upper = cv * math.sqrt((k - 1) / chi2_quantile(0.05, k - 1)) if mean > 0 else None
        drift = trend(arr)
        out.append(
            LevelCalibration(
                concurrency=level.concurrency,
                trials=k,
                mean=mean,
                cv_pct=100 * cv,
                cv_upper_pct=100 * cv_upper if cv_upper is not None else None,
                half_width_pct=half_width_pct(cv, k) if math.isfinite(cv) else None,
                mde_pct=mde_pct(cv, k) if math.isfinite(cv) else None,
                detect_pct=detect_pct,
                trials_for_detect=(
                    trials_for_change(detect_pct, cv)
                    if detect_pct is not None and math.isfinite(cv)
                    else None
                ),
                drift_pct=drift.change_pct if drift is not None else None,
                drift_significant=drift is not None and drift.significant,
            )
        )
    if not out:
        raise InsufficientDataError(
            f"calibration needs 2+ trials per level with a {metric} value; run with --trials 3 or more"
        )
    return out
