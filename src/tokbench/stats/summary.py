"""The seed's figures per trial (Agg tok/s, Per-req tok/s, Tokens, Wall(s), Ok) plus latency percentiles and a
steady-state throughput, computed from raw request records only; and per-level summaries over trials.

Definitions are in README.md ("Figures"); the code below is their executable form.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from tokbench.errors import ConfigError, InsufficientDataError, StoreError
from tokbench.records import LevelResult, RequestRecord, TrialResult
from tokbench.stats.bootstrap import bootstrap_ci
from tokbench.stats.intervals import t_interval

NS_PER_S = 1e9
NS_PER_MS = 1e6

# The steady-state window must cover at least this share of the trial's wall time; a shorter one (a level with
# barely more requests than slots, or one that never filled all slots) is mostly ramp-up and drain, and its
# rate would be a small-sample figure dressed up as the headline.
STEADY_MIN_FRACTION = 0.25


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50/p90/p99 and mean of one figure, in milliseconds; all None when no request contributed (n == 0)."""

    n: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    mean: float | None = None


EMPTY = Percentiles(0)


def percentiles(values: Sequence[float] | np.ndarray) -> Percentiles:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return EMPTY
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return Percentiles(int(arr.size), float(p50), float(p90), float(p99), float(arr.mean()))


@dataclass(frozen=True, slots=True)
class TrialFigures:
    """Everything tokbench reports about one trial. Latency figures come from OK requests only; errored
    requests are counted by kind and their time-to-failure is kept apart (`failed_ms`)."""

    concurrency: int
    trial: int
    requests: int
    ok: int
    errors: dict[str, int]  # by ErrorKind value
    tokens: int  # output tokens of OK requests
    wall_s: float
    agg_tok_s: float
    per_req_tok_s: float | None  # None: no OK request (or an import without that column)
    steady_agg_tok_s: float | None
    ttft_ms: Percentiles
    itl_ms: Percentiles
    tpot_ms: Percentiles
    e2e_ms: Percentiles
    achieved_concurrency: float | None
    loop_lag_p99_ms: float | None
    client_limited: bool
    queue_ms: Percentiles = EMPTY  # sent - scheduled: time the client held a due request
    failed_ms: Percentiles = EMPTY  # sent -> end of errored requests (how fast failures failed)
    steady_window_s: float | None = None
    imported: bool = False
    interrupted: bool = False


# metric name -> higher is better. Every metric is a speed: throughput up or latency down is "faster".
METRICS: dict[str, bool] = {
    "agg_tok_s": True,
    "steady_agg_tok_s": True,
    "per_req_tok_s": True,
    **{
        f"{fig}_{stat}": False
        for fig in ("ttft", "itl", "tpot", "e2e", "queue")
        for stat in ("p50", "p90", "p99", "mean")
    },
}


