"""Speculative accounting against the reference server's engine personalities, over real sockets.

Each personality speaks its engine's acceptance source: vLLM `vllm:spec_decode_*` counters, llama.cpp
`llamacpp:spec_decode_*` counters and per-request `timings`, SGLang `/generate` `meta_info`, vLLM per-request
`metrics.speculative_decoding`. The measured
figures must match the server's own ground truth exactly and the configured acceptance within 2%; a configured
"accepted but too costly" speculation must be diagnosed as step cost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable

import pytest

from tokbench.config import LoadSpec
from tokbench.loadgen.client import fetch_text
from tokbench.loadgen.runner import run_sweep
from tokbench.records import RunResult, TrialResult
from tokbench.spec import diagnose, level_acceptance, trial_acceptance
from tokbench.spec.scrape import request_acceptance, trial_window_s
from tokbench.testing import ReferenceServer, ServerConfig

# Conditional per-position acceptance as the reference server takes it (position i accepted given i-1 was).
ACCEPT = (0.95, 0.9, 0.85)
MARGINAL = tuple(math.prod(ACCEPT[: i + 1]) for i in range(len(ACCEPT)))  # what engines report per position
L_CONFIGURED = 1 + sum(MARGINAL)
API = {"vllm": "completions", "llamacpp": "chat", "sglang": "sglang"}
SOURCE = {"vllm": "prometheus:vllm", "llamacpp": "prometheus:llamacpp", "sglang": "meta_info:sglang"}


def _scraper(base_url: str) -> Callable[[], Awaitable[str | None]]:
    async def scrape() -> str | None:
        return await fetch_text(base_url, "/metrics")

    return scrape


async def _sweep(srv: ReferenceServer, personality: str, *, scrape: bool = True, **load: object) -> RunResult:
    spec = LoadSpec(base_url=srv.base_url, api=API[personality], warmup=2, **load)  # type: ignore[arg-type]
    return await run_sweep(spec, scrape=_scraper(srv.base_url) if scrape else None)


def _truth(srv: ReferenceServer, t: TrialResult) -> tuple[int, int, int]:
    """(verify steps, draft tokens, accepted) the server itself recorded for the trial's requests (the server
    runs in-process, so its timeline shares the client's perf_counter_ns clock)."""
    traces = [tr for tr in srv.timeline.values() if t.start_ns <= tr.accepted_ns <= t.end_ns]
    assert len(traces) == len(t.measured)
    return (
        sum(tr.spec_verify_ct for tr in traces),
        sum(tr.spec_draft_tokens for tr in traces),
        sum(tr.spec_accepted for tr in traces),
    )


@pytest.mark.parametrize("personality", ["vllm", "llamacpp", "sglang"])
async def test_acceptance_matches_the_configured_rates_and_the_servers_ground_truth(personality: str) -> None:
    cfg = ServerConfig(personality=personality, spec_accept=ACCEPT, itl_ms=1.0, ttft_ms=2.0, seed=11)  # type: ignore[arg-type]
    async with ReferenceServer(cfg) as srv:
        run = await _sweep(srv, personality, concurrencies=(16,), requests=32, max_tokens=640)
    (trial,) = run.levels[0].trials
    assert all(r.ok for r in trial.measured)
    acc = trial_acceptance(trial)
    assert acc is not None and acc.source == SOURCE[personality]
    drafts, draft_tokens, accepted = _truth(srv, trial)
    assert (acc.drafts, acc.draft_tokens, acc.accepted) == (drafts, draft_tokens, accepted)
    assert acc.mean_accepted_length == pytest.approx(L_CONFIGURED, rel=0.02)
    assert acc.acceptance_rate == pytest.approx(sum(MARGINAL) / len(ACCEPT), rel=0.02)
    # Tokens per target step also counts the prefill step and the cut last step: still within 2%.
    assert acc.length == pytest.approx(L_CONFIGURED, rel=0.02)
    if personality != "sglang" or acc.per_position:
        assert acc.per_position == pytest.approx(MARGINAL, rel=0.02)
    assert acc.verify_steps_per_s is not None and acc.verify_steps_per_s > 0


