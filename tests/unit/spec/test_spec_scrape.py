"""Run-scoped acceptance: counter deltas (real llama.cpp scrapes, vLLM's layout) and per-request extras."""

from __future__ import annotations

import json
import re

import pytest
from spec_fakes import fixture, rec, trial, vllm_metrics

from tokbench.records import LevelResult
from tokbench.spec.scrape import (
    counter_acceptance,
    level_acceptance,
    parse_counters,
    request_acceptance,
    trial_acceptance,
)


def _final_chunks(name: str) -> list[dict]:
    """The usage+timings chunks a real llama-server streamed, one per request."""
    return [
        json.loads(line[len("data: ") :]) for line in fixture(name).splitlines() if line.startswith("data: ")
    ]


def _counter(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, name
    return float(m.group(1))


def _timed_records(name: str) -> list:
    return [
        rec(i, tokens=c["usage"]["completion_tokens"], extras={"timings": c["timings"]})
        for i, c in enumerate(_final_chunks(name))
    ]


@pytest.mark.parametrize("kind", ["ngram", "draft"])
def test_real_llamacpp_counter_deltas_agree_with_the_requests_own_timings(kind: str) -> None:
    before = fixture(f"llamacpp_{kind}_metrics_before.txt")
    after = fixture(f"llamacpp_{kind}_metrics_after.txt")
    acc = counter_acceptance(before, after, window_s=8.0)
    assert acc is not None and acc.source == "prometheus:llamacpp"
    chunks = _final_chunks(f"llamacpp_{kind}_final_chunks.txt")
    # Two independent sources from the same real server: /metrics deltas and each response's timings.
    assert acc.accepted == sum(c["timings"]["draft_n_accepted"] for c in chunks)
    assert acc.draft_tokens == sum(c["timings"]["draft_n"] for c in chunks)
    assert acc.tokens == sum(c["usage"]["completion_tokens"] for c in chunks)
    drafts = _counter(after, "llamacpp:spec_decode_num_drafts_total") - _counter(
        before, "llamacpp:spec_decode_num_drafts_total"
    )
    assert acc.drafts == drafts > 0
    # Every accepted token is counted at exactly one draft position.
    assert sum(acc.accepted_per_position) == acc.accepted
    assert list(acc.per_position) == sorted(acc.per_position, reverse=True)
    assert acc.per_position[0] == pytest.approx(acc.accepted_per_position[0] / drafts)
    assert acc.mean_accepted_length == pytest.approx(1 + acc.accepted / drafts)
    assert acc.tokens_per_step == pytest.approx(acc.tokens / (acc.tokens - acc.accepted))
    assert acc.length == acc.tokens_per_step
    assert acc.verify_steps_per_s == pytest.approx((acc.tokens - acc.accepted) / 8.0)


def test_same_model_draft_on_real_llamacpp_is_fully_accepted() -> None:
    acc = counter_acceptance(
        fixture("llamacpp_draft_metrics_before.txt"), fixture("llamacpp_draft_metrics_after.txt")
    )
    assert acc is not None
    assert acc.acceptance_rate == 1.0
    assert acc.per_position[:2] == (1.0, 1.0)
    # 64-token outputs, 3 drafts per step: well above 3 tokens per target step.
    assert 3.5 < acc.length < 4.0  # type: ignore[operator]


def test_real_llamacpp_baseline_exposes_spec_counters_that_stay_zero() -> None:
    before = fixture("llamacpp_baseline_metrics_before.txt")
    after = fixture("llamacpp_baseline_metrics_after.txt")
    assert "per_pos" not in after  # llama.cpp prints per-position counters only once something was verified
    acc = counter_acceptance(before, after)
    assert acc is not None
    assert not acc.engaged
    assert (acc.drafts, acc.accepted, acc.per_position) == (0, 0, ())
    assert acc.tokens == sum(
        c["usage"]["completion_tokens"] for c in _final_chunks("llamacpp_baseline_final_chunks.txt")
    )
    assert acc.length == 1.0


def test_llamacpp_timings_alone_give_the_same_length_as_the_counters() -> None:
    recs = _timed_records("llamacpp_ngram_final_chunks.txt")
    t = trial(recs, window_s=4.0)  # no scrapes: per-request data is the source
    acc = trial_acceptance(t)
    assert acc is not None and acc.source == "timings:llamacpp"
    counters = counter_acceptance(
        fixture("llamacpp_ngram_metrics_before.txt"), fixture("llamacpp_ngram_metrics_after.txt")
    )
    assert counters is not None
    assert (acc.tokens, acc.accepted, acc.draft_tokens, acc.steps) == (
        counters.tokens,
        counters.accepted,
        counters.draft_tokens,
        counters.steps,
    )
    assert acc.drafts is None  # timings do not say how many steps drafted
    assert acc.mean_accepted_length == acc.tokens_per_step == counters.tokens_per_step


def test_llamacpp_timings_without_draft_fields_mean_nothing_was_drafted() -> None:
    recs = _timed_records("llamacpp_baseline_final_chunks.txt")
    acc = request_acceptance(recs)
    assert acc is not None and not acc.engaged and acc.draft_tokens == 0


def test_vllm_counters_sum_engines_skip_created_samples_and_ignore_sglang_gauges() -> None:
    before = vllm_metrics(100, 300, 150, [80, 50, 20], 1000)
    after = vllm_metrics(300, 900, 510, [260, 170, 80], 1910)
    snap = parse_counters(after)
    assert snap is not None and snap.engine == "vllm"
    acc = counter_acceptance(before, after, window_s=2.0)
    assert acc is not None and acc.source == "prometheus:vllm"
    assert (acc.drafts, acc.draft_tokens, acc.accepted, acc.tokens) == (200, 600, 360, 910)
    assert acc.per_position == pytest.approx((0.9, 0.6, 0.3))
    assert acc.mean_accepted_length == pytest.approx(2.8)
    assert acc.acceptance_rate == pytest.approx(0.6)
    assert acc.steps == 910 - 360


def test_counter_reset_between_scrapes_falls_back_to_per_request_data() -> None:
    before = vllm_metrics(300, 900, 510, [260, 170, 80], 1910)
    after = vllm_metrics(10, 30, 15, [8, 5, 2], 40)  # the server restarted
    assert counter_acceptance(before, after) is None
    meta = {
        "meta_info": {
            "completion_tokens": 50,
            "spec_verify_ct": 20,
            "spec_num_correct_drafts": 29,
            "spec_num_proposed_drafts": 60,
        }
    }
    acc = trial_acceptance(trial([rec(0, tokens=50, extras=meta)], before=before, after=after))
    assert acc is not None and acc.source == "meta_info:sglang"


def test_malformed_metrics_text_is_not_an_acceptance_source() -> None:
    html = "<html><body>404 Not Found</body></html>"
    assert parse_counters(html) is None
    assert trial_acceptance(trial([rec(0)], before=html, after=html)) is None


def test_sglang_meta_info_new_fields_and_histogram() -> None:
    # Two requests; histogram[j] = verify steps that accepted exactly j drafts (k = 3).
    m1 = {
        "completion_tokens": 30,
        "spec_verify_ct": 10,
        "spec_num_correct_drafts": 19,
        "spec_num_proposed_drafts": 30,
        "spec_correct_drafts_histogram": [1, 2, 3, 4],
        "spec_accept_length": 3.0,
    }
    m2 = {
        "completion_tokens": 11,
        "spec_verify_ct": 10,
        "spec_num_correct_drafts": 0,
        "spec_num_proposed_drafts": 30,
        "spec_correct_drafts_histogram": [10, 0, 0, 0],
    }
    acc = request_acceptance(
        [rec(0, tokens=30, extras={"meta_info": m1}), rec(1, tokens=11, extras={"meta_info": m2})]
    )
    assert acc is not None
    assert (acc.drafts, acc.accepted, acc.draft_tokens, acc.tokens, acc.requests) == (20, 19, 60, 41, 2)
    # position 0 accepted whenever >= 1 draft was: 2+3+4 = 9 steps; position 1: 3+4; position 2: 4.
    assert acc.accepted_per_position == (9, 7, 4)
    assert acc.per_position == pytest.approx((9 / 20, 7 / 20, 4 / 20))
    assert acc.mean_accepted_length == pytest.approx(1 + 19 / 20)


def test_vllm_per_request_metrics_with_list_or_keyed_histogram() -> None:
    # vLLM metrics.speculative_decoding: acceptance_histogram[j] = spec steps that accepted exactly j drafts.
    sd1 = {
        "num_spec_steps": 10,
        "num_accepted_draft_tokens": 19,
        "num_draft_tokens": 30,
        "acceptance_histogram": [1, 2, 3, 4],
        "mean_acceptance_length": 2.9,
    }
    sd2 = {
        "num_spec_steps": 10,
        "num_accepted_draft_tokens": 0,
        "num_draft_tokens": 30,
        "acceptance_histogram": {"0": 10},
    }
    acc = request_acceptance(
        [
            rec(0, tokens=30, extras={"metrics": {"speculative_decoding": sd1}}),
            rec(1, tokens=11, extras={"metrics": {"speculative_decoding": sd2}}),
            rec(2, tokens=50, extras={"metrics": {"other": 1}}),  # not speculative data: not counted
        ]
    )
    assert acc is not None and acc.source == "metrics:vllm"
    assert (acc.drafts, acc.accepted, acc.draft_tokens, acc.tokens, acc.requests) == (20, 19, 60, 41, 2)
    assert acc.accepted_per_position == (9, 7, 4)
    assert acc.mean_accepted_length == pytest.approx(1 + 19 / 20)
    assert acc.acceptance_rate == pytest.approx(19 / 60)


def test_sglang_older_and_oldest_meta_info() -> None:
    older = {
        "completion_tokens": 40,
        "spec_verify_ct": 16,
        "spec_accept_token_num": 24,
        "spec_draft_token_num": 48,
    }
    acc = request_acceptance([rec(0, tokens=40, extras={"meta_info": older})])
    assert acc is not None and (acc.accepted, acc.draft_tokens) == (24, 48)
    # Oldest SGLang: only spec_verify_ct; its accept length is completion_tokens / verify_ct.
    oldest = {"completion_tokens": 40, "spec_verify_ct": 16}
    acc = request_acceptance([rec(0, tokens=40, extras={"meta_info": oldest})])
    assert acc is not None
    assert acc.accepted == 24 and acc.draft_tokens is None and acc.acceptance_rate is None
    assert acc.mean_accepted_length == pytest.approx(40 / 16)


def test_sglang_sglext_details_are_read_and_unfinished_requests_count_as_no_drafts() -> None:
    nested = {
        "sglext": {
            "spec_tokens_details": {
                "spec_verify_ct": 5,
                "spec_num_correct_drafts": 10,
                "spec_num_proposed_drafts": 15,
            }
        }
    }
    no_spec = {"meta_info": {"completion_tokens": 20}}  # SGLang omits the fields when it did not speculate
    acc = request_acceptance([rec(0, tokens=16, extras=nested), rec(1, tokens=20, extras=no_spec)])
    assert acc is not None and acc.requests == 1 and acc.accepted == 10 and acc.drafts == 5


def test_warmup_records_and_lifetime_gauges_never_count() -> None:
    warm = {"meta_info": {"completion_tokens": 100, "spec_verify_ct": 25, "spec_num_correct_drafts": 75}}
    real = {"meta_info": {"completion_tokens": 100, "spec_verify_ct": 50, "spec_num_correct_drafts": 50}}
    server_info_gauge = {"internal_states": [{"avg_spec_accept_length": 4.0}]}
    t = trial([rec(0, extras=warm, warmup=True), rec(1, extras={**real, **server_info_gauge})])
    acc = trial_acceptance(t)
    assert acc is not None and acc.accepted == 50 and acc.drafts == 50


def test_level_pools_counts_instead_of_averaging_trial_ratios() -> None:
    t0 = trial(
        [
            rec(
                0,
                tokens=100,
                extras={
                    "meta_info": {
                        "completion_tokens": 100,
                        "spec_verify_ct": 90,
                        "spec_num_correct_drafts": 10,
                    }
                },
            )
        ],
        index=0,
    )
    t1 = trial(
        [
            rec(
                0,
                tokens=300,
                extras={
                    "meta_info": {
                        "completion_tokens": 300,
                        "spec_verify_ct": 100,
                        "spec_num_correct_drafts": 200,
                    }
                },
            )
        ],
        index=1,
    )
    acc = level_acceptance(LevelResult(1, (t0, t1)))
    assert acc is not None
    assert acc.mean_accepted_length == pytest.approx(1 + 210 / 190)
    assert acc.window_s == pytest.approx(20.0)


def test_level_says_when_some_trials_had_no_data() -> None:
    with_data = trial(
        [rec(0, extras={"meta_info": {"completion_tokens": 100, "spec_verify_ct": 50}})], index=0
    )
    without = trial([rec(0)], index=1)
    acc = level_acceptance(LevelResult(1, (with_data, without)))
    assert acc is not None and any("1 of 2 trials" in n for n in acc.notes)
    assert level_acceptance(LevelResult(1, (without,))) is None
