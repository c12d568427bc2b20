"""Calibration from an A/A run, and the power arithmetic it prints."""

from __future__ import annotations

import numpy as np
import pytest

from tokbench.errors import InsufficientDataError
from tokbench.records import LevelResult, RunMeta, RunResult, TrialResult
from tokbench.report.terminal import calibration_table
from tokbench.stats.power import (
    calibrate,
    decide_probability,
    mde_pct,
    trials_for_change,
    trials_to_decide,
)


def _aa_run(values_by_level: dict[int, list[float]]) -> RunResult:
    levels = []
    for c, values in values_by_level.items():
        trials = tuple(
            TrialResult(c, k, order=k, started_at=0.0, start_ns=0, end_ns=0, imported={"agg_tok_s": v})
            for k, v in enumerate(values)
        )
        levels.append(LevelResult(c, trials))
    return RunResult(RunMeta("aa", "aa", "test", ""), tuple(levels))


def test_calibration_reports_cv_mde_and_trials_for_a_change() -> None:
    values = [100.0, 102.0, 98.0, 101.0, 99.0]
    (row,) = calibrate(_aa_run({4: values}), detect_pct=3.0)
    cv = float(np.std(values, ddof=1) / np.mean(values))
    assert row.concurrency == 4 and row.trials == 5
    assert row.mean == pytest.approx(100.0)
    assert row.cv_pct == pytest.approx(100 * cv)
    assert row.cv_upper_pct is not None and row.cv_upper_pct > row.cv_pct
    assert row.mde_pct == pytest.approx(mde_pct(cv, 5, margin_pct=2.0))
    # Expected interval half-width: t(0.975, 8 df) * cv * sqrt(2/5), on the log scale.
    assert row.half_width_pct == pytest.approx(100 * np.expm1(2.306004135 * cv * np.sqrt(2 / 5)))
    assert row.trials_for_detect == trials_for_change(3.0, cv, margin_pct=2.0)
    # Trend of log(value) over trial order, first to last: the least-squares slope times 4 steps.
    slope = np.polyfit(np.arange(5), np.log(values), 1)[0]
    assert row.drift_pct == pytest.approx(100 * np.expm1(4 * slope))
    assert not row.drift_significant


def test_calibration_sees_drift_across_the_run() -> None:
    rng = np.random.default_rng(3)
    steady_slide = [100.0 * (1 + 0.01 * k) * (1 + 0.002 * rng.standard_normal()) for k in range(6)]
    (row,) = calibrate(_aa_run({1: steady_slide}))
    assert row.drift_pct is not None and 4.0 < row.drift_pct < 6.0
    assert row.drift_significant
    table = calibration_table([row], "agg_tok_s")
    assert table.caption is not None and "significant trend" in str(table.caption)


def test_calibration_needs_two_trials() -> None:
    with pytest.raises(InsufficientDataError, match="--trials"):
        calibrate(_aa_run({1: [100.0], 4: [400.0]}))
    rows = calibrate(_aa_run({1: [100.0], 4: [400.0, 404.0]}))
    assert [r.concurrency for r in rows] == [4]


def _mde(cv: float, n: int) -> float:
    value = mde_pct(cv, n)
    assert value is not None
    return value


def test_more_noise_or_fewer_trials_means_a_larger_mde() -> None:
    assert _mde(0.01, 5) < _mde(0.02, 5)
    assert _mde(0.01, 10) < _mde(0.01, 5)
    assert mde_pct(0.01, 1) is None


def test_trials_for_change_is_the_smallest_sufficient_count() -> None:
    cv = 0.015
    k = trials_for_change(3.0, cv)
    assert k is not None and k >= 2
    assert _mde(cv, k) <= 3.0
    if k > 2:
        assert _mde(cv, k - 1) > 3.0
    assert trials_for_change(0.0, cv) is None
    assert trials_for_change(0.01, 0.5) is None  # beyond MAX_TRIALS


def test_trials_to_decide_is_the_first_n_reaching_80_percent() -> None:
    n = trials_to_decide(1.5, 0.02, 0.03, 2.0)
    assert n is not None
    probs = decide_probability(1.5, 0.02, 0.03, 2.0, np.array([n - 1, n]))
    assert probs[0] < 0.8 <= probs[1]
    # A change right at the margin with heavy noise: not even MAX_TRIALS per side would settle it.
    assert trials_to_decide(2.0, 0.5, 0.5, 2.0) is None
    assert trials_to_decide(30.0, 0.01, 0.01, 2.0) == 2


def test_decide_probability_limits() -> None:
    n = np.array([2, 1000])
    far = decide_probability(20.0, 0.01, 0.01, 2.0, n)
    assert far[1] == pytest.approx(1.0)
    # No change and no noise: the interval is the point 0, inside the margin; always decided.
    assert decide_probability(0.0, 0.0, 0.0, 2.0, n) == pytest.approx([1.0, 1.0])
