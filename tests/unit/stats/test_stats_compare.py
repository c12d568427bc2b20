"""compare_runs on record-built runs: verdict words, warnings, paired per-prompt deltas, JSON form."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from stats_fakes import closed_loop_trial, record, run_of, speed_trial

from tokbench.errors import ConfigError
from tokbench.records import ErrorKind, RunResult, TrialResult
from tokbench.stats.compare import compare_runs, run_warnings, verdict_to_dict

SPEEDS_A = (1.00, 1.01, 0.99, 1.005)


def _run(speed: float, levels: tuple[int, ...] = (1, 4)) -> RunResult:
    return run_of([speed_trial(c, k, speed * s) for c in levels for k, s in enumerate(SPEEDS_A)])


def test_faster_slower_and_no_difference_on_throughput() -> None:
    a = _run(1.0)
    faster = compare_runs(a, _run(1.10))
    assert [v.verdict for v in faster] == ["faster", "faster"]
    for v in faster:
        assert v.ci_low_pct is not None and v.ci_high_pct is not None and v.delta_pct is not None
        assert 0 < v.ci_low_pct < v.delta_pct < v.ci_high_pct
        assert v.a is not None and v.b is not None
        assert v.delta_pct == pytest.approx(100 * (v.b.mean / v.a.mean - 1))
    assert [v.verdict for v in compare_runs(a, _run(0.90))] == ["slower", "slower"]
    same = compare_runs(a, _run(1.0))
    assert [v.verdict for v in same] == ["no_difference", "no_difference"]
    assert all(v.delta_pct == pytest.approx(0.0, abs=1e-9) for v in same)


def test_latency_metrics_call_lower_faster() -> None:
    a, b = _run(1.0), _run(1.10)
    for v in compare_runs(a, b, metric="e2e_p50"):
        assert v.verdict == "faster" and v.delta_pct is not None and v.delta_pct < 0
        assert not v.higher_is_better
    assert all(v.verdict == "slower" for v in compare_runs(b, a, metric="itl_p50"))


def test_one_trial_a_side_is_insufficient_data_with_the_point_change() -> None:
    a = run_of([speed_trial(4, 0, 1.0)])
    b = run_of([speed_trial(4, 0, 1.2)])
    (v,) = compare_runs(a, b)
    assert v.verdict == "insufficient_data"
    assert v.ci_low_pct is None and v.trials_needed is None
    assert v.a is not None and v.b is not None
    assert v.delta_pct == pytest.approx(100 * (v.b.mean / v.a.mean - 1))
    assert any("2+ a side" in w for w in v.warnings)


def test_levels_missing_on_one_side() -> None:
    a = _run(1.0, levels=(1, 4, 16))
    b = _run(1.0, levels=(1, 4))
    verdicts = compare_runs(a, b)
    assert [v.concurrency for v in verdicts] == [1, 4, 16]
    last = verdicts[-1]
    assert last.verdict == "insufficient_data" and last.b is None
    assert any("not measured in B" in w for w in last.warnings)


def test_inconclusive_reports_trials_needed() -> None:
    a = run_of([speed_trial(1, k, s) for k, s in enumerate((1.0, 1.06, 0.95))])
    b = run_of([speed_trial(1, k, s) for k, s in enumerate((1.03, 0.98, 1.07))])
    (v,) = compare_runs(a, b)
    assert v.verdict == "inconclusive"
    assert v.trials_needed is not None and v.trials_needed > 3


def test_equal_work_warning_when_tokens_differ_over_1_percent() -> None:
    a = run_of([speed_trial(4, k, s, tokens=20) for k, s in enumerate(SPEEDS_A)])
    b = run_of([speed_trial(4, k, s, tokens=18) for k, s in enumerate(SPEEDS_A)])
    (v,) = compare_runs(a, b)
    assert any(w.startswith("unequal work") and "-10.0%" in w for w in v.warnings)
    (same,) = compare_runs(a, a)
    assert not any(w.startswith("unequal work") for w in same.warnings)


def test_client_limited_and_error_warnings() -> None:
    limited = closed_loop_trial(4, 8, trial=1, client_limited=True)
    recs = list(limited.records)
    recs[0] = dataclasses.replace(recs[0], error_kind=ErrorKind.STALL)
    bad = dataclasses.replace(limited, records=tuple(recs))
    a = run_of([closed_loop_trial(4, 8, trial=k) for k in range(3)])
    b = run_of([closed_loop_trial(4, 8, trial=0), bad, closed_loop_trial(4, 8, trial=2)])
    (v,) = compare_runs(a, b)
    assert any("B: trial(s) 1 client-limited" in w for w in v.warnings)
    assert any("B: 1 of 24 requests failed (stall 1)" in w for w in v.warnings)
    assert not any(w.startswith("A:") for w in v.warnings)


def test_paired_deltas_when_prompts_match() -> None:
    # B answers every prompt 2 ms sooner to the first token and 20 ms sooner overall.
    a = run_of([closed_loop_trial(2, 4, trial=k, ttft_ms=50, itl_ms=10, tokens=21) for k in range(3)])
    b = run_of([closed_loop_trial(2, 4, trial=k, ttft_ms=48, itl_ms=9.1, tokens=21) for k in range(3)])
    (v,) = compare_runs(a, b)
    by_figure = {p.figure: p for p in v.paired}
    assert by_figure["ttft_ms"].median_delta_ms == pytest.approx(-2.0)
    assert by_figure["e2e_ms"].median_delta_ms == pytest.approx(-20.0)
    assert by_figure["e2e_ms"].n_pairs == 12
    assert by_figure["e2e_ms"].median_change_pct == pytest.approx(100 * (230 / 250 - 1))


def test_no_pairing_when_prompt_order_differs() -> None:
    a = run_of([closed_loop_trial(2, 4, trial=k) for k in range(3)])
    b = run_of([closed_loop_trial(2, 4, trial=k, prompt_prefix="other") for k in range(3)])
    (v,) = compare_runs(a, b)
    assert v.paired == ()


def test_paired_deltas_skip_requests_failed_on_either_side() -> None:
    def trial(k: int, fail: bool) -> TrialResult:
        t = closed_loop_trial(1, 4, trial=k)
        if not fail:
            return t
        recs = list(t.records)
        recs[2] = dataclasses.replace(recs[2], error_kind=ErrorKind.DISCONNECT)
        return dataclasses.replace(t, records=tuple(recs))

    a = run_of([trial(k, False) for k in range(2)])
    b = run_of([trial(k, k == 1) for k in range(2)])
    (v,) = compare_runs(a, b)
    assert {p.n_pairs for p in v.paired} == {7}


def test_verdict_json_keys_and_values() -> None:
    (v, _) = compare_runs(_run(1.0), _run(1.1))
    d = verdict_to_dict(v)
    assert list(d)[:5] == ["concurrency", "verdict", "delta_pct", "ci_low_pct", "ci_high_pct"]
    assert d["concurrency"] == 1 and d["verdict"] == "faster"
    assert d["a_trials"] == d["b_trials"] == 4
    assert d["a_mean"] == pytest.approx(float(np.mean(d["a_values"])))
    json.dumps(d, allow_nan=False)  # strict JSON: no NaN sneaks in


def test_bad_metric_or_margin_is_a_config_error() -> None:
    a = _run(1.0)
    with pytest.raises(ConfigError, match="--metric"):
        compare_runs(a, a, metric="goodput")
    with pytest.raises(ConfigError, match="--margin"):
        compare_runs(a, a, margin_pct=-1)


def test_run_warnings_name_workload_differences_and_incomplete_runs() -> None:
    a = run_of([speed_trial(1, 0, 1.0)], "a", load={"max_tokens": 1000, "ignore_eos": True})
    b = run_of([speed_trial(1, 0, 1.0)], "b", load={"max_tokens": 500, "ignore_eos": True})
    b = dataclasses.replace(b, meta=dataclasses.replace(b.meta, complete=False))
    warnings = run_warnings(a, b)
    assert any("max_tokens is 1000 in A, 500 in B" in w for w in warnings)
    assert any(w.startswith("B (b) is incomplete") for w in warnings)
    assert not any("ignore_eos" in w for w in warnings)


def test_margin_decides_between_no_difference_and_a_direction() -> None:
    # A real 1% gain measured precisely: inside a 2% margin it is "no difference", with no margin "faster".
    a = run_of([speed_trial(16, k, s) for k, s in enumerate((1.0, 1.001, 0.999, 1.0005))])
    b = run_of([speed_trial(16, k, 1.01 * s) for k, s in enumerate((1.0, 1.001, 0.999, 1.0005))])
    assert compare_runs(a, b, margin_pct=2.0)[0].verdict == "no_difference"
    assert compare_runs(a, b, margin_pct=0.0)[0].verdict == "faster"


def test_imported_runs_compare_by_their_figures() -> None:
    def imported(values: list[float]) -> RunResult:
        trials = [TrialResult(1, k, k, 0.0, 0, 0, imported={"agg_tok_s": v}) for k, v in enumerate(values)]
        return run_of(trials)

    (v,) = compare_runs(imported([100, 101, 99]), imported([120, 121, 119]))
    assert v.verdict == "faster" and v.delta_pct == pytest.approx(20.0)
    (lat,) = compare_runs(imported([100, 101]), imported([100, 101]), metric="ttft_p50")
    assert lat.verdict == "insufficient_data" and lat.a is None


def test_record_helper_sanity() -> None:
    # The fakes themselves: a record's end is its last chunk.
    r = record(0, 0, ttft_ms=5, itl_ms=2, tokens=4)
    assert r.end_ns == r.chunk_ns[-1] == (5 + 3 * 2) * 1_000_000
