"""Percentile bootstrap intervals, vectorised, with an injected numpy Generator.

Used where the resampled units are many (per-prompt paired deltas, a level with many trials). With 3-5 trials
it under-covers (it cannot reach beyond the observed min..max), so trial-level verdicts use intervals.py
instead."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

DEFAULT_RESAMPLES = 4000


def _mean(x: np.ndarray) -> np.ndarray:
    return np.asarray(x.mean(axis=-1))


def _median(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.median(x, axis=-1))


STATISTICS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"mean": _mean, "median": _median}


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    statistic: str = "mean",
    rng: np.random.Generator | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `statistic` ('mean' or 'median'); None with fewer than two values.

    Without `rng` a fixed seed is used, so the same data always print the same interval.
    """
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return None
    if not 1000 <= resamples <= 100_000:
        raise ValueError(f"resamples={resamples}: use 1000..100000")
    gen = rng if rng is not None else np.random.default_rng(0)
    stat = STATISTICS[statistic]
    # Draw in blocks so a large sample never needs a resamples × n matrix all at once.
    block = max(1, min(resamples, 2_000_000 // max(arr.size, 1)))
    out = np.empty(resamples)
    for start in range(0, resamples, block):
        stop = min(start + block, resamples)
        idx = gen.integers(0, arr.size, size=(stop - start, arr.size))
        out[start:stop] = stat(arr[idx])
    alpha = 1 - confidence
    lo, hi = np.quantile(out, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)
