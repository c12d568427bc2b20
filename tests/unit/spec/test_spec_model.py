"""The speedup model: Leviathan's closed form below the knee, the compute-bound limit past it, and the fit."""

from __future__ import annotations

import numpy as np
import pytest

from tokbench.errors import ConfigError, InsufficientDataError
from tokbench.spec.model import alpha_positions, fit, predict, predicted_speedup, step_cost


@pytest.mark.parametrize(("alpha", "k", "c"), [(0.7, 3, 0.05), (0.9, 5, 0.0), (0.5, 1, 0.3), (0.8, 4, 0.02)])
def test_below_the_knee_it_is_leviathans_walltime_improvement(alpha: float, k: int, c: float) -> None:
    leviathan = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    assert predicted_speedup(alpha_positions(alpha, k), k, c, knee=64, concurrency=8) == pytest.approx(
        leviathan
    )
    assert predicted_speedup(alpha_positions(alpha, k), k, c, knee=None, concurrency=4096) == pytest.approx(
        leviathan
    )


def test_past_the_knee_verification_cost_grows_to_k_plus_one() -> None:
    per_pos, k, c, knee = (0.8, 0.6, 0.4), 3, 0.05, 8
    L = 2.8
    s = {b: predicted_speedup(per_pos, k, c, knee, b) for b in (1, 8, 12, 16, 32, 64, 1000)}
    assert s[1] == s[8] == pytest.approx(L / (1 + k * c))
    assert s[12] == pytest.approx(L / (12 / 8 + k * c))  # linear in B between the knee and (k+1)·knee
    assert s[32] == s[64] == s[1000] == pytest.approx(L / (k + 1 + k * c))  # fully compute-bound
    assert s[32] < 1  # far past the knee speculation cannot pay
    speeds = [s[b] for b in sorted(s)]
    assert speeds == sorted(speeds, reverse=True)


def test_per_position_beyond_k_is_ignored_and_predict_reports_l_r_s() -> None:
    rows = predict((0.9, 0.8, 0.7, 0.6), 2, 0.1, 4, [1, 6])
    assert rows[0].length == pytest.approx(2.7)
    assert rows[0].step_cost == pytest.approx(1.2)
    assert rows[1].step_cost == pytest.approx(1.5 + 0.2)
    assert rows[1].speedup == pytest.approx(2.7 / 1.7)


@pytest.mark.parametrize(
    "args",
    [((1.2,), 1, 0.0, None), ((0.5,), 0, 0.0, None), ((0.5,), 1, -0.1, None), ((0.5,), 1, 0.1, 0.0)],
)
def test_bad_model_inputs_name_the_flag(args: tuple) -> None:
    with pytest.raises(ConfigError, match="--"):
        predicted_speedup(*args, concurrency=1)


def test_fit_recovers_draft_cost_and_knee_from_noisy_measurements() -> None:
    rng = np.random.default_rng(7)
    k, c, knee = 3, 0.08, 6.0
    levels = [1, 2, 4, 8, 16, 32, 64]
    lengths = [2.9, 2.9, 2.85, 2.8, 2.8, 2.75, 2.7]
    rows = [
        (b, L, L / step_cost(k, c, knee, b) * (1 + rng.normal(0, 0.01)))
        for b, L in zip(levels, lengths, strict=True)
    ]
    ft = fit(rows, k)
    assert ft.c == pytest.approx(c, abs=0.03)
    assert ft.knee is not None and ft.knee == pytest.approx(knee, rel=0.25)
    assert ft.max_abs_residual_pct < 4
    assert len(ft.levels) == len(levels)


def test_fit_reports_no_knee_when_every_level_is_below_it_and_matches_the_seed_case() -> None:
    # The seed: L ≈ 2.5 accepted yet S ≈ 1 at every level: each step costs as much as L plain steps.
    rows = [(1, 2.5, 1.0), (4, 2.5, 1.0), (16, 2.5, 1.02), (32, 2.5, 1.0)]
    ft = fit(rows, 3)
    assert ft.knee is None
    assert ft.c == pytest.approx(0.5, abs=0.01)  # 1 + 3c = 2.5
    assert ft.rmse < 0.02


def test_fit_says_when_a_draft_cost_cannot_explain_the_slowdown() -> None:
    ft = fit([(1, 3.9, 0.01)], 3, c_max=2.0)
    assert ft.at_bound


def test_fit_needs_measured_levels() -> None:
    with pytest.raises(InsufficientDataError):
        fit([(1, 0.0, 1.0)], 3)
