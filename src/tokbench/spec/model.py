"""The speculative speedup model (Leviathan et al. 2023, generalized to serving) and its fit to measurements.

S(B) = L / r(B): L tokens per target step (bonus included), r(B) the cost of one speculative step relative
to one plain decode step at concurrency B. The step-cost curve is a roofline in tokens per forward pass: a
forward pass over n tokens costs max(1, n / n*) memory-bound passes. Verification processes B·(k+1) tokens, a
plain step B, and the knee K is the concurrency at which verification turns compute-bound (n* = K·(k+1)):

    v(B) = t_verify / t_plain = clamp(B / K, 1, k+1)   (1 below the knee, linear in B, k+1 from B = K·(k+1))
    r(B) = v(B) + k·c                                    (k draft tokens, each costing c plain steps)

Below the knee this is Leviathan's S = L / (1 + k·c); far past it, S → L / (k+1+k·c) ≤ 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokbench.errors import ConfigError, InsufficientDataError

# The BRIEF's interface puts these under spec.model; they live in their own modules.
from tokbench.spec.diagnose import LevelDiagnosis, diagnose
from tokbench.spec.lossless import LosslessResult, lossless_check

# How much a knee must reduce the squared error of the fit to be reported (see `fit`).
KNEE_GAIN = 2.0

__all__ = [
    "Fit",
    "FitLevel",
    "LevelDiagnosis",
    "LosslessResult",
    "Prediction",
    "alpha_positions",
    "diagnose",
    "fit",
    "lossless_check",
    "mean_length",
    "predict",
    "predicted_speedup",
    "step_cost",
    "verify_cost",
]


def alpha_positions(alpha: float, k: int) -> tuple[float, ...]:
    """Per-position acceptance under Leviathan's i.i.d. model: position i (from 0) accepted w.p. α^(i+1)."""
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"--alpha: {alpha} is not a probability; give a value in [0, 1], e.g. 0.7")
    _check_k(k)
    return tuple(alpha ** (i + 1) for i in range(k))


def mean_length(per_position: Sequence[float], k: int) -> float:
    """L = 1 + Σ p_i over the first k positions (bonus token included)."""
    return 1.0 + float(sum(per_position[:k]))


def verify_cost(k: int, knee: float | None, concurrency: float) -> float:
    """v(B): verifying k+1 tokens per request relative to one plain step; knee None = never compute-bound."""
    if knee is None or math.isinf(knee):
        return 1.0
    return min(float(k + 1), max(1.0, concurrency / knee))


def step_cost(k: int, c: float, knee: float | None, concurrency: float) -> float:
    """r(B) = v(B) + k·c."""
    return verify_cost(k, knee, concurrency) + k * c


def predicted_speedup(
    per_position: Sequence[float], k: int, c: float, knee: float | None, concurrency: int
) -> float:
    """S(B) = L / r(B) for per-position acceptance (first k used), k draft tokens, draft cost c, knee K."""
    _check(per_position, k, c, knee)
    return mean_length(per_position, k) / step_cost(k, c, knee, concurrency)


@dataclass(frozen=True)
class Prediction:
    concurrency: int
    length: float  # L
    step_cost: float  # r
    speedup: float  # S


def predict(
    per_position: Sequence[float], k: int, c: float, knee: float | None, concurrencies: Sequence[int]
) -> list[Prediction]:
    _check(per_position, k, c, knee)
    L = mean_length(per_position, k)
    out = []
    for b in concurrencies:
        r = step_cost(k, c, knee, b)
        out.append(Prediction(b, L, r, L / r))
    return out


# ---- fit -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitLevel:
    concurrency: int
    length: float  # measured L
    measured: float  # measured S
    predicted: float  # S from the fitted c and knee
    residual: float  # predicted - measured
    residual_pct: float  # residual / measured, %


@dataclass(frozen=True)
class Fit:
    k: int
    c: float
    knee: float | None  # None: no knee within the measured levels (verification memory-bound throughout)
    levels: tuple[FitLevel, ...]
    rmse: float  # of S
    max_abs_residual_pct: float
    at_bound: bool  # c hit the search bound: the model cannot explain the slowdown with a draft cost alone