def metric_value(f: TrialFigures, metric: str) -> float | None:
    """The named figure of one trial, or None when the trial has no data for it."""
    if metric not in METRICS:
        raise ConfigError(f"--metric: unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if metric in ("agg_tok_s", "steady_agg_tok_s", "per_req_tok_s"):
        v: float | None = getattr(f, metric)
        return v
    fig, stat = metric.rsplit("_", 1)
    pct: Percentiles = getattr(f, f"{fig}_ms")
    value: float | None = getattr(pct, stat)
    return value


# ---- per-request pieces ------------------------------------------------------------------------------------


# Chunks closer than this are one delivery: bursts of events from one engine step arrive 0.01-0.5 ms apart,
# while a decode step, even of a 270M model on CPU, is several milliseconds.
BURST_NS = 1_000_000


def token_arrivals(r: RequestRecord) -> tuple[np.ndarray, np.ndarray]:
    """(arrival ns, tokens) of the chunks that carried tokens. When the server's usage reports more tokens
    than the chunks were seen to carry, the surplus is spread over the chunks in proportion to what each
    carried (largest remainder, so counts stay integers and sum to the usage figure)."""
    times = np.asarray(r.chunk_ns, dtype=np.int64)
    counts = np.asarray(r.chunk_tokens, dtype=np.int64)
    n = min(times.size, counts.size)
    times, counts = times[:n], counts[:n]
    keep = counts > 0
    times, counts = times[keep], counts[keep]
    counted = int(counts.sum())
    usage = r.completion_tokens
    if usage is not None and counted > 0 and usage > counted:
        exact = counts * (usage / counted)
        scaled = np.floor(exact).astype(np.int64)
        short = usage - int(scaled.sum())
        if short > 0:
            # Stable sort: ties go to earlier chunks, so the result does not depend on numpy's sort internals.
            order = np.argsort(-(exact - scaled), kind="stable")[:short]
            scaled[order] += 1
        counts = scaled
    return times, counts


def itl_values(r: RequestRecord) -> np.ndarray:
    """Per-token inter-token latencies (ns) of one request: the gap before a chunk carrying k tokens counts as
    k gaps of gap/k. Tokens of the first chunk belong to TTFT and contribute none.

    Chunks arriving less than BURST_NS after the previous one are one delivery (one engine step): llama.cpp
    streams a speculative step's tokens as separate events back to back, 0.01-0.5 ms apart, which would
    otherwise read as near-zero gaps and put the p50 ITL of a speculative run under a millisecond."""
    times, counts = token_arrivals(r)
    if times.size > 1:
        starts = np.flatnonzero(np.diff(times) >= BURST_NS) + 1  # arrival times never decrease
        first = np.concatenate(([0], starts))
        times, counts = times[first], np.add.reduceat(counts, first)
    if times.size < 2:
        return np.empty(0)
    gaps = np.diff(times).astype(float)
    k = counts[1:]
    return np.repeat(gaps / k, k)


def _steady_window(records: Sequence[RequestRecord], target: int) -> tuple[int, int] | None:
    """[first moment `target` requests were in flight, last moment they still were]. Momentary dips between
    one request ending and the next being sent (closed loop) stay inside; ramp-up and drain fall outside."""
    if target < 1 or not records:
        return None
    # At equal times ends come first: a slot handed over at the same instant never counts as target + 1.
    events = sorted([(r.sent_ns, 1) for r in records] + [(r.end_ns, -1) for r in records])
    inflight = 0
    first: int | None = None
    last: int | None = None
    for t, step in events:
        before = inflight
        inflight += step
        if before < target <= inflight and first is None:
            first = t
        if before >= target > inflight:
            last = t
    if first is None or last is None or last <= first:
        return None
    return first, last


# ---- a trial -----------------------------------------------------------------------------------------------


def trial_figures(t: TrialResult) -> TrialFigures:
    """All figures of one trial, from its measured (non-warmup) records; imported trials use their figures."""
    if t.imported is not None:
        return _imported_figures(t)
    measured = t.measured
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    errors: dict[str, int] = {}
    for r in failed:
        kind = r.error_kind.value if r.error_kind is not None else "unknown"
        errors[kind] = errors.get(kind, 0) + 1

    if measured:
        start = min(r.scheduled_ns for r in measured)
        end = max(r.end_ns for r in measured)
    else:
        start, end = t.start_ns, t.end_ns
    wall_s = max(end - start, 0) / NS_PER_S
    tokens = sum(r.output_tokens for r in ok)
    agg = tokens / wall_s if wall_s > 0 else 0.0

    rates = [r.output_tokens / ((r.end_ns - r.sent_ns) / NS_PER_S) for r in ok if r.end_ns > r.sent_ns]
    per_req = float(np.mean(rates)) if rates else None

    ttft = [(r.first_token_ns - r.sent_ns) / NS_PER_MS for r in ok if r.first_token_ns is not None]
    e2e = [(r.end_ns - r.sent_ns) / NS_PER_MS for r in ok]
    tpot = [
        (r.end_ns - r.first_token_ns) / NS_PER_MS / (r.output_tokens - 1)
        for r in ok
        if r.first_token_ns is not None and r.output_tokens > 1
    ]
    itl = np.concatenate([itl_values(r) for r in ok]) / NS_PER_MS if ok else np.empty(0)

    steady, steady_window = _steady_rate(t, ok, measured, wall_s)
    return TrialFigures(
        concurrency=t.concurrency,
        trial=t.trial,
        requests=len(measured),
        ok=len(ok),
        errors=errors,
        tokens=tokens,
        wall_s=wall_s,
        agg_tok_s=agg,
        per_req_tok_s=per_req,
        steady_agg_tok_s=steady,
        ttft_ms=percentiles(ttft),
        itl_ms=percentiles(itl),
        tpot_ms=percentiles(tpot),
        e2e_ms=percentiles(e2e),
        achieved_concurrency=t.achieved_concurrency,
        loop_lag_p99_ms=t.loop_lag_p99_ms,
        client_limited=t.client_limited,
        queue_ms=percentiles([(r.sent_ns - r.scheduled_ns) / NS_PER_MS for r in measured]),
        failed_ms=percentiles([(r.end_ns - r.sent_ns) / NS_PER_MS for r in failed]),
        steady_window_s=steady_window,
        interrupted=t.interrupted,
    )


def _steady_rate(
    t: TrialResult, ok: Sequence[RequestRecord], measured: Sequence[RequestRecord], wall_s: float
) -> tuple[float | None, float | None]:
    if t.request_rate is not None:  # open loop: there is no target concurrency to be steady at
        return None, None
    window = _steady_window(measured, t.concurrency)
    if window is None:
        return None, None
    lo, hi = window
    length_s = (hi - lo) / NS_PER_S
    if length_s < STEADY_MIN_FRACTION * wall_s:
        return None, length_s
    tokens = 0
    for r in ok:
        times, counts = token_arrivals(r)
        tokens += int(counts[(times > lo) & (times <= hi)].sum())
    return tokens / length_s, length_s


def _imported_figures(t: TrialResult) -> TrialFigures:
    im = t.imported or {}

    def num(key: str) -> float | None:
        v = im.get(key)
        return float(v) if v is not None else None

    ok = num("ok")
    tokens = num("tokens")
    wall = num("wall_s")
    agg = num("agg_tok_s")
    if agg is None and tokens is not None and wall:
        agg = tokens / wall
    if agg is None:
        raise StoreError(
            f"C={t.concurrency} trial {t.trial}: imported figures lack agg_tok_s "
            "(and tokens + wall_s to derive it); re-import the table with an 'Agg tok/s' column"
        )
    return TrialFigures(
        concurrency=t.concurrency,
        trial=t.trial,
        requests=int(ok) if ok is not None else 0,
        ok=int(ok) if ok is not None else 0,
        errors={},
        tokens=int(tokens) if tokens is not None else 0,
        wall_s=wall if wall is not None else 0.0,
        agg_tok_s=agg,
        per_req_tok_s=num("per_req_tok_s"),
        steady_agg_tok_s=None,
        ttft_ms=EMPTY,
        itl_ms=EMPTY,
        tpot_ms=EMPTY,
        e2e_ms=EMPTY,
        achieved_concurrency=None,
        loop_lag_p99_ms=None,
        client_limited=False,
        imported=True,
    )


# ---- a level: the mean over trials with an interval --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """One metric at one level over its trials. `ci_low/ci_high` is a 95% interval for the mean over trials,
    None with a single trial (one trial says nothing about trial-to-trial noise, so no interval is invented).
    """

    concurrency: int
    n_trials: int
    mean: float
    ci_low: float | None
    ci_high: float | None
    metric: str = "agg_tok_s"
    sd: float | None = None
    values: tuple[float, ...] = ()
    method: str = "t"
    note: str = ""

    @property
    def cv(self) -> float | None:
        """Coefficient of variation across trials (sd / mean): the noise floor of this metric here."""
        if self.sd is None or self.mean == 0:
            return None
        return self.sd / abs(self.mean)

    @property
    def half_width(self) -> float | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return (self.ci_high - self.ci_low) / 2


def metric_values(level: LevelResult, metric: str) -> list[float]:
    """The metric of each trial at this level, trials without data for it left out."""
    return figure_values([trial_figures(t) for t in level.trials], metric)


def figure_values(figures: Sequence[TrialFigures], metric: str) -> list[float]:
    """The metric of each trial's figures, trials without data for it left out."""
    values = (metric_value(f, metric) for f in figures)
    return [float(v) for v in values if v is not None and np.isfinite(v)]


def summarize(
    values: Sequence[float],
    concurrency: int,
    metric: str,
    *,
    method: Literal["t", "bootstrap"] = "t",
    rng: np.random.Generator | None = None,
    confidence: float = 0.95,
) -> LevelSummary:
    if not values:
        raise InsufficientDataError(f"C={concurrency}: no trial has a value for {metric}")
    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean())
    if arr.size < 2:
        return LevelSummary(
            concurrency, 1, mean, None, None, metric, None, tuple(values), method,
            "one trial: no interval (run --trials 3 or more)",
        )  # fmt: skip
    ci = t_interval(arr, confidence) if method == "t" else bootstrap_ci(arr, rng=rng, confidence=confidence)
    lo, hi = ci if ci is not None else (None, None)
    return LevelSummary(
        concurrency, int(arr.size), mean, lo, hi, metric, float(arr.std(ddof=1)), tuple(values), method
    )


def level_summary(
    level: LevelResult,
    metric: str = "agg_tok_s",
    rng: np.random.Generator | None = None,
    method: Literal["t", "bootstrap"] = "t",
) -> LevelSummary:
    """Mean of `metric` over the level's trials with a 95% interval for that mean.

    The default interval is Student's t over trial values: with 3-5 trials a percentile bootstrap can never
    reach beyond the observed min..max and covers the true mean only ~75-90% of the time. `method="bootstrap"`
    (with `rng`) gives the percentile bootstrap for many trials. InsufficientDataError when no trial has the
    metric."""
    return summarize(metric_values(level, metric), level.concurrency, metric, method=method, rng=rng)
