"""The fault plan: seeded, with the configured frequencies, one fault at most per request."""

from __future__ import annotations

from collections import Counter

import numpy as np

from tokbench.testing import Fault
from tokbench.testing.faults import FaultPlan, strike_after


def test_frequencies_follow_the_rates() -> None:
    plan = FaultPlan({"disconnect": 0.1, "stall": 0.05, "http_429": 0.0}, np.random.default_rng(1))
    n = 20000
    counts = Counter(plan.draw() for _ in range(n))
    assert abs(counts[Fault.DISCONNECT] / n - 0.1) < 0.01
    assert abs(counts[Fault.STALL] / n - 0.05) < 0.008
    assert counts[Fault.HTTP_429] == 0
    assert abs(counts[None] / n - 0.85) < 0.015


def test_same_seed_same_sequence() -> None:
    def seq(seed: int) -> list[Fault | None]:
        plan = FaultPlan({"http_500": 0.3, "malformed": 0.3}, np.random.default_rng(seed))
        return [plan.draw() for _ in range(50)]

    assert seq(5) == seq(5) != seq(6)


def test_no_rates_no_faults() -> None:
    plan = FaultPlan({}, np.random.default_rng(0))
    assert all(plan.draw() is None for _ in range(100))


def test_mid_stream_faults_strike_halfway_after_at_least_one_token() -> None:
    assert strike_after(10) == 5 and strike_after(1) == 1
    assert Fault.DISCONNECT.mid_stream and not Fault.HTTP_500.mid_stream
