"""The ordered diagnosis: engaged, acceptance, step cost, erosion, config drift (spec-decoding.md §5)."""

from __future__ import annotations

import pytest
from spec_fakes import rec, throughput_run, trial

from tokbench.cli.spec import resolved_diff
from tokbench.records import ErrorKind
from tokbench.spec.diagnose import LevelInput, agg_tok_s, classify_changes, diagnose, diagnose_levels
from tokbench.spec.scrape import Acceptance, make_acceptance
from tokbench.stats.summary import trial_figures


def acc(length: float, *, rate: float = 0.6, k: int = 3, tokens: int = 10_000) -> Acceptance:
    """Counts that give tokens-per-step `length` and acceptance rate `rate`, every step drafting k tokens."""
    steps = round(tokens / length)
    accepted = tokens - steps
    return make_acceptance(
        "test",
        drafts=steps,
        draft_tokens=round(accepted / rate) if rate else steps * k,
        accepted=accepted,
        tokens=tokens,
    )


def test_the_seed_case_names_step_cost_at_every_level() -> None:
    # 172.2 vs 172.1 tok/s at C=1 ... 2156 vs 2162 at C=32, drafts accepted at L ≈ 2.5.
    seed = {1: (172.2, 172.1), 4: (542.2, 541.9), 16: (1646.7, 1686.1), 32: (2156.4, 2162.3)}
    levels = [LevelInput(c, b, s, acc(2.5)) for c, (b, s) in seed.items()]
    diags = diagnose_levels(levels)
    for d in diags:
        assert d.headline is not None and d.headline.check == "step_cost"
        assert d.step_cost == pytest.approx(d.length / d.speedup)  # type: ignore[operator]
        assert d.step_cost == pytest.approx(2.5, rel=0.03)
        assert "r = 2.4" in d.headline.message or "r = 2.5" in d.headline.message
    assert "erosion" not in {c for d in diags for c in d.checks}


def test_not_engaged_and_no_data_stop_before_acceptance_checks() -> None:
    zero = make_acceptance("prometheus:llamacpp", drafts=0, draft_tokens=0, accepted=0, tokens=5000)
    d_zero, d_none = diagnose_levels([LevelInput(1, 100.0, 99.0, zero), LevelInput(4, 300.0, 301.0, None)])
    assert d_zero.checks == ("not_engaged",)
    assert "0 drafts over 5000 tokens" in d_zero.findings[0].message
    assert d_none.checks == ("no_data",)
    assert d_zero.length is None and d_zero.step_cost is None


def test_low_acceptance() -> None:
    (d,) = diagnose_levels([LevelInput(1, 100.0, 80.0, acc(1.05, rate=0.02))])
    assert d.headline is not None and d.headline.check == "low_acceptance"
    assert d.headline.figures["length"] == pytest.approx(1.05, abs=0.01)
    assert "step_cost" not in d.checks


def test_high_acceptance_with_a_slowdown_blames_the_draft_cost() -> None:
    # The llama.cpp same-model draft: ~100% accepted, 79 -> 38 tok/s.
    (d,) = diagnose_levels([LevelInput(1, 79.0, 38.0, acc(3.76, rate=1.0))])
    assert d.headline is not None and d.headline.check == "step_cost"
    assert "acceptance is 100%" in d.headline.message
    assert "drafting costs about as much as the target" in d.headline.message
    assert d.headline.figures["step_cost"] == pytest.approx(3.76 / (38 / 79), rel=0.01)


def test_a_paying_configuration_is_reported_as_such() -> None:
    (d,) = diagnose_levels([LevelInput(1, 79.0, 136.0, acc(2.0))])
    assert d.checks == ("speedup",)
    assert d.headline is not None and not d.headline.problem


def test_erosion_from_step_cost_as_concurrency_grows() -> None:
    # ngram-simple on llama.cpp: 79 -> 136 at C=1, 98 -> 116 at C=4, acceptance unchanged.
    diags = diagnose_levels([LevelInput(1, 79.0, 136.0, acc(2.0)), LevelInput(4, 98.0, 116.0, acc(2.0))])
    assert "erosion" not in diags[0].checks
    erosion = next(f for f in diags[1].findings if f.check == "erosion")
    assert erosion.figures["from_speedup"] == pytest.approx(136 / 79)
    assert erosion.figures["speedup"] == pytest.approx(116 / 98)
    assert "each step got costlier" in erosion.message
    assert diags[1].headline is not None and diags[1].headline.check == "erosion"


def test_erosion_from_falling_acceptance() -> None:
    diags = diagnose_levels([LevelInput(1, 100.0, 200.0, acc(2.6)), LevelInput(8, 400.0, 560.0, acc(1.8))])
    erosion = next(f for f in diags[1].findings if f.check == "erosion")
    assert "acceptance dropped" in erosion.message


def test_no_erosion_when_the_lower_level_did_not_gain_either() -> None:
    diags = diagnose_levels([LevelInput(1, 100.0, 101.0, acc(2.5)), LevelInput(4, 300.0, 250.0, acc(2.5))])
    assert "erosion" not in diags[1].checks


