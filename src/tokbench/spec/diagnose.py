"""Why speculation did or did not pay off, per level, in the order of spec-decoding.md §5.

The core, `diagnose_levels`, is pure over per-level inputs (throughputs, acceptance); `diagnose` builds those
inputs from two runs. Each finding carries the figures that support it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tokbench.records import RunResult, TrialResult
from tokbench.spec.scrape import Acceptance, level_acceptance

# L below this: drafts are essentially all rejected.
LOW_ACCEPTANCE_L = 1.2
# S below this counts as "no speedup" when no verdict from the statistics is given.
NO_GAIN_S = 1.05
# Below this share of the gain L promises ((S - 1) / (L - 1)), the step cost ate the speedup.
MIN_REALIZED = 0.25
# A level's S this far (relative) below the best S at lower concurrency is erosion.
EROSION_FRACTION = 0.05
# Acceptance this high with a slowdown means the draft itself is the cost.
HIGH_ACCEPTANCE_RATE = 0.9

PROBLEMS = (
    "baseline_engaged",
    "no_data",
    "not_engaged",
    "low_acceptance",
    "step_cost",
    "erosion",
    "config_drift",
)


@dataclass(frozen=True)
class Finding:
    check: str  # one of PROBLEMS, or "speedup" (information: speculation paid off)
    message: str
    figures: Mapping[str, Any] = field(default_factory=dict)

    @property
    def problem(self) -> bool:
        return self.check in PROBLEMS


@dataclass(frozen=True)
class LevelInput:
    """What the diagnosis needs for one level; `verdict`: the statistics' word (spec vs baseline)."""

    concurrency: int
    baseline_tok_s: float | None
    spec_tok_s: float | None
    acceptance: Acceptance | None
    verdict: str | None = None
    baseline_acceptance: Acceptance | None = None


@dataclass(frozen=True)
class LevelDiagnosis:
    concurrency: int
    acceptance: Acceptance | None
    baseline_tok_s: float | None
    spec_tok_s: float | None
    speedup: float | None  # S = spec / baseline throughput
    length: float | None  # L (Acceptance.length)
    step_cost: float | None  # r = L / S
    findings: tuple[Finding, ...]

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(f.check for f in self.findings)

    @property
    def headline(self) -> Finding | None:
        """The first problem in diagnosis order, else the first finding."""
        return next((f for f in self.findings if f.problem), self.findings[0] if self.findings else None)


@dataclass(frozen=True)
class ConfigChange:
    key: str
    baseline: Any
    spec: Any
    expected: bool  # a speculative setting or a flag the configurations changed on purpose


# ---- the ordered checks --------------------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _engagement(acc: Acceptance | None) -> Finding | None:
    if acc is None:
        return Finding(
            "no_data",
            "no speculative data at this level: neither counter deltas (/metrics scrapes) nor "
            "per-request acceptance (SGLang meta_info, llama.cpp timings) were recorded, so whether drafts "
            "ran is unknown; vLLM/llama.cpp: serve /metrics (llama.cpp --metrics); SGLang: use --api sglang "
            "or return_meta_info",
        )
    if not acc.engaged:
        return Finding(
            "not_engaged",
            f"speculation not engaged: 0 drafts over {acc.tokens if acc.tokens is not None else '?'} tokens "
            f"({acc.source}); check the resolved server args (llama.cpp: -md without --spec-type stays off "
            "silently, issue #25345)",
            {
                "drafts": acc.drafts,
                "draft_tokens": acc.draft_tokens,
                "tokens": acc.tokens,
                "source": acc.source,
            },
        )
    return None


def _acceptance(acc: Acceptance, L: float | None) -> Finding | None:
    if L is not None and L < LOW_ACCEPTANCE_L:
        return Finding(
            "low_acceptance",
            f"acceptance too low: L = {L:.2f} tokens per step, acceptance rate "
            f"{_fmt(acc.acceptance_rate and acc.acceptance_rate * 100, '.0f')}%: drafts are rejected (broken "
            "draft, quantization mismatch of the draft head, state rollback)",
            {
                "length": L,
                "acceptance_rate": acc.acceptance_rate,
                "accepted": acc.accepted,
                "drafts": acc.drafts,
            },
        )
    return None


def _no_gain(S: float, verdict: str | None) -> bool:
    if verdict in ("no_difference", "slower", "worse"):
        return True
    if verdict in ("faster", "better"):
        return False
    return S < NO_GAIN_S


