"""Run-scoped speculative acceptance per trial and per level, from recorded data only.

Sources, best first: Prometheus counter deltas between the scrapes taken around a trial's measurement window
(vLLM `vllm:spec_decode_*_total`, llama.cpp `llamacpp:spec_decode_*_total`), then per-request engine extras
(SGLang `meta_info`, vLLM `metrics.speculative_decoding`, llama.cpp `timings`). Lifetime gauges (SGLang
`avg_spec_accept_length`, `sglang:spec_accept_length`) are never read: they mix in warmup and earlier runs.

Definitions (every source is reduced to the same counts):
- drafts: verification steps that carried a draft (vLLM/llama.cpp `num_drafts`, SGLang `spec_verify_ct`,
  vLLM per-request `num_spec_steps`).
- accepted: draft tokens the target accepted; draft_tokens: draft tokens proposed.
- tokens: output tokens in the window; steps = tokens - accepted: target forward passes per request (each pass
  emits one token of its own plus the drafts it accepted; the prefill pass emits the first token).
- mean_accepted_length = 1 + accepted / drafts, the engines' own convention (bonus token included, counted
  over steps that drafted). Where drafts are unknown (llama.cpp `timings`) it falls back to tokens_per_step.
- tokens_per_step = tokens / steps: the length that decides the speedup, because steps without a draft
  (an n-gram drafter that found no match) still cost a target pass. `Acceptance.length` prefers it.
- per_position[i] = accepted at draft position i / drafts; acceptance_rate = accepted / draft_tokens.
- verify_steps_per_s = steps (or drafts when steps are unknown) / measurement window seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tokbench.records import LevelResult, RequestRecord, TrialResult

# Sample names as the engines print them (prometheus_client's parser strips `_total` from counter *family*
# names, so matching is by sample name). Sources: vllm/v1/spec_decode/metrics.py (SpecDecodingProm) and
# vllm/v1/metrics/loggers.py; llama.cpp tools/server/server-task.cpp (server_task_result_metrics::to_metrics).
COUNTERS: dict[str, dict[str, str]] = {
    "vllm": {
        "drafts": "vllm:spec_decode_num_drafts_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "tokens": "vllm:generation_tokens_total",
    },
    "llamacpp": {
        "drafts": "llamacpp:spec_decode_num_drafts_total",
        "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
        "per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
        "tokens": "llamacpp:tokens_predicted_total",
    },
}

# llama.cpp prints plain counters through a C++ stream with 6 significant digits: past 1e6 a delta is rounded.
_LLAMACPP_PRECISION_LIMIT = 1e6


@dataclass(frozen=True)
class Acceptance:
    """Speculative accounting over one trial or one level (see the module docstring for every definition)."""

    # "prometheus:vllm", "prometheus:llamacpp", "meta_info:sglang", "metrics:vllm", "timings:llamacpp"
    source: str
    drafts: int | None
    draft_tokens: int | None
    accepted: int
    tokens: int | None
    steps: int | None
    accepted_per_position: tuple[int, ...]  # counts; empty when the source has no per-position data
    per_position: tuple[float, ...]
    mean_accepted_length: float | None
    tokens_per_step: float | None
    acceptance_rate: float | None
    verify_steps_per_s: float | None
    window_s: float | None
    requests: int | None = None  # requests that carried per-request data (None for counters)
    notes: tuple[str, ...] = ()

    @property
    def engaged(self) -> bool:
        """Did any draft reach the target in this window?"""
        return bool(self.drafts or self.draft_tokens or self.accepted)

    @property
    def length(self) -> float | None:
        """L for speedup accounting: tokens per target step when known, else the mean accepted length."""
        return self.tokens_per_step if self.tokens_per_step is not None else self.mean_accepted_length


def make_acceptance(
    source: str,
    *,
    drafts: int | None,
    draft_tokens: int | None,
    accepted: int,
    tokens: int | None,
    accepted_per_position: Sequence[int] = (),
    window_s: float | None = None,
    requests: int | None = None,
    notes: Sequence[str] = (),
) -> Acceptance:
    """Build an Acceptance from raw counts; every ratio is derived here, so all sources share definitions."""
    steps = tokens - accepted if tokens is not None and tokens > accepted else None
    tokens_per_step = tokens / steps if tokens is not None and steps else None
    mean_len = 1.0 + accepted / drafts if drafts else tokens_per_step
    per_pos = tuple(n / drafts for n in accepted_per_position) if drafts else ()
    rate = accepted / draft_tokens if draft_tokens else None
    counted = steps if steps is not None else drafts
    per_s = counted / window_s if counted is not None and window_s and window_s > 0 else None
    return Acceptance(
        source=source,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        tokens=tokens,
        steps=steps,
        accepted_per_position=tuple(accepted_per_position),
        per_position=per_pos,
        mean_accepted_length=mean_len,
        tokens_per_step=tokens_per_step,
        acceptance_rate=rate,
        verify_steps_per_s=per_s,
        window_s=window_s,
        requests=requests,
        notes=tuple(notes),
    )


# ---- Prometheus counters -------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterSnapshot:
    """The speculative counters of one scrape, summed over label sets (engine index, model name, ...)."""

    engine: str
    values: Mapping[str, float]  # role ("drafts", "accepted", ...) -> value
    per_pos: Mapping[int, float]  # draft position -> accepted tokens


def parse_counters(text: str) -> CounterSnapshot | None:
    """The speculative counters in one Prometheus text scrape; None if there are none or the text is bad."""
    sums: dict[str, float] = {}
    per_pos_by_name: dict[str, dict[int, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                pos = sample.labels.get("position")
                if pos is not None and sample.name.endswith("_per_pos_total"):
                    try:
                        i = int(pos)
                    except ValueError:
                        continue
                    by_pos = per_pos_by_name.setdefault(sample.name, {})
                    by_pos[i] = by_pos.get(i, 0.0) + float(sample.value)
                else:
                    sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError):
        # Whatever answered /metrics did not speak the text format (an HTML error page, a cut-off body).
        return None
    for engine, names in COUNTERS.items():
        if names["drafts"] in sums or names["accepted"] in sums:
            values = {role: sums[name] for role, name in names.items() if role != "per_pos" and name in sums}
            return CounterSnapshot(engine, values, per_pos_by_name.get(names["per_pos"], {}))
    return None


def counter_acceptance(before: str, after: str, window_s: float | None = None) -> Acceptance | None:
    """Acceptance from the counter deltas between two scrapes; None when the counters are missing or were
    reset (a restarted server) between the scrapes."""
    a, b = parse_counters(before), parse_counters(after)
    if a is None or b is None or a.engine != b.engine:
        return None
    delta: dict[str, int] = {}
    for role in ("drafts", "draft_tokens", "accepted", "tokens"):
        if role in a.values and role in b.values:
            d = b.values[role] - a.values[role]
            if d < 0:
                return None
            delta[role] = round(d)
    if "accepted" not in delta:
        return None
    positions = sorted(set(a.per_pos) | set(b.per_pos))
    # llama.cpp prints the per-position family only once a draft was verified: absent before means zero.
    per_pos_delta = [b.per_pos.get(i, 0.0) - a.per_pos.get(i, 0.0) for i in positions]
    notes = []
    if any(d < 0 for d in per_pos_delta):
        per_pos_delta, positions = [], []
        notes.append("per-position counters went backwards between the scrapes; per-position figures dropped")
    if positions and positions != list(range(len(positions))):
        notes.append(f"per-position counters have gaps (positions {positions})")
    if a.engine == "llamacpp" and any(v >= _LLAMACPP_PRECISION_LIMIT for v in b.values.values()):
        notes.append(
            "llama.cpp prints counters with 6 significant digits; values past 1e6 make deltas approximate "
            "(restart the server between campaigns for exact counts)"
        )
    return make_acceptance(
        f"prometheus:{a.engine}",
        drafts=delta.get("drafts"),
        draft_tokens=delta.get("draft_tokens"),
        accepted=delta["accepted"],
        tokens=delta.get("tokens"),
        accepted_per_position=[round(d) for d in per_pos_delta],
        window_s=window_s,
        notes=notes,
    )


# ---- per-request extras --------------------------------------------------------------------------


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) else None


def sglang_meta(extras: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """SGLang's per-request speculative fields: `meta_info` (/generate, or OpenAI with return_meta_info),
    newer `sglext.spec_tokens_details`, or the fields kept flat."""
    candidates: list[Any] = [extras.get("meta_info"), extras]
    sglext = extras.get("sglext")
    if isinstance(sglext, Mapping):
        candidates.insert(0, sglext.get("spec_tokens_details"))
    for c in candidates:
        if isinstance(c, Mapping) and "spec_verify_ct" in c:
            return c
    return None


def _sglang_request(
    meta: Mapping[str, Any], completion: int | None
) -> tuple[int, int, int | None, int, list[int]]:
    """(drafts, accepted, draft_tokens, tokens, per-position counts) of one SGLang request."""
    verify = _int(meta.get("spec_verify_ct")) or 0
    # meta_info's own completion_tokens is consistent with its verify count; usage is the fallback.
    own = _int(meta.get("completion_tokens"))
    tokens = own if own is not None else completion or 0
    accepted = _int(meta.get("spec_num_correct_drafts"))
    if accepted is None:
        accepted = _int(meta.get("spec_accept_token_num"))  # older SGLang
    draft_tokens = _int(meta.get("spec_num_proposed_drafts"))
    if draft_tokens is None:
        draft_tokens = _int(meta.get("spec_draft_token_num"))
    hist = meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram"))
    per_pos = _positions(hist)
    if accepted is None and per_pos:
        accepted = sum(per_pos)  # each accepted draft sits at exactly one position
    if accepted is None:
        # Oldest SGLang reports only spec_verify_ct, and its accept length is tokens / verify_ct.
        accepted = max(tokens - verify, 0) if verify else 0
    return verify, accepted, draft_tokens, tokens, per_pos


def vllm_spec_metrics(extras: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """vLLM's per-request `metrics.speculative_decoding` (served with --per-request-spec-decode-metrics)."""
    metrics = extras.get("metrics")
    sd = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    return sd if isinstance(sd, Mapping) and "num_spec_steps" in sd else None


