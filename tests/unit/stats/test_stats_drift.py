"""Drift warnings, by seeded simulation: trials without a trend rarely raise one, a steady slide is caught,
and compare carries it as a warning on the side that drifted."""

from __future__ import annotations

import numpy as np
import pytest
from stats_fakes import run_of, speed_trial

from tokbench.stats.compare import compare_runs
from tokbench.stats.drift import DRIFT_ALPHA, trend


def test_trials_without_drift_rarely_show_a_significant_trend() -> None:
    rng = np.random.default_rng(31)
    n = 3000
    hits = 0
    for _ in range(n):
        k = int(rng.integers(4, 9))
        hits += trend(1000 * np.exp(rng.normal(0, rng.uniform(0.005, 0.04), k))).significant  # type: ignore[union-attr]
    # The t test on the slope holds its level: about DRIFT_ALPHA of trendless sides, not more.
    assert hits / n <= 1.5 * DRIFT_ALPHA


def test_a_steady_slide_of_8_percent_over_6_trials_is_caught() -> None:
    rng = np.random.default_rng(32)
    slide = np.exp(np.linspace(0, np.log(0.92), 6))
    found = [trend(1000 * slide * np.exp(rng.normal(0, 0.01, 6))) for _ in range(1000)]
    assert sum(t is not None and t.significant for t in found) / 1000 >= 0.9
    changes = [t.change_pct for t in found if t is not None]
    assert np.median(changes) == pytest.approx(-8.0, abs=0.5)


def test_too_few_trials_or_non_positive_values_give_no_trend() -> None:
    assert trend([100.0, 90.0, 80.0]) is None
    assert trend([100.0, 0.0, 90.0, 80.0]) is None
    exact = trend([100.0, 90.0, 81.0, 72.9])
    assert exact is not None and exact.significant and exact.change_pct == pytest.approx(-27.1)


def test_compare_warns_on_the_side_that_drifted_only() -> None:
    speeds_a = (1.0, 0.97, 0.94, 0.91, 0.88)  # A slows down trial after trial
    speeds_b = (1.0, 1.002, 0.998, 1.001, 0.999)
    a = run_of([speed_trial(4, k, s) for k, s in enumerate(speeds_a)], "A")
    b = run_of([speed_trial(4, k, s) for k, s in enumerate(speeds_b)], "B")
    (v,) = compare_runs(a, b)
    drift = [w for w in v.warnings if "drift" in w]
    assert len(drift) == 1 and drift[0].startswith("A: drift, agg_tok_s moved -"), v.warnings
    (same,) = compare_runs(b, b)
    assert not any("drift" in w for w in same.warnings)
