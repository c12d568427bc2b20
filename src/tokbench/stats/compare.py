"""A/B verdicts per concurrency level: B's change vs A in %, a 95% interval over trials, and a word for it.

faster / slower always mean "B is better / worse on the chosen metric" (higher throughput or lower latency);
`delta_pct` is the plain change of the metric, so a TTFT that dropped 10% is delta -10% and `faster`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokbench.errors import ConfigError, InsufficientDataError
from tokbench.records import LevelResult, RequestRecord, RunResult, TrialResult
from tokbench.stats.bootstrap import bootstrap_ci
from tokbench.stats.drift import DRIFT_ALPHA, trend
from tokbench.stats.intervals import ratio_interval
from tokbench.stats.power import trials_to_decide
from tokbench.stats.summary import (
    METRICS,
    NS_PER_MS,
    LevelSummary,
    TrialFigures,
    metric_value,
    summarize,
    trial_figures,
)

VERDICTS = ("faster", "slower", "no_difference", "inconclusive", "insufficient_data")
EQUAL_WORK_TOLERANCE = 0.01  # output tokens per trial may differ by 1% before the comparison is flagged
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class PairedDelta:
    """B minus A per prompt (same prompt, same position, same trial index), over prompts OK on both sides."""

    figure: str  # "e2e_ms" or "ttft_ms"
    n_pairs: int
    median_delta_ms: float
    ci_low_ms: float | None  # percentile bootstrap over pairs
    ci_high_ms: float | None
    median_change_pct: float | None  # median of the per-prompt relative changes


@dataclass(frozen=True, slots=True)
class LevelVerdict:
    concurrency: int
    metric: str
    verdict: str  # one of VERDICTS
    delta_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    a: LevelSummary | None  # None: the level (or the metric) is missing on that side
    b: LevelSummary | None
    trials_needed: int | None  # inconclusive only: trials per side that would settle it at the observed noise
    warnings: tuple[str, ...] = ()
    margin_pct: float = 2.0
    higher_is_better: bool = True
    paired: tuple[PairedDelta, ...] = ()


def compare_runs(
    a: RunResult,
    b: RunResult,
    metric: str = "agg_tok_s",
    margin_pct: float = 2.0,
    rng: np.random.Generator | None = None,
) -> list[LevelVerdict]:
    """One verdict per concurrency level present in either run, in ascending order."""
    if metric not in METRICS:
        raise ConfigError(f"--metric: unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if not (math.isfinite(margin_pct) and 0 <= margin_pct < 100):
        raise ConfigError(f"--margin: {margin_pct} is not a percentage in [0, 100), e.g. 2")
    gen = rng if rng is not None else np.random.default_rng(0)
    levels = sorted({lv.concurrency for lv in a.levels} | {lv.concurrency for lv in b.levels})
    return [compare_level(c, a.level(c), b.level(c), metric, margin_pct, gen) for c in levels]


def compare_level(
    concurrency: int,
    a: LevelResult | None,
    b: LevelResult | None,
    metric: str,
    margin_pct: float,
    rng: np.random.Generator,
) -> LevelVerdict:
    hib = METRICS[metric]
    fa = [trial_figures(t) for t in a.trials] if a is not None else []
    fb = [trial_figures(t) for t in b.trials] if b is not None else []
    va, vb = _values(fa, metric), _values(fb, metric)
    warnings = _warnings(concurrency, fa, fb, metric, va, vb)
    warnings += _drift_warnings(va, vb, metric, margin_pct)
    sa, sb = _summary(va, concurrency, metric), _summary(vb, concurrency, metric)
    paired = paired_deltas(a, b, rng) if a is not None and b is not None else ()

    d = decide(va, vb, hib, margin_pct)
    if d.reason:
        warnings.append(d.reason)
    return LevelVerdict(
        concurrency, metric, d.verdict, d.delta_pct, d.ci_low_pct, d.ci_high_pct, sa, sb, d.trials_needed,
        tuple(warnings), margin_pct, hib, paired,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict arithmetic on two lists of trial values (what compare_level wraps with summaries)."""

    verdict: str
    delta_pct: float | None = None
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    trials_needed: int | None = None
    reason: str | None = None  # why there is no verdict (insufficient_data)