def _vllm_request(
    sd: Mapping[str, Any], completion: int | None
) -> tuple[int, int, int | None, int, list[int]]:
    """(drafts, accepted, draft_tokens, tokens, per-position counts) of one vLLM request."""
    hist = sd.get("acceptance_histogram")
    if isinstance(hist, Mapping):  # some builds key it by the accepted count as a string
        hist = [hist.get(str(j), hist.get(j, 0)) for j in range(max((int(k) for k in hist), default=-1) + 1)]
    return (
        _int(sd.get("num_spec_steps")) or 0,
        _int(sd.get("num_accepted_draft_tokens")) or 0,
        _int(sd.get("num_draft_tokens")),
        completion or 0,
        _positions(hist),
    )


def _positions(hist: Any) -> list[int]:
    """Per-position accepted counts from a histogram where h[j] = steps that accepted exactly j drafts:
    position i was accepted in sum(h[j] for j > i)."""
    if not isinstance(hist, Sequence) or isinstance(hist, str):
        return []
    h = [_int(x) or 0 for x in hist]
    return [sum(h[i + 1 :]) for i in range(max(len(h) - 1, 0))]


def _add_positions(total: list[int], counts: Sequence[int]) -> None:
    if len(total) < len(counts):
        total.extend([0] * (len(counts) - len(total)))
    for i, n in enumerate(counts):
        total[i] += n