def test_statistical_verdict_decides_near_one_and_small_gains_of_a_large_l_are_step_cost() -> None:
    (fast,) = diagnose_levels([LevelInput(1, 100.0, 112.0, acc(1.4), verdict="faster")])
    assert fast.checks == ("speedup",)
    (flat,) = diagnose_levels([LevelInput(1, 100.0, 112.0, acc(1.4), verdict="no_difference")])
    assert flat.checks == ("step_cost",)
    # Significantly faster, but 3% out of the 150% that L = 2.5 promises.
    (small,) = diagnose_levels([LevelInput(1, 100.0, 103.0, acc(2.5), verdict="faster")])
    assert small.checks == ("step_cost",)
    assert small.findings[0].figures["realized"] == pytest.approx(0.03 / 1.5, rel=0.02)


def test_configuration_drift_names_what_changed_beyond_the_speculative_flags() -> None:
    base = {
        "argv": ["python", "-m", "sglang.launch_server", "--model", "m", "--port", "30000"],
        "resolved": {
            "attention_backend": "trtllm_mha",
            "page_size": 64,
            "port": 30000,
            "speculative_algorithm": None,
            "cuda_graph_bs": [1, 2, 4],
            "internal_states": [{"avg_spec_accept_length": 1.0}],
        },
    }
    spec = {
        "argv": [
            "python",
            "-m",
            "sglang.launch_server",
            "--model",
            "m",
            "--port",
            "30001",
            "--speculative-algorithm",
            "NEXTN",
            "--cuda-graph-bs",
            "1,2",
        ],
        "env": {"SGLANG_ENABLE_SPEC_V2": "1"},
        "resolved": {
            "attention_backend": "triton",
            "page_size": 1,
            "port": 30001,
            "speculative_algorithm": "EAGLE",
            "cuda_graph_bs": [1, 2],
            "internal_states": [{"avg_spec_accept_length": 2.7}],
        },
    }
    base_run = throughput_run({1: 229.0}, label="base", server=base)
    spec_run = throughput_run({1: 119.0}, label="spec", server=spec)
    diff = resolved_diff(base_run, spec_run)
    assert diff is not None
    changes = {c.key: c for c in classify_changes(diff)}
    # port (volatile) and internal_states (live gauges) are not configuration
    assert set(changes) == {"attention_backend", "page_size", "speculative_algorithm", "cuda_graph_bs"}
    assert (
        changes["speculative_algorithm"].expected and changes["cuda_graph_bs"].expected
    )  # changed on purpose
    assert not changes["attention_backend"].expected and not changes["page_size"].expected
    diags = diagnose(base_run, spec_run, config_diff=diff)
    drift = next(f for f in diags[0].findings if f.check == "config_drift")
    assert "attention_backend: trtllm_mha → triton" in drift.message
    assert "page_size: 64 → 1" in drift.message
    assert "speculative_algorithm" not in drift.message


def test_diagnose_from_runs_takes_speedup_from_throughput_and_acceptance_from_records() -> None:
    meta = {
        "meta_info": {
            "completion_tokens": 100,
            "spec_verify_ct": 40,
            "spec_num_correct_drafts": 60,
            "spec_num_proposed_drafts": 120,
        }
    }
    base = throughput_run({1: 100.0, 4: 300.0}, label="base")
    spec = throughput_run({1: 180.0, 4: 310.0}, label="spec", extras=meta)
    d1, d4 = diagnose(base, spec)
    assert d1.speedup == pytest.approx(1.8, rel=0.01)
    assert d1.acceptance is not None and d1.acceptance.source == "meta_info:sglang"
    assert d1.checks == ("speedup",)
    assert d4.checks == ("step_cost", "erosion")  # no gain at all (S < 1.05): step cost first
    # A baseline that drafted is not a baseline.
    (b1,) = diagnose(
        throughput_run({1: 100.0}, label="b", extras=meta), throughput_run({1: 150.0}, label="s")
    )
    assert b1.checks[0] == "baseline_engaged"


def test_own_agg_throughput_matches_the_statistics_definition() -> None:
    t = trial(
        [
            rec(0, tokens=120, end_s=2.0),
            rec(1, tokens=80, end_s=3.5),
            rec(2, tokens=50, error=ErrorKind.DISCONNECT),
            rec(3, tokens=999, warmup=True, end_s=9.0),
        ],
        window_s=4.0,
    )
    assert agg_tok_s(t) == pytest.approx(trial_figures(t).agg_tok_s)
    assert agg_tok_s(t) == pytest.approx(200 / 3.5)


def test_per_launch_values_of_llamacpp_props_are_not_drift() -> None:
    # llama.cpp's /props draws a new media_marker at every launch; it is not configuration.
    base = {
        "argv": ["llama-server"],
        "resolved": {"props": {"media_marker": "<__media_abc__>", "n_ctx": 8192}},
    }
    spec = {
        "argv": ["llama-server"],
        "resolved": {"props": {"media_marker": "<__media_xyz__>", "n_ctx": 4096}},
    }
    diff = resolved_diff(
        throughput_run({1: 1.0}, label="a", server=base), throughput_run({1: 1.0}, label="b", server=spec)
    )
    assert [key for key, *_ in diff or []] == ["props.n_ctx"]
