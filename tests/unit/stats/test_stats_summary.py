"""Every per-trial figure against hand-computed values from synthetic records with known timing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from stats_fakes import MS, closed_loop_trial, record

from tokbench.errors import ConfigError, InsufficientDataError, StoreError
from tokbench.records import ErrorKind, LevelResult, RequestRecord, TrialResult
from tokbench.stats.summary import (
    METRICS,
    itl_values,
    level_summary,
    metric_value,
    token_arrivals,
    trial_figures,
)


def trial_of(records: list[RequestRecord], concurrency: int = 1) -> TrialResult:
    return TrialResult(concurrency, 0, 0, 0.0, 0, max(r.end_ns for r in records), tuple(records))


def test_seed_figures_of_a_closed_loop_trial() -> None:
    # 2 slots x 2 requests of 20 tokens: 50 ms to the first token, then 10 ms per token -> 240 ms each.
    f = trial_figures(closed_loop_trial(2, 4, ttft_ms=50, itl_ms=10, tokens=20))
    assert (f.requests, f.ok, f.errors) == (4, 4, {})
    assert f.tokens == 80
    assert f.wall_s == pytest.approx(0.480)
    assert f.agg_tok_s == pytest.approx(80 / 0.480)
    assert f.per_req_tok_s == pytest.approx(20 / 0.240)
    assert f.ttft_ms.p50 == pytest.approx(50)
    assert f.e2e_ms.p99 == pytest.approx(240)
    assert f.tpot_ms.mean == pytest.approx(190 / 19)
    assert f.itl_ms.n == 4 * 19 and f.itl_ms.p50 == pytest.approx(10)


def test_usage_tokens_are_preferred_over_counted_chunks() -> None:
    r = record(0, 0, tokens=10, completion_tokens=25)
    f = trial_figures(trial_of([r]))
    assert f.tokens == 25
    assert f.per_req_tok_s == pytest.approx(25 / ((r.end_ns - r.sent_ns) / 1e9))


def test_warmup_requests_are_excluded() -> None:
    warm = record(0, 0, tokens=100, warmup=True)
    measured = record(1, 1000, tokens=10)
    f = trial_figures(trial_of([warm, measured]))
    assert f.requests == 1 and f.tokens == 10
    assert f.wall_s == pytest.approx((measured.end_ns - measured.scheduled_ns) / 1e9)


def test_failed_requests_are_counted_by_kind_and_kept_out_of_latency() -> None:
    ok = record(0, 0, ttft_ms=50, tokens=10)
    slow_fail = dataclasses.replace(record(1, 0, ttft_ms=900, tokens=5), error_kind=ErrorKind.TIMEOUT)
    fast_fail = dataclasses.replace(
        record(2, 0, tokens=1, ttft_ms=2), error_kind=ErrorKind.HTTP_STATUS, first_token_ns=None
    )
    f = trial_figures(trial_of([ok, slow_fail, fast_fail], concurrency=3))
    assert f.errors == {"timeout": 1, "http_status": 1}
    assert (f.requests, f.ok, f.tokens) == (3, 1, 10)
    assert f.ttft_ms.n == 1 and f.ttft_ms.p99 == pytest.approx(50)
    assert f.failed_ms.n == 2
    assert f.failed_ms.p50 == pytest.approx(((slow_fail.end_ns + fast_fail.end_ns) / 2) / MS)


def test_percentiles_follow_numpy_over_ok_requests() -> None:
    ttfts = [10.0 * (i + 1) for i in range(20)]
    recs = [record(i, 1000.0 * i, ttft_ms=t, tokens=5) for i, t in enumerate(ttfts)]
    f = trial_figures(trial_of(recs))
    p50, p90, p99 = np.percentile(ttfts, [50, 90, 99])
    assert (f.ttft_ms.p50, f.ttft_ms.p90, f.ttft_ms.p99) == pytest.approx((p50, p90, p99))
    assert f.ttft_ms.mean == pytest.approx(np.mean(ttfts))


def test_itl_counts_each_token_of_a_speculative_chunk() -> None:
    # 3 tokens per chunk every 30 ms: the per-token gap is 10 ms, not 30.
    r = record(0, 0, ttft_ms=50, itl_ms=10, tokens=31, per_chunk=3)
    values = itl_values(r) / MS
    assert values.size == 31 - 3  # the first chunk's tokens belong to TTFT
    assert np.allclose(values, 10.0)
    f = trial_figures(trial_of([r]))
    assert f.itl_ms.p50 == pytest.approx(10.0)
    # TPOT = (E2E - TTFT) / (tokens - 1): 28 tokens x 10 ms after the first chunk, over 30.
    assert f.tpot_ms.p50 == pytest.approx(280 / 30)


def test_chunks_of_one_socket_read_count_as_one_delivery() -> None:
    # llama.cpp streams a speculative step's 3 tokens as 3 events in one read: same stamp, so one chunk of 3.
    stamps = (50, 50, 80, 80, 80, 110, 110, 110)
    r = dataclasses.replace(record(0, 0, tokens=8), chunk_ns=tuple(s * MS for s in stamps),
                            chunk_tokens=(1,) * 8, completion_tokens=8)  # fmt: skip
    values = itl_values(r) / MS
    assert values.size == 6  # the two tokens of the first read belong to TTFT
    assert np.allclose(values, 10.0)
    # ... or in separate reads a fraction of a millisecond apart: still one step's delivery, not gaps of ~0
    near = (50.0, 50.2, 80.0, 80.1, 80.35, 110.0, 110.05, 110.4)
    r = dataclasses.replace(r, chunk_ns=tuple(int(s * MS) for s in near))
    values = itl_values(r) / MS
    assert values.size == 6 and np.allclose(values, 10.0, atol=0.1)
    # gaps of a millisecond and more are steps of their own
    apart = (50.0, 51.0, 52.0)
    r = dataclasses.replace(record(0, 0, tokens=3), chunk_ns=tuple(int(s * MS) for s in apart),
                            chunk_tokens=(1, 1, 1), completion_tokens=3)  # fmt: skip
    assert np.allclose(itl_values(r) / MS, [1.0, 1.0])


def test_usage_surplus_is_spread_over_chunks_in_proportion() -> None:
    r = dataclasses.replace(record(0, 0, tokens=3), chunk_tokens=(1, 2, 1), chunk_ns=(10, 20, 30),
                            completion_tokens=6)  # fmt: skip
    _, counts = token_arrivals(r)
    # Exact shares 1.5, 3, 1.5: the leftover token goes to the earlier of the tied remainders.
    assert counts.tolist() == [2, 3, 1]
    # Streamed one token per chunk but usage says twice as many: every gap is split in two.
    r2 = record(0, 0, ttft_ms=50, itl_ms=10, tokens=10, completion_tokens=20)
    values = itl_values(r2) / MS
    assert values.size == 18 and np.allclose(values, 5.0)


def test_queue_time_is_sent_minus_scheduled() -> None:
    recs = [record(0, 5, scheduled_ms=0), record(1, 300, scheduled_ms=280)]
    f = trial_figures(trial_of(recs))
    assert f.queue_ms.p50 == pytest.approx(12.5)
    assert f.queue_ms.mean == pytest.approx(12.5)


def _hand_steady_trial() -> TrialResult:
    # Two slots. r0: 0..100 ms, r1: 50..150 ms, r2: 100..200 ms; one token every 10 ms after sending.
    r0 = record(0, 0, ttft_ms=10, itl_ms=10, tokens=10)
    r1 = record(1, 50, ttft_ms=10, itl_ms=10, tokens=10)
    r2 = record(2, 100, ttft_ms=10, itl_ms=10, tokens=10)
    return trial_of([r0, r1, r2], concurrency=2)


def test_steady_state_trims_ramp_up_and_drain() -> None:
    f = trial_figures(_hand_steady_trial())
    # Both slots busy from 50 ms (r1 sent) to 150 ms (r1 ends, nothing follows); the hand-over at 100 ms is
    # inside. Tokens arriving in (50, 150]: r0 60..100 -> 5, r1 60..150 -> 10, r2 110..150 -> 5.
    assert f.steady_window_s == pytest.approx(0.100)
    assert f.steady_agg_tok_s == pytest.approx(20 / 0.100)
    assert f.agg_tok_s == pytest.approx(30 / 0.200)


def test_steady_state_is_none_without_a_target_or_a_long_enough_window() -> None:
    open_loop = dataclasses.replace(_hand_steady_trial(), request_rate=5.0)
    assert trial_figures(open_loop).steady_agg_tok_s is None
    never_full = dataclasses.replace(_hand_steady_trial(), concurrency=3)
    assert trial_figures(never_full).steady_agg_tok_s is None
    # Both slots busy for 1 ms of a 1 s trial: far shorter than a quarter of the wall time.
    long_one = record(0, 0, ttft_ms=10, itl_ms=10, tokens=100)
    short = trial_of([long_one, record(1, 500, ttft_ms=1, tokens=1)], 2)
    f = trial_figures(short)
    assert f.steady_agg_tok_s is None and f.steady_window_s is not None


def test_imported_trial_uses_its_figures() -> None:
    t = TrialResult(4, 0, 0, 0.0, 0, 0, imported={"agg_tok_s": 541.9, "per_req_tok_s": 159.4, "tokens": 7245,
                                                  "wall_s": 13.4, "ok": 8})  # fmt: skip
    f = trial_figures(t)
    assert (f.agg_tok_s, f.per_req_tok_s, f.tokens, f.wall_s, f.ok) == (541.9, 159.4, 7245, 13.4, 8)
    assert f.imported and metric_value(f, "ttft_p50") is None
    derived = trial_figures(TrialResult(1, 0, 0, 0.0, 0, 0, imported={"tokens": 100, "wall_s": 4.0}))
    assert derived.agg_tok_s == pytest.approx(25.0)
    with pytest.raises(StoreError, match="agg_tok_s"):
        trial_figures(TrialResult(1, 0, 0, 0.0, 0, 0, imported={"ok": 4}))


def test_metric_names_and_directions() -> None:
    f = trial_figures(closed_loop_trial(2, 4))
    assert METRICS["agg_tok_s"] and not METRICS["ttft_p50"] and not METRICS["itl_p99"]
    assert metric_value(f, "agg_tok_s") == f.agg_tok_s
    assert metric_value(f, "e2e_p99") == f.e2e_ms.p99
    with pytest.raises(ConfigError, match="--metric"):
        metric_value(f, "tokens_per_watt")


def _level(values: list[float]) -> LevelResult:
    trials = tuple(TrialResult(8, k, k, 0.0, 0, 0, imported={"agg_tok_s": v}) for k, v in enumerate(values))
    return LevelResult(8, trials)


def test_level_summary_t_interval_and_single_trial() -> None:
    s = level_summary(_level([100.0, 102.0, 104.0]))
    half = 4.302652729911275 * 2.0 / np.sqrt(3)  # t(0.975, 2 df) * sd / sqrt(n)
    assert s.mean == pytest.approx(102.0)
    assert (s.ci_low, s.ci_high) == pytest.approx((102.0 - half, 102.0 + half))
    assert s.cv == pytest.approx(2.0 / 102.0)
    one = level_summary(_level([172.2]))
    assert one.n_trials == 1 and one.ci_low is None and one.ci_high is None
    assert "one trial" in one.note
    with pytest.raises(InsufficientDataError):
        level_summary(LevelResult(8, ()))


def test_level_summary_bootstrap_uses_the_injected_rng() -> None:
    level = _level([100.0, 101.0, 99.5, 102.0, 98.0, 100.5, 101.5, 99.0])
    a = level_summary(level, rng=np.random.default_rng(7), method="bootstrap")
    b = level_summary(level, rng=np.random.default_rng(7), method="bootstrap")
    c = level_summary(level, rng=np.random.default_rng(8), method="bootstrap")
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)
    assert a.ci_low is not None and a.ci_high is not None
    assert 98.0 < a.ci_low < a.mean < a.ci_high < 102.0