def _step_cost(acc: Acceptance, L: float, S: float, verdict: str | None) -> Finding:
    """Step cost too high, unless speculation pays."""
    r = L / S
    realized = (S - 1) / (L - 1)  # L > 1 here (low acceptance was ruled out before)
    figures = {
        "length": L,
        "speedup": S,
        "step_cost": r,
        "realized": realized,
        "acceptance_rate": acc.acceptance_rate,
    }
    rate = acc.acceptance_rate
    if _no_gain(S, verdict) and S < 1 and rate is not None and rate >= HIGH_ACCEPTANCE_RATE:
        msg = (
            f"step cost too high: acceptance is {rate * 100:.0f}% (L = {L:.2f}) yet S = {S:.2f}: "
            f"each speculative step costs r = {r:.2f} plain steps; drafting costs about as much as "
            "the target (a draft model too close in size to the target, or sequential draft steps)"
        )
    elif _no_gain(S, verdict):
        msg = (
            f"step cost too high: L = {L:.2f} tokens per step but S = {S:.2f}: each speculative step costs "
            f"r = {r:.2f} plain steps, about the {L:.2f} tokens it yields (break-even is r = L); "
            "find out why: resolved-config diff, CUDA graphs covering concurrency x (k+1) tokens, "
            "verification cost (MoE expert union, all-reduce over PCIe)"
        )
    elif realized < MIN_REALIZED:
        msg = (
            f"step cost too high: S = {S:.2f} keeps {realized * 100:.0f}% of the gain L = {L:.2f} promises; "
            f"each speculative step costs r = {r:.2f} plain steps"
        )
    else:
        return Finding(
            "speedup",
            f"speculation pays: S = {S:.2f} with L = {L:.2f}; "
            f"each speculative step costs r = {r:.2f} plain steps",
            figures,
        )
    return Finding("step_cost", msg, figures)


def _erosion(levels: Sequence[LevelDiagnosis], cur: LevelDiagnosis) -> Finding | None:
    if cur.speedup is None:
        return None
    lower = [lv for lv in levels if lv.concurrency < cur.concurrency and lv.speedup is not None]
    if not lower:
        return None
    best = max(lower, key=lambda lv: lv.speedup or 0.0)
    assert best.speedup is not None
    if best.speedup <= NO_GAIN_S or cur.speedup >= best.speedup * (1 - EROSION_FRACTION):
        return None
    why = ""
    if best.length and cur.length and best.step_cost and cur.step_cost:
        l_drop = 1 - cur.length / best.length
        r_rise = cur.step_cost / best.step_cost - 1
        if r_rise >= l_drop:
            why = (
                f"; L {best.length:.2f} → {cur.length:.2f} while "
                f"r {best.step_cost:.2f} → {cur.step_cost:.2f}: each step got costlier with concurrency "
                "(verification turning compute-bound past a knee)"
            )
        else:
            why = f"; L fell {best.length:.2f} → {cur.length:.2f}: acceptance dropped with concurrency"
    return Finding(
        "erosion",
        f"speedup eroding as concurrency grows: S {best.speedup:.2f} at C={best.concurrency} → "
        f"{cur.speedup:.2f} at C={cur.concurrency}{why}",
        {
            "from_concurrency": best.concurrency,
            "from_speedup": best.speedup,
            "speedup": cur.speedup,
            "from_length": best.length,
            "length": cur.length,
            "from_step_cost": best.step_cost,
            "step_cost": cur.step_cost,
        },
    )


def _drift(changes: Sequence[ConfigChange]) -> Finding | None:
    unexpected = [ch for ch in changes if not ch.expected]
    if not unexpected:
        return None
    shown = "; ".join(f"{ch.key}: {_short(ch.baseline)} → {_short(ch.spec)}" for ch in unexpected[:8])
    more = f" (and {len(unexpected) - 8} more)" if len(unexpected) > 8 else ""
    return Finding(
        "config_drift",
        f"resolved configuration differs beyond the speculative settings: {shown}{more}; "
        "a speculative flag that silently switched e.g. the attention backend can cost more than "
        "speculation gains",
        {"changes": [(ch.key, ch.baseline, ch.spec) for ch in unexpected]},
    )


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= 40 else s[:37] + "..."