# Per-request sources, best first: (source name, where the fields sit, one request's counts).
_PER_REQUEST = (
    ("meta_info:sglang", sglang_meta, _sglang_request),
    ("metrics:vllm", vllm_spec_metrics, _vllm_request),
)


def request_acceptance(records: Iterable[RequestRecord], window_s: float | None = None) -> Acceptance | None:
    """Acceptance from per-request extras (SGLang meta_info, vLLM metrics.speculative_decoding, else
    llama.cpp timings), or None."""
    records = list(records)
    for source, find, count in _PER_REQUEST:
        found = [(r, m) for r in records if (m := find(r.extras)) is not None]
        if not found:
            continue
        drafts = accepted = tokens = 0
        draft_tokens: int | None = 0
        per_pos: list[int] = []
        for r, m in found:
            d, a, dt, t, pp = count(m, r.completion_tokens)
            drafts, accepted, tokens = drafts + d, accepted + a, tokens + t
            draft_tokens = draft_tokens + dt if draft_tokens is not None and dt is not None else None
            _add_positions(per_pos, pp)
        return make_acceptance(
            source,
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted=accepted,
            tokens=tokens,
            accepted_per_position=per_pos,
            window_s=window_s,
            requests=len(found),
        )
    return _timings_acceptance(records, window_s)