def decide(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    higher_is_better: bool = True,
    margin_pct: float = 2.0,
) -> Decision:
    """Verdict of B vs A from per-trial values: a 95% Welch interval on log(mean B / mean A), then
    no_difference if it lies inside ±margin, faster/slower if it excludes zero, else inconclusive."""
    ma = float(np.mean(a)) if len(a) else None
    mb = float(np.mean(b)) if len(b) else None
    point = 100 * (mb / ma - 1) if ma is not None and mb is not None and ma > 0 else None
    if len(a) < 2 or len(b) < 2:
        reason = None
        if len(a) and len(b):
            reason = (
                f"{len(a)} trial(s) in A and {len(b)} in B: a verdict needs 2+ a side (3+ recommended); "
                "one run each cannot tell a change from run-to-run noise"
            )
        return Decision("insufficient_data", point, reason=reason)
    ri = ratio_interval(a, b, CONFIDENCE)
    if ri is None:
        return Decision(
            "insufficient_data", point, reason="a side's mean is not positive: no ratio to compare"
        )
    delta = 100 * (ri.ratio - 1)
    lo, hi = 100 * (ri.low - 1), 100 * (ri.high - 1)
    # Inside the margin wins over "excludes zero": a real change smaller than the margin is declared too small
    # to matter, which is the point of stating a margin.
    if -margin_pct < lo and hi < margin_pct:
        return Decision("no_difference", delta, lo, hi)
    if lo > 0 or hi < 0:
        b_better = (lo > 0) == higher_is_better
        return Decision("faster" if b_better else "slower", delta, lo, hi)
    return Decision("inconclusive", delta, lo, hi, trials_to_decide(delta, _cv(a), _cv(b), margin_pct))


def _values(figs: Sequence[TrialFigures], metric: str) -> list[float]:
    out = []
    for f in figs:
        v = metric_value(f, metric)
        if v is not None and math.isfinite(v):
            out.append(v)
    return out


def _summary(values: Sequence[float], concurrency: int, metric: str) -> LevelSummary | None:
    try:
        return summarize(values, concurrency, metric)
    except InsufficientDataError:
        return None


def _cv(values: Sequence[float] | np.ndarray) -> float:
    arr = np.asarray(values, dtype=float)
    m = float(arr.mean())
    return float(arr.std(ddof=1)) / m if m > 0 else 0.0


def _warnings(
    c: int,
    fa: Sequence[TrialFigures],
    fb: Sequence[TrialFigures],
    metric: str,
    va: Sequence[float],
    vb: Sequence[float],
) -> list[str]:
    out: list[str] = []
    for side, figs, vals in (("A", fa, va), ("B", fb, vb)):
        if not figs:
            out.append(f"C={c} was not measured in {side}")
            continue
        if len(vals) < len(figs):
            out.append(
                f"{side}: {len(figs) - len(vals)} of {len(figs)} trials have no {metric} value, left out"
            )
        limited = [f.trial for f in figs if f.client_limited]
        if limited:
            lag = max((f.loop_lag_p99_ms or 0.0) for f in figs if f.client_limited)
            out.append(
                f"{side}: trial(s) {_list(limited)} client-limited (event-loop lag p99 up to {lag:.0f} ms): "
                "the load generator, not the server, may bound this level"
            )
        interrupted = [f.trial for f in figs if f.interrupted]
        if interrupted:
            out.append(f"{side}: trial(s) {_list(interrupted)} interrupted: partial data")
        errors: dict[str, int] = {}
        for f in figs:
            for kind, n in f.errors.items():
                errors[kind] = errors.get(kind, 0) + n
        if errors:
            total = sum(f.requests for f in figs)
            kinds = ", ".join(f"{k} {n}" for k, n in sorted(errors.items()))
            out.append(
                f"{side}: {sum(errors.values())} of {total} requests failed ({kinds}); figures use OK ones"
            )
    tok_a = [f.tokens for f in fa if f.tokens > 0]
    tok_b = [f.tokens for f in fb if f.tokens > 0]
    if tok_a and tok_b:
        ma, mb = float(np.mean(tok_a)), float(np.mean(tok_b))
        if abs(mb / ma - 1) > EQUAL_WORK_TOLERANCE:
            out.append(
                f"unequal work: B generated {mb:.0f} output tokens per trial vs A {ma:.0f} "
                f"({100 * (mb / ma - 1):+.1f}%); throughput compares different work "
                "(use --ignore-eos or --min-tokens on both)"
            )
    return out


def _drift_warnings(va: Sequence[float], vb: Sequence[float], metric: str, margin_pct: float) -> list[str]:
    """A side whose trials trend (significantly, and by more than the margin) moved during the run: its
    trials are not draws from one distribution, which the interval assumes."""
    out = []
    for side, vals in (("A", va), ("B", vb)):
        tr = trend(vals)
        if tr is not None and tr.significant and abs(tr.change_pct) >= margin_pct:
            out.append(
                f"{side}: drift, {metric} moved {tr.change_pct:+.1f}% along its {len(vals)} trials "
                f"(trend significant at {DRIFT_ALPHA:g}): warm-up, throttling or other load "
                "changed the server during the run; interleaving A and B shares drift between them, "
                "but the interval widens"
            )
    return out


def _list(items: Sequence[int]) -> str:
    return ",".join(str(i) for i in items)


# ---- paired per-prompt analysis ----------------------------------------------------------------------------


def _prompt_order(t: TrialResult) -> tuple[str, ...]:
    return tuple(r.prompt_id for r in sorted(t.measured, key=lambda r: r.index))