def diagnose_levels(
    levels: Sequence[LevelInput], config: Sequence[ConfigChange] = ()
) -> list[LevelDiagnosis]:
    """The ordered checks per level (ascending concurrency): baseline clean, engaged, acceptance, step cost,
    erosion across levels, configuration drift."""
    drift = _drift(config)
    out: list[LevelDiagnosis] = []
    for li in sorted(levels, key=lambda x: x.concurrency):
        acc = li.acceptance
        S = (
            li.spec_tok_s / li.baseline_tok_s
            if li.spec_tok_s is not None and li.baseline_tok_s and li.baseline_tok_s > 0
            else None
        )
        L = acc.length if acc is not None and acc.engaged else None
        r = L / S if L is not None and S else None
        findings: list[Finding] = []
        if li.baseline_acceptance is not None and li.baseline_acceptance.engaged:
            b = li.baseline_acceptance
            findings.append(
                Finding(
                    "baseline_engaged",
                    f"the baseline run drafted too ({b.draft_tokens} draft tokens, L = {_fmt(b.length)}): "
                    "it is not a plain-decoding baseline",
                    {"drafts": b.drafts, "draft_tokens": b.draft_tokens, "length": b.length},
                )
            )
        cur = LevelDiagnosis(li.concurrency, acc, li.baseline_tok_s, li.spec_tok_s, S, L, r, ())
        eroded = _erosion(out, cur)
        engaged = _engagement(acc)
        if engaged is not None:
            findings.append(engaged)
        elif acc is not None:
            low = _acceptance(acc, L)
            if low is not None:
                findings.append(low)
            elif L is not None and S is not None:
                step = _step_cost(acc, L, S, li.verdict)
                if eroded is not None and step.check == "step_cost" and not _no_gain(S, li.verdict):
                    # A gain that shrank with concurrency: erosion is the story, step cost its measure.
                    findings.append(eroded)
                    eroded = None
                findings.append(step)
        if eroded is not None:
            findings.append(eroded)
        if drift is not None:
            findings.append(drift)
        out.append(replace(cur, findings=tuple(findings)))
    return out


# ---- from runs -----------------------------------------------------------------------------------


def agg_tok_s(t: TrialResult) -> float | None:
    """The seed's Agg tok/s of one trial, as tokbench.stats defines it: output tokens of successful measured
    requests / (last end - first scheduled); callers with stats at hand pass its figure instead."""
    if t.imported is not None and "agg_tok_s" in t.imported:
        return float(t.imported["agg_tok_s"])
    measured = t.measured
    start = min((r.scheduled_ns for r in measured), default=t.start_ns)
    end = max((r.end_ns for r in measured), default=t.end_ns)
    wall = (end - start) / 1e9
    if wall <= 0:
        return None
    return sum(r.output_tokens for r in measured if r.ok) / wall


def level_throughput(
    run: RunResult, concurrency: int, trial_throughput: Callable[[TrialResult], float | None] = agg_tok_s
) -> float | None:
    """Mean over the level's trials (trials are the independent unit)."""
    lv = run.level(concurrency)
    if lv is None:
        return None
    vals = [v for t in lv.trials if (v := trial_throughput(t)) is not None]
    return sum(vals) / len(vals) if vals else None


def diagnose(
    baseline: RunResult,
    spec_run: RunResult,
    *,
    trial_throughput: Callable[[TrialResult], float | None] = agg_tok_s,
    verdicts: Mapping[int, str] | None = None,
    config_diff: Sequence[tuple[str, Any, Any, bool]] | None = None,
) -> list[LevelDiagnosis]:
    """Diagnose every level of `spec_run` against `baseline`. Pass the statistics' per-trial throughput and
    verdicts to make the figures match `tokbench compare`; pass the (key, baseline, spec, explained) diff of
    resolved configurations (server.engines.config_diff, which owns what counts as volatile and what a changed
    flag explains) for the drift check."""
    inputs = []
    for lv in spec_run.levels:
        c = lv.concurrency
        base_lv = baseline.level(c)
        inputs.append(
            LevelInput(
                concurrency=c,
                baseline_tok_s=level_throughput(baseline, c, trial_throughput),
                spec_tok_s=level_throughput(spec_run, c, trial_throughput),
                acceptance=level_acceptance(lv),
                verdict=(verdicts or {}).get(c),
                baseline_acceptance=level_acceptance(base_lv) if base_lv is not None else None,
            )
        )
    changes = classify_changes(config_diff) if config_diff is not None else []
    return diagnose_levels(inputs, changes)


# ---- resolved-configuration drift ----------------------------------------------------------------

# Settings a speculative configuration changes on purpose.
_SPEC_KEY = re.compile(
    r"specul|draft|spec_|spec-|ngram|eagle|mtp|nextn|medusa|lookahead|num_spec", re.IGNORECASE
)


def classify_changes(diff: Iterable[tuple[str, Any, Any, bool]]) -> list[ConfigChange]:
    """(key, baseline, spec, explained by a flag the plan changed) -> changes; speculative settings are
    expected whatever the flags (the engine fills some in, e.g. SGLang's num_draft_tokens)."""
    return [
        ConfigChange(key, va, vb, explained or bool(_SPEC_KEY.search(key))) for key, va, vb, explained in diff
    ]
