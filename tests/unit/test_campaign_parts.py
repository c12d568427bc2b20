"""Campaign pieces that need no server: the launch schedule, what counts as a spoiled trial, redaction, and
the checklist's wording (computed from verdicts, failures and config diffs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokbench.campaign.outputs import Outcome, checklist, checklist_line, level_detail, verdict_phrase
from tokbench.campaign.run import Failure, redact_argv, redact_env, spoiled
from tokbench.campaign.schedule import schedule
from tokbench.config import Plan, ServerSpec
from tokbench.records import ErrorKind, LevelResult, RequestRecord, RunMeta, RunResult, TrialResult
from tokbench.server.diagnose import Triage
from tokbench.server.engines import ConfigDifference
from tokbench.stats.compare import LevelVerdict


def cfg(name: str, **kw: Any) -> ServerSpec:
    return ServerSpec(name=name, argv=["x", "--port", "{port}"], **kw)


def plan(**kw: Any) -> Plan:
    return Plan(configs=[cfg("a"), cfg("b")], sweep={"concurrencies": [1, 4], **kw.pop("sweep", {})}, **kw)


# ---- schedule ----------------------------------------------------------------------------------------------


def test_interleaved_alternates_abba_one_trial_per_level_per_launch() -> None:
    launches = schedule(plan(trials=3))
    assert [lp.config for lp in launches] == ["a", "b", "b", "a", "a", "b"]
    assert [lp.cells for lp in launches[:2]] == [((1, 0), (4, 0))] * 2
    assert launches[2].cells == ((1, 1), (4, 1)) and launches[5].cells == ((1, 2), (4, 2))
    assert [lp.config for lp in schedule(plan(trials=2, alternate=False))] == ["a", "b", "a", "b"]


def test_interleaved_keeps_the_sweeps_level_order() -> None:
    launches = schedule(plan(trials=2, sweep={"order": "shuffled", "seed": 3, "concurrencies": [1, 2, 4, 8]}))
    orders = [tuple(c for c, _ in lp.cells) for lp in launches]
    assert orders[0] == orders[1] and orders[2] == orders[3]  # A and B measure a round in the same order
    assert sorted(orders[0]) == [1, 2, 4, 8]


def test_blocked_runs_all_trials_per_launch_then_a_closing_baseline() -> None:
    launches = schedule(plan(trials=2, design="blocked"))
    assert [(lp.config, lp.run) for lp in launches] == [("a", "a"), ("b", "b"), ("a", "a-closing")]
    assert launches[0].cells == ((1, 0), (4, 0), (1, 1), (4, 1))
    assert launches[2].cells == launches[0].cells


# ---- spoiled trials ----------------------------------------------------------------------------------------


def rec(i: int, kind: ErrorKind | None = None) -> RequestRecord:
    return RequestRecord(i, f"p{i}", 0, 0, 10, completion_tokens=None if kind else 8, error_kind=kind)


def trial(*records: RequestRecord) -> TrialResult:
    return TrialResult(4, 0, 0, 0.0, 0, 10, tuple(records))


def test_dead_server_with_failed_requests_spoils_the_trial() -> None:
    t = trial(rec(0), rec(1), rec(2, ErrorKind.DISCONNECT), rec(3, ErrorKind.CONNECT))
    assert spoiled(t, alive=False)
    assert not spoiled(trial(rec(0), rec(1)), alive=False)  # died after the trial finished cleanly


def test_live_but_unreachable_server_spoils_the_trial() -> None:
    assert spoiled(trial(rec(0), rec(1, ErrorKind.CONNECT), rec(2, ErrorKind.CONNECT)), alive=True)
    # a live server that answers some requests with errors is data, not a crash
    assert not spoiled(
        trial(rec(0), rec(1), rec(2, ErrorKind.HTTP_STATUS), rec(3, ErrorKind.CONNECT)), alive=True
    )


def test_secrets_are_redacted() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "sk-123", "--hf-token=hf_abc", "--port", "8000"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "8000"]
    assert redact_env({"HF_TOKEN": "hf_abc", "SGLANG_ENABLE_SPEC_V2": "1"}) == {
        "HF_TOKEN": "***",
        "SGLANG_ENABLE_SPEC_V2": "1",
    }


# ---- wording -----------------------------------------------------------------------------------------------


def verdict(
    c: int, word: str, delta: float, lo: float | None, hi: float | None, needed: int | None = None
) -> Any:
    return LevelVerdict(c, "agg_tok_s", word, delta, lo, hi, None, None, needed)


def test_no_detectable_benefit_line_like_the_seed() -> None:
    vs = [
        verdict(1, "no_difference", 0.1, -1.2, 1.4),
        verdict(4, "no_difference", -0.06, -1.0, 0.9),
        verdict(16, "no_difference", 0.4, -1.5, 1.9),
        verdict(32, "no_difference", 0.3, -0.8, 1.3),
    ]
    assert verdict_phrase(vs) == (
        "no detectable benefit at C=1..32 (C=1 +0.1% [-1.2, +1.4]; C=4 -0.1% [-1.0, +0.9]; C=16 +0.4% "
        "[-1.5, +1.9]; C=32 +0.3% [-0.8, +1.3])"
    )


def test_mixed_verdicts_name_each_group() -> None:
    vs = [
        verdict(1, "faster", 35.0, 30.1, 40.2),
        verdict(4, "inconclusive", 3.0, -1.0, 7.0, needed=9),
        verdict(16, "slower", -8.0, -10.0, -6.0),
    ]
    text = verdict_phrase(vs)
    assert text.startswith(
        "faster at C=1, slower at C=16, inconclusive at C=4 (~9 trials per side would decide)"
    )
    assert level_detail(verdict(2, "insufficient_data", 1.5, None, None)) == "C=2 +1.5%"


@dataclass
class _Headline:
    check: str
    message: str


@dataclass
class _LevelDiag:
    concurrency: int
    headline: _Headline
    acceptance: object = None


def run_with(levels: dict[int, int]) -> RunResult:
    meta = RunMeta("r", "x", "0", "2026-01-01T00:00:00+00:00")
    lv = tuple(
        LevelResult(c, tuple(TrialResult(c, t, 0, 0.0, 0, 1) for t in range(n))) for c, n in levels.items()
    )
    return RunResult(meta, lv)


def test_checklist_lines_for_failures_diffs_and_spec() -> None:
    base = Outcome("base", cfg("base"), True, run_with({1: 3, 32: 3}), ((1, 0),))
    assert checklist_line(base, "base") == "- base: baseline (generic; C=1,32, 3 trials per level)"

    t = Triage("AssertionError (assert failed at server_args.py:2315: x is None)", 1, ("AssertionError",))
    crashed = Outcome(
        "nextn", cfg("nextn"), False, None, ((1, 0),),
        failures=[Failure("nextn", "start", t.root_cause or "", "logs/nextn-1.log", t)],
    )  # fmt: skip
    assert checklist_line(crashed, "base") == (
        "- nextn: crashed at start: AssertionError (assert failed at server_args.py:2315: x is None) (see "
        "logs/nextn-1.log)"
    )

    spec_cfg = ServerSpec(name="mtp", argv=["x", "--speculative-algorithm", "NEXTN", "--port", "{port}"])
    tested = Outcome(
        "mtp", spec_cfg, False, run_with({1: 2, 4: 1}), ((1, 0), (1, 1), (4, 0), (4, 1)),
        failures=[Failure("mtp", "crash", "RuntimeError: NCCL timeout", "logs/mtp-2.log", None, (4, 0),
                          True)],
        verdicts=[verdict(1, "no_difference", 0.5, -1.0, 1.9), verdict(4, "no_difference", 0.2, -1.1, 1.5)],
        diff=[
            ConfigDifference("server_info.attention_backend", "trtllm_mha", "triton", expected=False),
            ConfigDifference("server_info.speculative_algorithm", None, "EAGLE", expected=True),
        ],
        spec_levels=[_LevelDiag(c, _Headline("step_cost", f"step cost too high at {c}")) for c in (1, 4)],
        warnings=["-md without --spec-type (fix: add --spec-type draft-simple)"],
    )  # fmt: skip
    line = checklist_line(tested, "base")
    head, *extras = line.split("\n")
    assert (
        head
        == "- mtp: tested, no detectable benefit at C=1,4 (C=1 +0.5% [-1.0, +1.9]; C=4 +0.2% [-1.1, +1.5])"
    )
    assert extras == [
        "  - server died at C=4 trial 1: RuntimeError: NCCL timeout (see logs/mtp-2.log); restarted, and "
        "that cell was re-run",
        "  - incomplete, not measured: C=4 trial 2",
        "  - resolved configuration differs beyond the changed flags: server_info.attention_backend: "
        "trtllm_mha → triton",
        "  - speculation: C=1,4: step cost too high at 1",
        "  - preflight warning: -md without --spec-type (fix: add --spec-type draft-simple)",
    ]

    p = Plan(configs=[cfg("base"), spec_cfg, cfg("nextn")], trials=3)
    text = checklist(p, [base, tested, crashed], drift=None, interrupted=True)
    assert "**Interrupted**" in text
    assert text.count("\n- ") == 3
