"""The decode-step model without sockets: sublinear batching, exact token counts, queueing, seeded noise, and
speculative counters that imply the configured acceptance."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from tokbench.testing import ServerConfig
from tokbench.testing.engine import DecodeEngine, Job, lognormal_unit_mean


def test_aggregate_rate_grows_sublinearly_with_batch() -> None:
    engine = DecodeEngine(ServerConfig(itl_ms=10, batch_slope=0.05), np.random.default_rng(0))
    rates = [n / engine.step_seconds(n) for n in range(1, 65)]
    assert all(b > a for a, b in itertools.pairwise(rates))  # more requests, more tok/s ...
    assert all(rate < n * rates[0] for n, rate in enumerate(rates[1:], start=2))  # ... but less than n times


def test_speed_and_spec_cost_scale_the_step() -> None:
    rng = np.random.default_rng(0)
    plain = DecodeEngine(ServerConfig(itl_ms=10), rng)
    fast = DecodeEngine(ServerConfig(itl_ms=10, speed=2.0), rng)
    spec = DecodeEngine(ServerConfig(itl_ms=10, spec_accept=(0.5,), spec_step_cost=1.4), rng)
    assert fast.step_seconds(4) == pytest.approx(plain.step_seconds(4) / 2)
    assert spec.step_seconds(4) == pytest.approx(plain.step_seconds(4) * 1.4)


def test_lognormal_noise_has_unit_mean_and_the_requested_cv() -> None:
    rng = np.random.default_rng(3)
    draws = np.array([lognormal_unit_mean(rng, 0.05) for _ in range(40000)])
    assert draws.mean() == pytest.approx(1.0, abs=0.002)
    assert draws.std() / draws.mean() == pytest.approx(0.05, rel=0.05)
    assert lognormal_unit_mean(rng, 0.0) == 1.0


def test_run_speed_is_drawn_from_the_seed() -> None:
    def multiplier(seed: int, **kw: object) -> float:
        cfg = ServerConfig(noise=0.1, **kw)  # type: ignore[arg-type]
        return DecodeEngine(cfg, np.random.default_rng(seed)).run_multiplier

    assert multiplier(1) == multiplier(1, step_jitter=0.2, spec_accept=(0.5,)) != multiplier(2)


async def _drain(job: Job) -> list[int]:
    tokens = []
    while True:
        e = await job.next()
        tokens.append(e.tokens)
        if e.done:
            return tokens


async def test_every_job_gets_exactly_its_tokens_and_done_only_at_the_end() -> None:
    engine = DecodeEngine(ServerConfig(ttft_ms=0.1, itl_ms=0.05), np.random.default_rng(0))
    engine.start()
    try:
        targets = [1, 2, 7, 40, 13]
        jobs = [engine.submit(t, prompt_tokens=3) for t in targets]
        emitted = await asyncio.wait_for(asyncio.gather(*(_drain(j) for j in jobs)), 10)
    finally:
        await engine.close()
    assert [sum(e) for e in emitted] == targets
    assert all(e == [1] * len(e) for e in emitted)  # no speculation: one token per step
    assert engine.stats.generation_tokens == sum(targets) and engine.stats.requests_finished == 5


async def test_requests_beyond_max_batch_wait_and_a_cancelled_one_frees_its_slot() -> None:
    engine = DecodeEngine(ServerConfig(ttft_ms=0.1, itl_ms=0.2, max_batch=2), np.random.default_rng(0))
    engine.start()
    try:
        jobs = [engine.submit(20, prompt_tokens=1) for _ in range(4)]
        assert (engine.stats.running, engine.stats.waiting) == (2, 2)
        engine.cancel(jobs[0])
        assert (engine.stats.running, engine.stats.waiting) == (2, 1)
        emitted = await asyncio.wait_for(asyncio.gather(*(_drain(j) for j in jobs[1:])), 10)
    finally:
        await engine.close()
    assert [sum(e) for e in emitted] == [20, 20, 20] and jobs[0].generated == 0
    assert engine.stats.waiting == 0


async def test_spec_counters_imply_the_configured_acceptance() -> None:
    cfg = ServerConfig(ttft_ms=0.1, itl_ms=0.01, batch_slope=0, spec_accept=(0.8, 0.6, 0.4))
    engine = DecodeEngine(cfg, np.random.default_rng(42))
    engine.start()
    try:
        jobs = [engine.submit(400, prompt_tokens=1) for _ in range(100)]
        emitted = await asyncio.wait_for(asyncio.gather(*(_drain(j) for j in jobs)), 30)
    finally:
        await engine.close()
    spec = engine.stats.spec
    assert spec.drafts > 15000 and spec.draft_tokens == 3 * spec.drafts
    assert 1 + spec.accepted / spec.drafts == pytest.approx(cfg.mean_accepted_length, rel=0.01)
    for i, expected in enumerate((0.8, 0.48, 0.192)):
        assert spec.per_position[i] / spec.drafts == pytest.approx(expected, abs=0.012)
    assert all(sum(e) == 400 for e in emitted)
    assert max(max(e) for e in emitted) == 4  # accepted + bonus never exceeds k + 1