def fit(
    levels: Sequence[tuple[int, float, float]],
    k: int,
    *,
    c_max: float = 5.0,
    c_steps: int = 501,
    knee_steps: int = 241,
) -> Fit:
    """Least-squares fit of c ≥ 0 and the knee to measured (concurrency, L, S) per level, on a grid (the
    model is piecewise linear in the knee, so a grid finds the global optimum a local solver could miss).

    A knee at or past the largest measured concurrency is indistinguishable from none and reported as None,
    and so is one that does not at least halve the squared error (KNEE_GAIN)."""
    _check_k(k)
    pts = [(int(b), float(L), float(s)) for b, L, s in levels if L > 0 and s > 0 and math.isfinite(L * s)]
    if not pts:
        raise InsufficientDataError("spec-model --fit: no level has both a measured L and a measured speedup")
    B = np.array([p[0] for p in pts], dtype=float)
    L = np.array([p[1] for p in pts])
    S = np.array([p[2] for p in pts])
    bmax = float(B.max())
    # Knees from well below the smallest level up to the largest one; past it every level sits below the knee.
    knees = np.concatenate(
        [np.geomspace(max(float(B.min()) / (k + 1) / 2, 0.05), bmax, knee_steps), [np.inf]]
    )
    v = np.minimum(k + 1.0, np.maximum(1.0, B[None, :] / knees[:, None]))  # (knees, levels)

    def sse(c_grid: np.ndarray) -> np.ndarray:  # (knees, c)
        r = v[:, None, :] + k * c_grid[None, :, None]
        return ((L[None, None, :] / r - S[None, None, :]) ** 2).sum(axis=2)  # type: ignore[no-any-return]

    coarse = np.linspace(0.0, c_max, c_steps)
    err = sse(coarse)
    c0 = float(coarse[int(np.argmin(err)) % err.shape[1]])
    step = float(coarse[1] - coarse[0])
    fine = np.linspace(max(0.0, c0 - step), min(c_max, c0 + step), 401)
    err = sse(fine)
    # A knee is one more parameter; report it only when it at least halves the squared error of the fit
    # without one, so noise at the top level is not read as a knee.
    no_knee = float(err[-1].min())
    best = float(err.min())
    if best * KNEE_GAIN > no_knee or len(pts) < 2:
        ki, ci = len(knees) - 1, int(np.argmin(err[-1]))
    else:
        # Among equal fits prefer the largest knee: the simplest explanation of the data.
        ties = np.argwhere(err <= best * (1 + 1e-9) + 1e-15)
        ki, ci = max(
            ((int(i), int(j)) for i, j in ties), key=lambda ij: (float(knees[ij[0]]), -float(fine[ij[1]]))
        )
    knee_f = float(knees[ki])
    knee: float | None = None if knee_f >= bmax else knee_f
    c = float(fine[ci])
    out = []
    for b, Lm, s in pts:
        pred = Lm / step_cost(k, c, knee, b)
        out.append(FitLevel(b, Lm, s, pred, pred - s, 100.0 * (pred - s) / s))
    res = np.array([f.residual for f in out])
    return Fit(
        k=k,
        c=c,
        knee=knee,
        levels=tuple(out),
        rmse=float(np.sqrt((res**2).mean())),
        max_abs_residual_pct=max(abs(f.residual_pct) for f in out),
        at_bound=c >= c_max,
    )


# ---- validation ----------------------------------------------------------------------------------


def _check_k(k: int) -> None:
    if k < 1:
        raise ConfigError(f"--k: {k} draft tokens per step; give a positive integer, e.g. 3")


def _check(per_position: Sequence[float], k: int, c: float, knee: float | None) -> None:
    _check_k(k)
    if any(not 0.0 <= p <= 1.0 for p in per_position):
        raise ConfigError(f"--accept: {list(per_position)} must be probabilities in [0, 1], e.g. 0.8,0.6,0.4")
    if c < 0 or not math.isfinite(c):
        raise ConfigError(f"--c: draft cost ratio {c} must be a non-negative number, e.g. 0.05")
    if knee is not None and not knee > 0:
        raise ConfigError(f"--knee: {knee} must be a positive concurrency, e.g. 16 (omit it for no knee)")