def paired_deltas(a: LevelResult, b: LevelResult, rng: np.random.Generator) -> tuple[PairedDelta, ...]:
    """Per-prompt B-A deltas of E2E and TTFT when every trial index both sides share used the same prompts in
    the same order; () otherwise. Prompts within a trial share its conditions, so these intervals are narrower
    than the trial-level one; they show where a change lands (first token vs decode), the verdict rests on
    trials."""
    ta = {t.trial: t for t in a.trials if t.imported is None}
    tb = {t.trial: t for t in b.trials if t.imported is None}
    common = sorted(set(ta) & set(tb))
    if not common:
        return ()
    pairs: list[tuple[RequestRecord, RequestRecord]] = []
    for k in common:
        order_a, order_b = _prompt_order(ta[k]), _prompt_order(tb[k])
        if not order_a or order_a != order_b:
            return ()
        ra = sorted(ta[k].measured, key=lambda r: r.index)
        rb = sorted(tb[k].measured, key=lambda r: r.index)
        pairs.extend((x, y) for x, y in zip(ra, rb, strict=True) if x.ok and y.ok)
    out = []
    for figure in ("e2e_ms", "ttft_ms"):
        da, db = [], []
        for x, y in pairs:
            if figure == "e2e_ms":
                da.append(x.end_ns - x.sent_ns)
                db.append(y.end_ns - y.sent_ns)
            elif x.first_token_ns is not None and y.first_token_ns is not None:
                da.append(x.first_token_ns - x.sent_ns)
                db.append(y.first_token_ns - y.sent_ns)
        if not da:
            continue
        xa = np.asarray(da, dtype=float) / NS_PER_MS
        xb = np.asarray(db, dtype=float) / NS_PER_MS
        delta = xb - xa
        ci = bootstrap_ci(delta, statistic="median", rng=rng)
        rel = 100 * (xb[xa > 0] / xa[xa > 0] - 1)
        out.append(
            PairedDelta(
                figure,
                int(delta.size),
                float(np.median(delta)),
                ci[0] if ci else None,
                ci[1] if ci else None,
                float(np.median(rel)) if rel.size else None,
            )
        )
    return tuple(out)


# ---- run-level checks and JSON -----------------------------------------------------------------------------

_LOAD_KEYS = (
    "api",
    "max_tokens",
    "ignore_eos",
    "min_tokens",
    "temperature",
    "prompts",
    "request_rate",
    "requests",
)


def run_warnings(a: RunResult, b: RunResult) -> list[str]:
    """Differences between the two runs that make a comparison suspect, beyond any single level."""
    out = []
    for side, run in (("A", a), ("B", b)):
        name = run.meta.label or run.meta.run_id
        if not run.meta.complete:
            out.append(f"{side} ({name}) is incomplete (interrupted run)")
        if run.meta.source.startswith("import:"):
            out.append(f"{side} ({name}) is an imported summary table: figures only, no requests")
    if a.meta.model and b.meta.model and a.meta.model != b.meta.model:
        out.append(f"different models: A {a.meta.model!r}, B {b.meta.model!r}")
    for key in _LOAD_KEYS:
        if key in a.meta.load and key in b.meta.load and a.meta.load[key] != b.meta.load[key]:
            out.append(f"different workload: {key} is {a.meta.load[key]!r} in A, {b.meta.load[key]!r} in B")
    return out


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def verdict_to_dict(v: LevelVerdict) -> dict[str, Any]:
    """Stable JSON form: concurrency, verdict, delta_pct, ci_low_pct, ci_high_pct, then the rest."""

    def side(s: LevelSummary | None, p: str) -> dict[str, Any]:
        return {
            f"{p}_mean": _num(s.mean) if s else None,
            f"{p}_ci_low": _num(s.ci_low) if s else None,
            f"{p}_ci_high": _num(s.ci_high) if s else None,
            f"{p}_trials": s.n_trials if s else 0,
            f"{p}_values": list(s.values) if s else [],
        }

    return {
        "concurrency": v.concurrency,
        "verdict": v.verdict,
        "delta_pct": _num(v.delta_pct),
        "ci_low_pct": _num(v.ci_low_pct),
        "ci_high_pct": _num(v.ci_high_pct),
        "metric": v.metric,
        "higher_is_better": v.higher_is_better,
        "margin_pct": v.margin_pct,
        **side(v.a, "a"),
        **side(v.b, "b"),
        "trials_needed": v.trials_needed,
        "warnings": list(v.warnings),
        "paired": [
            {
                "figure": p.figure,
                "n_pairs": p.n_pairs,
                "median_delta_ms": p.median_delta_ms,
                "ci_low_ms": p.ci_low_ms,
                "ci_high_ms": p.ci_high_ms,
                "median_change_pct": p.median_change_pct,
            }
            for p in v.paired
        ],
    }