async def test_llamacpp_per_request_timings_without_metrics_give_the_same_length() -> None:
    cfg = ServerConfig(personality="llamacpp", spec_accept=ACCEPT, itl_ms=1.0, ttft_ms=2.0, seed=5)
    async with ReferenceServer(cfg) as srv:
        run = await _sweep(srv, "llamacpp", scrape=False, concurrencies=(8,), requests=24, max_tokens=640)
    (trial,) = run.levels[0].trials
    acc = trial_acceptance(trial)
    assert acc is not None and acc.source == "timings:llamacpp"
    _, draft_tokens, accepted = _truth(srv, trial)
    assert (acc.draft_tokens, acc.accepted) == (draft_tokens, accepted)
    assert acc.length == pytest.approx(L_CONFIGURED, rel=0.02)


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_vllm_per_request_spec_metrics_without_a_scrape_match_the_counters(api: str) -> None:
    cfg = ServerConfig(
        personality="vllm", spec_accept=ACCEPT, spec_request_metrics=True, itl_ms=1.0, ttft_ms=2.0, seed=7
    )
    async with ReferenceServer(cfg) as srv:
        spec = LoadSpec(
            base_url=srv.base_url, api=api, warmup=2, concurrencies=(8,), requests=24, max_tokens=640
        )
        run = await run_sweep(spec, scrape=_scraper(srv.base_url))
    (trial,) = run.levels[0].trials
    assert all(isinstance(r.extras["metrics"]["speculative_decoding"], dict) for r in trial.measured)
    per_request = request_acceptance(trial.measured, trial_window_s(trial))
    counters = trial_acceptance(trial)
    assert per_request is not None and per_request.source == "metrics:vllm"
    assert per_request.requests == len(trial.measured)
    assert counters is not None and counters.source == "prometheus:vllm"
    # Two sources, one truth: the server's own timeline, and each other.
    drafts, draft_tokens, accepted = _truth(srv, trial)
    for acc in (per_request, counters):
        assert (acc.drafts, acc.draft_tokens, acc.accepted) == (drafts, draft_tokens, accepted)
    assert per_request.accepted_per_position == counters.accepted_per_position
    assert per_request.mean_accepted_length == pytest.approx(L_CONFIGURED, rel=0.02)
    # Without the counters (no scrape), the trial's acceptance comes from the responses themselves.
    no_scrape = dataclasses.replace(trial, metrics_before=None, metrics_after=None)
    assert trial_acceptance(no_scrape) == per_request


@pytest.mark.parametrize("personality", ["vllm", "llamacpp", "sglang"])
async def test_accepted_but_too_costly_speculation_is_diagnosed_as_step_cost(personality: str) -> None:
    # Every speculative step costs as many plain steps as it yields tokens: S ≈ 1 despite L ≈ 3.5.
    common = {"personality": personality, "itl_ms": 2.0, "ttft_ms": 2.0, "batch_slope": 0.0, "seed": 3}
    load = {"concurrencies": (1, 4), "requests": 4, "max_tokens": 96}
    async with ReferenceServer(ServerConfig(**common)) as srv:  # type: ignore[arg-type]
        base = await _sweep(srv, personality, **load)
    costly = ServerConfig(**common, spec_accept=ACCEPT, spec_step_cost=L_CONFIGURED)  # type: ignore[arg-type]
    async with ReferenceServer(costly) as srv:
        spec = await _sweep(srv, personality, **load)
    for lv in spec.levels:
        acc = level_acceptance(lv)
        assert acc is not None and acc.mean_accepted_length == pytest.approx(L_CONFIGURED, rel=0.1)
    diags = diagnose(base, spec)
    assert [d.concurrency for d in diags] == [1, 4]
    for d in diags:
        assert d.speedup is not None and 0.7 < d.speedup < 1.3, d
        assert d.headline is not None and d.headline.check == "step_cost", d.findings
        assert "step cost too high" in d.headline.message
        assert d.step_cost == pytest.approx(d.length / d.speedup)  # type: ignore[operator]
