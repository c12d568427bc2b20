"""Issue 3's "done when", by seeded simulation of trial-to-trial noise: false verdicts in A/A comparisons stay
at or under 5%, a true 5% change is found, and the power figures (MDE, trials needed) mean what they say."""

from __future__ import annotations

from collections import Counter

import numpy as np
from stats_fakes import run_of, speed_trial

from tokbench.stats.compare import compare_runs, decide
from tokbench.stats.power import mde_pct, trials_for_change


def _trials(
    rng: np.random.Generator, k: int, cv: float, scale: float = 1.0, heavy: bool = False
) -> np.ndarray:
    # Multiplicative per-trial noise; "heavy" draws from a t with 4 df (outlier trials), scaled to sd ~cv.
    z = rng.standard_t(4, k) / np.sqrt(2) if heavy else rng.normal(0.0, 1.0, k)
    return 1000.0 * scale * np.exp(cv * z)


def test_aa_comparisons_give_faster_or_slower_at_most_5_percent() -> None:
    rng = np.random.default_rng(2026)
    verdicts: Counter[str] = Counter()
    n = 2000
    for _ in range(n):
        ka, kb = rng.integers(3, 6, size=2)  # 3..5 trials a side, not necessarily equal
        cv = rng.uniform(0.005, 0.04)  # 0.5% .. 4% trial-to-trial noise
        heavy = bool(rng.random() < 0.3)
        hib = bool(rng.random() < 0.5)  # throughput and latency metrics alike
        d = decide(_trials(rng, ka, cv, heavy=heavy), _trials(rng, kb, cv, heavy=heavy), hib, margin_pct=2.0)
        verdicts[d.verdict] += 1
    false_rate = (verdicts["faster"] + verdicts["slower"]) / n
    assert false_rate <= 0.05, verdicts
    assert verdicts["no_difference"] > 0 and verdicts["inconclusive"] > 0


def test_aa_false_rate_without_a_margin_is_near_nominal() -> None:
    # With margin 0 every interval that excludes zero is a verdict: the rate is the interval's error rate,
    # which must be near (not far under) 5%, or the method would be needlessly blunt.
    rng = np.random.default_rng(7)
    n = 2000
    wrong = sum(
        decide(_trials(rng, 5, 0.015), _trials(rng, 5, 0.015), margin_pct=0.0).verdict in ("faster", "slower")
        for _ in range(n)
    )
    assert 0.025 <= wrong / n <= 0.05


def test_true_5_percent_change_with_1_5_percent_noise_found_with_5_trials() -> None:
    rng = np.random.default_rng(99)
    n = 1000
    words = Counter(decide(_trials(rng, 5, 0.015), _trials(rng, 5, 0.015, 1.05)).verdict for _ in range(n))
    assert words["faster"] / n >= 0.80
    assert words["slower"] == 0


def test_lower_is_better_metrics_flip_the_word() -> None:
    rng = np.random.default_rng(4)
    # B's latency 5% lower: for a lower-is-better metric that is "faster".
    words = Counter(
        decide(_trials(rng, 5, 0.01), _trials(rng, 5, 0.01, 0.95), higher_is_better=False).verdict
        for _ in range(200)
    )
    assert words["faster"] >= 190 and words["slower"] == 0


def test_mde_is_detected_about_80_percent_of_the_time() -> None:
    rng = np.random.default_rng(21)
    cv, k = 0.02, 4
    mde = mde_pct(cv, k)
    assert mde is not None
    n = 2000
    found = sum(
        decide(_trials(rng, k, cv), _trials(rng, k, cv, 1 + mde / 100), margin_pct=0.0).verdict == "faster"
        for _ in range(n)
    )
    assert 0.72 <= found / n <= 0.88
    # And trials_for_change inverts it: the K found for that change is the K that produced it.
    assert trials_for_change(mde, cv) == k


def test_mde_under_a_margin_is_what_compare_calls_faster_80_percent_of_the_time() -> None:
    # Low noise, default margin: a change must also reach past the margin, or compare says no_difference. The
    # margin-aware MDE is found ~80% of the time; the margin-free one (interval excludes zero) far less.
    rng = np.random.default_rng(22)
    cv, k, margin = 0.005, 5, 2.0
    mde, bare = mde_pct(cv, k, margin_pct=margin), mde_pct(cv, k)
    assert mde is not None and bare is not None and mde > bare

    def found(change: float, trials: int = k) -> float:
        n = 2000
        words = [
            decide(
                _trials(rng, trials, cv), _trials(rng, trials, cv, 1 + change / 100), margin_pct=margin
            ).verdict
            for _ in range(n)
        ]
        return words.count("faster") / n

    assert 0.72 <= found(mde) <= 0.88
    assert found(bare) < 0.5
    # Under a margin, power is not monotone in K (a narrow interval turns into no_difference): the fewest
    # trials that reach 80% for this change may be fewer than K, and they do reach it.
    fewest = trials_for_change(mde, cv, margin_pct=margin)
    assert fewest is not None and fewest <= k and found(mde, fewest) >= 0.75
    assert trials_for_change(1.0, cv, margin_pct=margin) is None  # no K makes 1% more than no_difference


def _cv(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / np.mean(x))


def test_trials_needed_would_settle_an_inconclusive_comparison() -> None:
    # Take inconclusive comparisons, treat their observed change and per-side noise as the truth, and rerun
    # each with the suggested trials per side: about 80% of reruns must reach a verdict (the power asked for).
    rng = np.random.default_rng(8)
    settled: list[float] = []
    while len(settled) < 12:
        a, b = _trials(rng, 3, 0.03), _trials(rng, 3, 0.03, 1.03)
        first = decide(a, b)
        if first.verdict != "inconclusive" or first.trials_needed is None or first.trials_needed > 40:
            continue
        assert first.delta_pct is not None
        k, scale = first.trials_needed, 1 + first.delta_pct / 100
        reruns = [decide(_trials(rng, k, _cv(a)), _trials(rng, k, _cv(b), scale)).verdict for _ in range(200)]
        settled.append(sum(v != "inconclusive" for v in reruns) / len(reruns))
    assert 0.74 <= float(np.mean(settled)) <= 0.9, settled


def test_record_based_runs_agree_with_the_value_level_simulation() -> None:
    # The same question through compare_runs on record-built trials (the full path the CLI takes): a 5% faster
    # B with ~1.5% per-trial noise and 5 trials a side is called faster at both levels.
    rng = np.random.default_rng(31)
    right = 0
    runs = 20
    for _ in range(runs):
        noise = np.exp(rng.normal(0, 0.015, size=(2, 2, 5)))  # side, level, trial
        a = run_of([speed_trial(c, k, noise[0, i, k]) for i, c in enumerate((1, 4)) for k in range(5)])
        b = run_of([speed_trial(c, k, 1.05 * noise[1, i, k]) for i, c in enumerate((1, 4)) for k in range(5)])
        right += all(v.verdict == "faster" for v in compare_runs(a, b))
    assert right / runs >= 0.8