def _timings_acceptance(records: Sequence[RequestRecord], window_s: float | None) -> Acceptance | None:
    timed = [(r, tm) for r in records if isinstance(tm := r.extras.get("timings"), Mapping)]
    if not timed:
        return None
    # llama.cpp omits draft_n/draft_n_accepted when a request drafted nothing: absent means zero.
    # It does not report how many steps drafted, so drafts stays unknown and L = tokens / steps.
    accepted = sum(_int(tm.get("draft_n_accepted")) or 0 for _, tm in timed)
    draft_n = sum(_int(tm.get("draft_n")) or 0 for _, tm in timed)
    tokens = 0
    for r, tm in timed:
        n = r.completion_tokens if r.completion_tokens is not None else _int(tm.get("predicted_n"))
        tokens += n or 0
    return make_acceptance(
        "timings:llamacpp",
        drafts=None,
        draft_tokens=draft_n,
        accepted=accepted,
        tokens=tokens,
        window_s=window_s,
        requests=len(timed),
    )


# ---- trials and levels ---------------------------------------------------------------------------


def trial_window_s(t: TrialResult) -> float | None:
    w = (t.end_ns - t.start_ns) / 1e9
    return w if w > 0 else None


def trial_acceptance(t: TrialResult) -> Acceptance | None:
    """Acceptance of one trial: counter deltas around its window when both scrapes carry them, else the
    measured requests' extras; None when neither source has speculative data."""
    window = trial_window_s(t)
    if t.metrics_before is not None and t.metrics_after is not None:
        acc = counter_acceptance(t.metrics_before, t.metrics_after, window)
        if acc is not None:
            return acc
    return request_acceptance(t.measured, window)


def _sum_or_none(values: Sequence[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def merge(accs: Sequence[Acceptance]) -> Acceptance | None:
    """Pool trials: counts add up, then the ratios are taken (not averaged per trial)."""
    if not accs:
        return None
    sources = sorted({a.source for a in accs})
    per_pos: list[int] = []
    with_pos = [a for a in accs if a.accepted_per_position]
    notes = [n for a in accs for n in a.notes]
    drafts = _sum_or_none([a.drafts for a in accs])
    if with_pos and len(with_pos) == len(accs):
        for a in with_pos:
            _add_positions(per_pos, a.accepted_per_position)
    elif with_pos:
        notes.append("per-position data missing in some trials; per-position figures dropped")
    windows = [a.window_s for a in accs]
    window = sum(w for w in windows if w is not None) if all(w is not None for w in windows) else None
    requests = _sum_or_none([a.requests for a in accs])
    return make_acceptance(
        "+".join(sources),
        drafts=drafts,
        draft_tokens=_sum_or_none([a.draft_tokens for a in accs]),
        accepted=sum(a.accepted for a in accs),
        tokens=_sum_or_none([a.tokens for a in accs]),
        accepted_per_position=per_pos,
        window_s=window,
        requests=requests,
        notes=tuple(dict.fromkeys(notes)),
    )


def level_acceptance(level: LevelResult) -> Acceptance | None:
    """Acceptance pooled over a level's trials (those without speculative data are left out, and said so)."""
    per_trial = [trial_acceptance(t) for t in level.trials]
    found = [a for a in per_trial if a is not None]
    merged = merge(found)
    if merged is not None and len(found) < len(per_trial):
        missing = len(per_trial) - len(found)
        note = f"{missing} of {len(per_trial)} trials had no speculative data"
        merged = _with_note(merged, note)
    return merged


def _with_note(a: Acceptance, note: str) -> Acceptance:
    return replace(a, notes=(*a.notes, note))


def acceptance_to_dict(a: Acceptance) -> dict[str, Any]:
    """JSON form (reports and `--json`): every count and derived figure, plus L as used for speedups."""
    return {
        "source": a.source,
        "drafts": a.drafts,
        "draft_tokens": a.draft_tokens,
        "accepted": a.accepted,
        "tokens": a.tokens,
        "steps": a.steps,
        "accepted_per_position": list(a.accepted_per_position),
        "per_position": list(a.per_position),
        "mean_accepted_length": a.mean_accepted_length,
        "tokens_per_step": a.tokens_per_step,
        "length": a.length,
        "acceptance_rate": a.acceptance_rate,
        "verify_steps_per_s": a.verify_steps_per_s,
        "window_s": a.window_s,
        "requests": a.requests,
        "notes": list(a.notes),
    }
