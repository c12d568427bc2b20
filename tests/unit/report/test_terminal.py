"""Golden renders of the terminal tables at a fixed width (rich Console(width=120, record=True))."""

# ruff: noqa: E501  (the golden tables are 120 columns wide by design)
from __future__ import annotations

import dataclasses
import io

from rich.console import Console

from tokbench.records import ErrorKind, LevelResult, RequestRecord, RunMeta, RunResult, TrialResult
from tokbench.report.terminal import calibration_table, seed_table, verdict_notes, verdict_table
from tokbench.stats.compare import compare_runs
from tokbench.stats.power import calibrate

MS = 1_000_000


def _render(renderable: object) -> str:
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).rstrip("\n")


def _req(index: int, sent_ms: int, tokens: int = 10, ttft_ms: int = 50, itl_ms: int = 10) -> RequestRecord:
    chunks = tuple((sent_ms + ttft_ms + i * itl_ms) * MS for i in range(tokens))
    return RequestRecord(
        index=index, prompt_id=f"p{index}", scheduled_ns=sent_ms * MS, sent_ns=sent_ms * MS, end_ns=chunks[-1],
        first_token_ns=chunks[0], chunk_ns=chunks, chunk_tokens=(1,) * tokens, completion_tokens=tokens,
    )  # fmt: skip


def _trial(c: int, k: int, records: list[RequestRecord], client_limited: bool = False) -> TrialResult:
    end = max(r.end_ns for r in records)
    return TrialResult(
        c, k, k, 0.0, 0, end, tuple(records), loop_lag_p99_ms=80.0, client_limited=client_limited
    )


def _meta(label: str, source: str = "tokbench") -> RunMeta:
    return RunMeta(run_id="r1", label=label, tool_version="t", started_at="", source=source)


def test_seed_table_single_trial() -> None:
    # C=1: two requests back to back, 10 tokens each: 50 ms to the first token, then 10 ms per token.
    c1 = _trial(1, 0, [_req(0, 0), _req(1, 140)])
    # C=2: one request timed out after 4 tokens; the client lagged (client-limited). Both slots were busy only
    # until the failure at 80 ms: steady state = 4 tokens in 80 ms = 50 tok/s.
    bad = dataclasses.replace(_req(1, 0, tokens=4), error_kind=ErrorKind.TIMEOUT)
    c2 = _trial(2, 0, [_req(0, 0), bad, _req(2, 140)], client_limited=True)
    run = RunResult(_meta("baseline"), (LevelResult(1, (c1,)), LevelResult(2, (c2,))))
    expected = """\
                                                        baseline

  C   Agg tok/s   Steady tok/s   Per-req tok/s   Tokens   Wall(s)   Ok   TTFT p50 ms   ITL p50 ms   Flags, errors
 ──────────────────────────────────────────────────────────────────────────────────────────────────────────────────────
  1        71.4           71.4            71.4       20       0.3    2          50.0         10.0
  2        71.4           50.0            71.4       20       0.3    2          50.0         10.0   client-limited;
                                                                                                    timeout 1

                 one trial per level: no interval, and compare needs 2+ a side (run --trials 3 or more)"""
    assert _render(seed_table(run)) == expected


def test_seed_table_several_trials_shows_mean_and_half_width() -> None:
    # Three trials per level whose requests differ only in per-token latency: 10, 11 and 12 ms.
    trials = [_trial(1, k, [_req(0, 0, itl_ms=itl), _req(1, 50 + 9 * itl, itl_ms=itl)])
              for k, itl in enumerate((10, 11, 12))]  # fmt: skip
    run = RunResult(_meta("spec"), (LevelResult(1, tuple(trials)),))
    expected = """\
                                                 spec

  C   K   Agg tok/s   Steady tok/s   Per-req tok/s   Tokens   Wall(s)   Ok   TTFT p50 ms   ITL p50 ms
 ─────────────────────────────────────────────────────────────────────────────────────────────────────
  1   3   67.3±10.1      67.3±10.1       67.3±10.1       20       0.3    6      50.0±0.0     11.0±2.5

        mean±95% CI half-width over K trials (Student t); Tokens, Wall(s) per trial; Ok summed"""
    assert _render(seed_table(run)) == expected


def _imported(label: str, values: dict[int, list[float]]) -> RunResult:
    levels = tuple(
        LevelResult(
            c, tuple(TrialResult(c, k, k, 0.0, 0, 0, imported={"agg_tok_s": v}) for k, v in enumerate(vs))
        )
        for c, vs in values.items()
    )
    return RunResult(_meta(label, source=f"import:{label}.md"), levels)


def test_seed_table_of_an_import_leaves_out_empty_columns() -> None:
    run = _imported("baseline", {1: [172.2], 32: [2156.4]})
    expected = """\
     baseline

   C   Agg tok/s
 ────────────────
   1       172.2
  32      2156.4

  imported from
   baseline.md:
 summary figures
       only"""
    assert _render(seed_table(run)) == expected


def test_verdict_table_and_notes() -> None:
    a = _imported("base", {1: [100, 101, 99], 4: [400, 401, 399], 16: [1000, 1060, 950], 32: [2156.4]})
    b = _imported("spec", {1: [110, 111, 109], 4: [400.5, 400, 401], 16: [1030, 980, 1070], 32: [2162.3]})
    verdicts = compare_runs(a, b)
    expected = """\
                              agg_tok_s (higher is better): B spec vs A base, margin ±2%

   C              A: base              B: spec   Change            95% CI   Verdict             Note
 ─────────────────────────────────────────────────────────────────────────────────────────────────────────────────────
   1      100.0±2.5 (K=3)      110.0±2.5 (K=3)   +10.0%   [+7.6%, +12.4%]   faster
   4      400.0±2.5 (K=3)      400.5±1.2 (K=3)    +0.1%    [-0.4%, +0.6%]   no difference
  16   1003.3±136.8 (K=3)   1026.7±112.0 (K=3)    +2.3%   [-8.8%, +14.8%]   inconclusive        needs ~73 trials/side
  32         2156.4 (K=1)         2162.3 (K=1)    +0.3%                 -   insufficient data"""
    assert _render(verdict_table(verdicts, "base", "spec")) == expected
    assert verdict_notes(verdicts) == [
        "C=32: 1 trial(s) in A and 1 in B: a verdict needs 2+ a side (3+ recommended); one run each cannot tell "
        "a change from run-to-run noise"
    ]


def test_calibration_table() -> None:
    run = _imported("aa", {1: [100.0, 102.0, 98.0, 101.0, 99.0], 4: [400.0, 404.0, 396.0]})
    expected = """\
                        A/A calibration of agg_tok_s (compare margin ±2%)

  C   Trials    Mean   CV %   CV 95% upper %   A/B CI ±% at K   MDE % at K   K for 3%   Drift %
 ───────────────────────────────────────────────────────────────────────────────────────────────
  1        5   100.0   1.58             3.75             2.33         3.35          6     -1.19
  4        3   400.0   1.00             4.42             2.29         3.53          4         -"""
    assert _render(calibration_table(calibrate(run, detect_pct=3.0), "agg_tok_s")) == expected
