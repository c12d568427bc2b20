"""Coverage of the intervals at the trial counts people actually run (3-5), by seeded simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokbench.stats.bootstrap import bootstrap_ci
from tokbench.stats.intervals import ratio_interval, t_interval


def _coverage_t(k: int, reps: int, rng: np.random.Generator) -> float:
    hits = 0
    for _ in range(reps):
        ci = t_interval(rng.normal(100.0, 2.0, k))
        assert ci is not None
        hits += ci[0] <= 100.0 <= ci[1]
    return hits / reps


def test_t_interval_covers_the_mean_95_percent_at_three_trials() -> None:
    rng = np.random.default_rng(11)
    assert 0.93 <= _coverage_t(3, 3000, rng) <= 0.97


def test_percentile_bootstrap_under_covers_at_three_trials() -> None:
    # Why trial-level intervals are not bootstrapped: with 3 values the resampled means never leave min..max,
    # which holds the true mean only 1 - 2 * (1/2)^3 = 75% of the time.
    rng = np.random.default_rng(12)
    hits = 0
    reps = 600
    for _ in range(reps):
        ci = bootstrap_ci(rng.normal(100.0, 2.0, 3), rng=rng, resamples=1000)
        assert ci is not None
        hits += ci[0] <= 100.0 <= ci[1]
    assert hits / reps < 0.85


def test_intervals_need_two_values() -> None:
    assert t_interval([5.0]) is None
    assert bootstrap_ci([5.0]) is None
    assert ratio_interval([1.0], [1.0, 2.0]) is None


def test_bootstrap_median_interval_brackets_a_known_shift() -> None:
    rng = np.random.default_rng(3)
    deltas = rng.normal(-4.0, 1.0, 400)
    ci = bootstrap_ci(deltas, statistic="median", rng=rng)
    assert ci is not None and ci[0] < -4.0 + 0.3 and ci[1] > -4.0 - 0.3 and ci[1] < 0


def test_ratio_interval_coverage_of_the_true_ratio() -> None:
    rng = np.random.default_rng(5)
    reps, hits = 2000, 0
    for _ in range(reps):
        a = 1000 * np.exp(rng.normal(0, 0.02, 4))
        b = 1050 * np.exp(rng.normal(0, 0.02, 4))
        ri = ratio_interval(a, b)
        assert ri is not None
        # The true ratio of the means: both lognormal with the same sigma, so their mean ratio is 1.05.
        hits += ri.low <= 1.05 <= ri.high
    assert 0.93 <= hits / reps <= 0.975


def test_ratio_interval_is_symmetric_on_the_log_scale() -> None:
    ri = ratio_interval([100.0, 102.0, 98.0], [110.0, 112.0, 108.0])
    assert ri is not None
    assert ri.ratio == pytest.approx(1.1)
    assert math.log(ri.high / ri.ratio) == pytest.approx(math.log(ri.ratio / ri.low))
    assert ri.low > 1.0


def test_ratio_interval_edge_cases() -> None:
    assert ratio_interval([0.0, 0.0], [1.0, 2.0]) is None  # no ratio to a zero throughput
    point = ratio_interval([100.0, 100.0], [103.0, 103.0])
    assert point is not None and point.low == point.high == pytest.approx(1.03)
