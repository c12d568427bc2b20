"""Power: the smallest change K trials per side can detect (MDE), the trials needed for a given change or to
settle an inconclusive verdict, and the A/A calibration that measures the noise floor those rest on.

All on the log scale of the verdicts (intervals.ratio_interval): with per-trial coefficient of variation cv on
each side and n trials per side, log(B/A) has standard error ≈ cv·sqrt(2/n) and n-1 + n-1 degrees of freedom.
"""

from __future__ import annotations

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


def half_width_pct(cv: float, n_per_side: int, alpha: float = ALPHA) -> float | None:
    """Expected half-width (in %) of the comparison's interval with n trials per side at this CV: an
    equivalence margin below about twice this cannot promise `no_difference` for identical configurations."""
    if n_per_side < 2:
        return None
    t = t_quantile(1 - alpha / 2, 2 * n_per_side - 2)
    return 100 * math.expm1(t * cv * math.sqrt(2 / n_per_side))


POWER_DRAWS = 4000  # simulated comparisons behind each power figure: its Monte Carlo error is ~0.6 points


def _call_thresholds(
    cv_a: float, cv_b: float, n: int, margin_pct: float, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """For POWER_DRAWS simulated comparisons with n trials a side: the smallest true change (log scale) each
    would call `faster`. A comparison's estimate is off by a normal error, its interval's half-width h comes
    from the trials' own SDs (chi-square) and Welch's t, as compare computes it; a direction needs the
    interval to exclude zero and not to lie inside ±margin (no_difference is decided first)."""
    z = rng.standard_normal(POWER_DRAWS)
    sa = cv_a * np.sqrt(rng.chisquare(n - 1, POWER_DRAWS) / (n - 1))
    sb = cv_b * np.sqrt(rng.chisquare(n - 1, POWER_DRAWS) / (n - 1))
    va, vb = sa**2 / n, sb**2 / n
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(va + vb > 0, (va + vb) ** 2 / ((va**2 + vb**2) / (n - 1)), np.inf)
    h = t_quantiles(1 - alpha / 2, df) * np.sqrt(va + vb)
    error = z * math.sqrt((cv_a**2 + cv_b**2) / n)
    return np.asarray(np.maximum(h, math.log1p(margin_pct / 100) - h) - error)


def mde_pct(
    cv: float,
    n_per_side: int,
    alpha: float = ALPHA,
    power: float = POWER,
    margin_pct: float = 0.0,
    rng: np.random.Generator | None = None,
) -> float | None:
    """Smallest true change (in %) that n trials per side call `faster`/`slower` with probability `power`
    under compare's rule with equivalence margin `margin_pct`, by seeded simulation; None for n < 2."""
    if n_per_side < 2:
        return None
    rng = rng if rng is not None else np.random.default_rng(0)
    thresholds = _call_thresholds(cv, cv, n_per_side, margin_pct, alpha, rng)
    return 100 * math.expm1(max(0.0, float(np.quantile(thresholds, power))))


def trials_for_change(
    change_pct: float,
    cv_a: float,
    cv_b: float | None = None,
    alpha: float = ALPHA,
    power: float = POWER,
    margin_pct: float = 0.0,
    rng: np.random.Generator | None = None,
) -> int | None:
    """The fewest trials per side with which a true change of `change_pct` is called `faster`/`slower` with
    probability `power` (as in `mde_pct`). None when more than MAX_TRIALS would be needed, or never: a change
    inside the margin is called only while the interval is wide, so more trials make it no_difference."""
    cv_b = cv_a if cv_b is None else cv_b
    effect = abs(math.log1p(change_pct / 100))
    if effect == 0:
        return None
    if cv_a == 0 and cv_b == 0:
        return 2 if effect > math.log1p(margin_pct / 100) else None
    gen = rng if rng is not None else np.random.default_rng(0)
    # Every n up to 64, then a geometric grid: past a few dozen trials the answer is "about this many".
    for n in (*range(2, 65), *(int(g) for g in _GRID if g > 64)):
        hit = float(np.mean(_call_thresholds(cv_a, cv_b, n, margin_pct, alpha, gen) < effect)) >= power
        if hit:
            return int(n)
    return None


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
    mde_pct: float | None  # smallest change called faster/slower at 80% power, K a side (compare's rule)
    detect_pct: float | None  # the change asked about (--detect)
    trials_for_detect: int | None  # trials per side for that change; None: more than MAX_TRIALS, or never
    drift_pct: float | None  # fitted trend over the trials in execution order, first to last (stats.drift)
    drift_significant: bool = False  # that trend passes the drift test: the CV holds a trend, not only noise
    margin_pct: float = 2.0  # compare's equivalence margin the MDE and trials assume


def calibrate(
    run: RunResult, metric: str = "agg_tok_s", detect_pct: float | None = None, margin_pct: float = 2.0
) -> list[LevelCalibration]:
    """Per level of an A/A run: the CV across trials, the MDE with the same K per side, and the K a
    `detect_pct` change needs, both under compare's rule with `margin_pct`. InsufficientDataError when no
    level has two trials."""
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
                mde_pct=mde_pct(cv, k, margin_pct=margin_pct) if math.isfinite(cv) else None,
                detect_pct=detect_pct,
                trials_for_detect=(
                    trials_for_change(detect_pct, cv, margin_pct=margin_pct)
                    if detect_pct is not None and math.isfinite(cv)
                    else None
                ),
                drift_pct=drift.change_pct if drift is not None else None,
                margin_pct=margin_pct,
                drift_significant=drift is not None and drift.significant,
            )
        )
    if not out:
        raise InsufficientDataError(
            f"calibration needs 2+ trials per level with a {metric} value; run with --trials 3 or more"
        )
    return out
