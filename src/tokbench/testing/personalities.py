"""Engine personalities: what differs between engines on the wire (health, stream extras, metric names).

openai: plain OpenAI API. vllm: `vllm:*` Prometheus counters. sglang: `/generate` with `meta_info`,
`/get_server_info`, `sglang:*` metrics. llamacpp: `/props`, `/slots`, `llamacpp:*` metrics, `timings`, one
stream chunk per token. Names follow the engines' sources (see the report for the files checked).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tokbench.testing import protocol as proto
from tokbench.testing.engine import DecodeEngine, EngineStats
from tokbench.testing.settings import ServerConfig
from tokbench.testing.timeline import RequestTrace

if TYPE_CHECKING:
    from tokbench.testing.server import ReferenceServer

Event = tuple[dict[str, Any], int, str]  # payload, tokens it carries, its text

# Printed on stdout once the server is ready (after --load-time-s): the line each engine logs when it is.
READY_LINE: dict[str, str] = {
    "openai": "ready on {url}",
    "sglang": "The server is fired up and ready to roll!",
    "vllm": "Application startup complete.",
    "llamacpp": "srv  update_slots: all slots are idle",
}


# ---- health ------------------------------------------------------------------------------------------------


def health(personality: str, loading: bool) -> tuple[int, dict[str, Any] | None]:
    """Status and JSON body (None: empty body) of GET /health."""
    if personality == "llamacpp":
        if loading:
            return 503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
        return 200, {"status": "ok"}
    if loading:
        return 503, None
    if personality in ("vllm", "sglang"):
        return 200, None  # both answer an empty 200
    return 200, {"status": "ok"}


# ---- streaming payloads ------------------------------------------------------------------------------------


def stream_preamble(cfg: ServerConfig, p: proto.GenParams, h: proto.Head) -> list[dict[str, Any]]:
    """Events before the first token: the chat role chunk."""
    if p.api == "chat":
        return [proto.role_chunk(h)]
    return []


def content_events(
    cfg: ServerConfig,
    p: proto.GenParams,
    h: proto.Head,
    tr: RequestTrace,
    start: int,
    text: Callable[[int, int], str],
    count: int,
    finish_reason: str | None,
    engine: DecodeEngine,
) -> Iterator[Event]:
    """The events carrying tokens start .. start+count-1. `finish_reason` is set when these are the last
    tokens and the response will finish normally (SGLang puts the finish into the last content event)."""
    if p.api == "sglang":
        piece = text(start, count)
        cumulative = tr.text + piece
        yield sglang_event(cfg, tr, cumulative, start + count, finish_reason), count, piece
        return
    if cfg.personality == "llamacpp":
        # llama-server streams every token as its own event, speculative or not.
        for i in range(start, start + count):
            yield _openai_content(p, h, tr, text(i, 1), i + 1), 1, text(i, 1)
        return
    piece = text(start, count)
    yield _openai_content(p, h, tr, piece, start + count), count, piece


def _openai_content(
    p: proto.GenParams, h: proto.Head, tr: RequestTrace, piece: str, cumulative: int
) -> dict[str, Any]:
    payload = proto.content_chunk(p.api, h, piece)
    if p.continuous_usage:
        payload["usage"] = proto.usage(tr.prompt_tokens, cumulative)
    return payload


def final_events(
    cfg: ServerConfig,
    p: proto.GenParams,
    h: proto.Head,
    tr: RequestTrace,
    finish_reason: str,
    engine: DecodeEngine,
) -> list[dict[str, Any]]:
    """Events after the last token and before `data: [DONE]`."""
    if p.api == "sglang":
        return []  # the last content event carried the finish
    use = proto.usage(tr.prompt_tokens, tr.completion_tokens)
    fin = proto.finish_chunk(p.api, h, finish_reason)
    if p.continuous_usage:
        fin["usage"] = use
    out = [fin]
    if p.include_usage:
        out.append(proto.usage_chunk(p.api, h, use))
    if cfg.personality == "llamacpp":
        # server-task.cpp to_json_oaicompat_chat_stream: `deltas.back()["timings"]`, i.e. the usage chunk when
        # include_usage is set, else the finish chunk.
        out[-1]["timings"] = llamacpp_timings(tr)
    if cfg.spec_request_metrics:
        out[-1]["metrics"] = {"speculative_decoding": vllm_spec_metrics(cfg, tr)}
    return out


def unary_body(
    cfg: ServerConfig,
    p: proto.GenParams,
    h: proto.Head,
    text: str,
    finish_reason: str,
    use: Mapping[str, int],
    tr: RequestTrace,
    engine: DecodeEngine,
) -> dict[str, Any]:
    n = use["completion_tokens"]
    if p.api == "sglang":
        return {"text": text, "meta_info": sglang_meta_info(cfg, tr, n, finish_reason, rid=h.id)}
    body = proto.unary_body(p.api, h, text, finish_reason, use)
    if cfg.personality == "llamacpp":
        body["timings"] = llamacpp_timings(tr, predicted_n=n)
    if cfg.personality == "sglang" and p.return_meta_info:
        body["choices"][0]["meta_info"] = sglang_meta_info(cfg, tr, n, finish_reason)
    if cfg.spec_request_metrics:
        body["metrics"] = {"speculative_decoding": vllm_spec_metrics(cfg, tr)}
    return body


def vllm_spec_metrics(cfg: ServerConfig, tr: RequestTrace) -> dict[str, Any]:
    """vLLM's per-request `metrics.speculative_decoding` (summary form; vllm tests/v1/spec_decode):
    acceptance_histogram[j] = spec steps that accepted exactly j drafts."""
    steps, accepted, drafted = tr.spec_verify_ct, tr.spec_accepted, tr.spec_draft_tokens
    return {
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": list(tr.spec_histogram),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": cfg.spec_k,
    }


# ---- SGLang ------------------------------------------------------------------------------------------------


def sglang_event(
    cfg: ServerConfig,
    tr: RequestTrace,
    cumulative_text: str,
    completion_tokens: int,
    finish_reason: str | None,
) -> dict[str, Any]:
    return {
        "text": cumulative_text,
        "meta_info": sglang_meta_info(cfg, tr, completion_tokens, finish_reason, rid=tr.id),
    }


SGLANG_STREAM_META_ERROR = (
    "return_meta_info is not supported with streaming. "
    "Please set stream=false when using return_meta_info=true."
)


def sglang_error(message: str, code: int = 400) -> dict[str, Any]:
    """SGLang's OpenAI-server ErrorResponse."""
    return {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": code}


def sglang_meta_info(
    cfg: ServerConfig,
    tr: RequestTrace,
    completion_tokens: int,
    finish_reason: str | None,
    rid: str | None = None,
) -> dict[str, Any]:
    """`meta_info` as SGLang's tokenizer manager builds it; the speculative fields follow
    `fill_spec_decoding_meta` (python/sglang/srt/managers/.../spec_decoding_meta.py)."""
    fr: dict[str, Any] | None = None
    if finish_reason == "length":
        fr = {"type": "length", "length": completion_tokens}
    elif finish_reason == "stop":
        fr = {"type": "stop", "matched": 1}
    meta: dict[str, Any] = {
        "id": rid or tr.id,
        "finish_reason": fr,
        "prompt_tokens": tr.prompt_tokens,
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
    }
    # Only on the finished request, and only when it took part in verify steps.
    if finish_reason is not None and tr.spec_verify_ct > 0 and tr.spec_draft_tokens > 0:
        meta["spec_accept_rate"] = tr.spec_accepted / tr.spec_draft_tokens  # drafts only, no bonus
        meta["spec_accept_length"] = completion_tokens / tr.spec_verify_ct  # bonus (and first token) included
        meta["spec_num_correct_drafts"] = tr.spec_accepted
        meta["spec_num_proposed_drafts"] = tr.spec_draft_tokens
        meta["spec_verify_ct"] = tr.spec_verify_ct
        meta["spec_accepted_drafts"] = tr.spec_accepted  # SGLang's backward-compatible aliases
        meta["spec_proposed_drafts"] = tr.spec_draft_tokens
        meta["spec_correct_drafts_histogram"] = list(tr.spec_histogram)
        meta["spec_accept_histogram"] = list(tr.spec_histogram)
    return meta


def sglang_server_info(cfg: ServerConfig, engine: DecodeEngine) -> dict[str, Any]:
    spec = engine.stats.spec
    # Cumulative since start (the scope trap the spec issue warns about): accepted tokens per verify step.
    avg = 1.0 + spec.accepted / spec.drafts if spec.drafts else 1.0
    return {
        "model_path": cfg.model,
        "served_model_name": cfg.model,
        "host": cfg.host,
        "port": cfg.port,
        "attention_backend": "reference",
        "page_size": 1,
        "max_running_requests": cfg.max_batch,
        "speculative_algorithm": "EAGLE" if cfg.spec_k else None,
        "speculative_num_steps": cfg.spec_k or None,
        "speculative_eagle_topk": 1 if cfg.spec_k else None,
        "speculative_num_draft_tokens": cfg.spec_k + 1 if cfg.spec_k else None,
        "enable_metrics": True,
        "internal_states": [{"avg_spec_accept_length": avg, "last_gen_throughput": 0.0}],
        "version": "reference",
    }


# ---- llama.cpp ---------------------------------------------------------------------------------------------


def llamacpp_timings(tr: RequestTrace, predicted_n: int | None = None) -> dict[str, Any]:
    n = tr.completion_tokens if predicted_n is None else predicted_n
    first = tr.first_token_ns if tr.first_token_ns is not None else tr.accepted_ns
    last = tr.chunk_ns[-1] if tr.chunk_ns else first
    prompt_ms = (first - tr.accepted_ns) / 1e6
    predicted_ms = max((last - first) / 1e6, 1e-3)
    # Field set of llama.cpp result_timings::to_json (draft fields only when something was drafted).
    out: dict[str, Any] = {
        "cache_n": 0,
        "prompt_n": tr.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / max(tr.prompt_tokens, 1),
        "prompt_per_second": tr.prompt_tokens / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
        "predicted_n": n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(n, 1),
        "predicted_per_second": n / predicted_ms * 1e3,
    }
    if tr.spec_draft_tokens:
        out["draft_n"] = tr.spec_draft_tokens
        out["draft_n_accepted"] = tr.spec_accepted
    return out


def llamacpp_props(cfg: ServerConfig) -> dict[str, Any]:
    return {
        "default_generation_settings": {"n_ctx": 4096, "params": {"n_predict": -1, "temperature": 0.8}},
        "total_slots": cfg.max_batch,
        "model_path": cfg.model,
        "build_info": "reference",
    }


def llamacpp_slots(cfg: ServerConfig, engine: DecodeEngine) -> list[dict[str, Any]]:
    busy = engine.stats.running
    return [
        {
            "id": i,
            "n_ctx": 4096,
            "speculative": bool(cfg.spec_k),
            "is_processing": i < busy,
            "params": {"speculative.n_max": cfg.spec_k, "speculative.n_min": 0, "speculative.p_min": 0.75},
        }
        for i in range(cfg.max_batch)
    ]


# ---- Prometheus metrics ------------------------------------------------------------------------------------


class _EngineCollector(Collector):
    """Reads the engine's counters at scrape time, under the personality's metric names and labels."""

    def __init__(self, srv: ReferenceServer) -> None:
        self._srv = srv

    def collect(self) -> Iterator[Any]:
        engine = self._srv.engine
        if engine is None:
            return
        cfg = self._srv.cfg
        if cfg.personality == "vllm":
            yield from _vllm_metrics(cfg, engine)
        elif cfg.personality == "llamacpp":
            yield from _llamacpp_metrics(engine)
        elif cfg.personality == "sglang":
            yield from _sglang_metrics(cfg, engine)


def _vllm_metrics(cfg: ServerConfig, engine: DecodeEngine) -> Iterator[Any]:
    # vllm/v1/metrics/loggers.py: every metric carries labelnames ["model_name", "engine"].
    s = engine.stats
    labels = {"model_name": cfg.model, "engine": "0"}
    yield from _counters(
        labels,
        {
            "vllm:prompt_tokens": ("Number of prefill tokens processed.", s.prompt_tokens),
            "vllm:generation_tokens": ("Number of generation tokens processed.", s.generation_tokens),
        },
    )
    yield from _gauges(
        labels,
        {
            "vllm:num_requests_running": ("Number of requests in model execution batches.", s.running),
            "vllm:num_requests_waiting": ("Number of requests waiting to be processed.", s.waiting),
        },
    )
    if cfg.spec_k:  # SpecDecodingProm registers nothing without a speculative config
        yield from _spec_counters("vllm", labels, engine)


def _llamacpp_metrics(engine: DecodeEngine) -> Iterator[Any]:
    # tools/server server_task_result_metrics::to_metrics: no labels; the spec counters are always there, the
    # per-position series only once something was drafted.
    s = engine.stats
    spec = s.spec
    yield from _counters(
        {},
        {
            "llamacpp:prompt_tokens": (
                "Number of prompt tokens processed, excluding cached tokens",
                s.prompt_tokens,
            ),
            "llamacpp:prompt_tokens_cached": ("Number of prompt tokens reused from the cache", 0),
            "llamacpp:prompt_seconds": ("Total time spent processing prompts", s.prefill_seconds),
            "llamacpp:tokens_predicted": ("Number of generation tokens processed", s.generation_tokens),
            "llamacpp:tokens_predicted_seconds": ("Total time spent generating tokens", s.decode_seconds),
            "llamacpp:n_decode": ("Total number of llama_decode() calls", s.decode_steps),
            "llamacpp:spec_decode_num_draft_tokens": (
                "Speculative: Total draft tokens generated",
                spec.draft_tokens,
            ),
            "llamacpp:spec_decode_num_accepted_tokens": (
                "Speculative: Total draft tokens accepted by the target model",
                spec.accepted,
            ),
            "llamacpp:spec_decode_num_drafts": (
                "Speculative: Total speculative decoding verification steps",
                spec.drafts,
            ),
        },
    )
    yield from _gauges(
        {},
        {
            # llama.cpp types this one a counter, but a counter sample must end in _total here; the
            # sample name is what scrapers match, so it is exported as a gauge under its exact name.
            "llamacpp:n_tokens_max": ("Largest observed sequence length (prompt + generation)", s.tokens_max),
            "llamacpp:prompt_tokens_seconds": ("Average prompt throughput in tokens/s", 0.0),
            "llamacpp:predicted_tokens_seconds": (
                "Average generation throughput in tokens/s",
                _window(s).tok_s,
            ),
            "llamacpp:requests_processing": ("Number of requests processing", s.running),
            "llamacpp:requests_deferred": ("Number of requests deferred", s.waiting),
            "llamacpp:n_busy_slots_per_decode": (
                "Average number of busy slots per llama_decode() call",
                s.busy_batch_sum / max(s.decode_steps, 1),
            ),
        },
    )
    if spec.drafts:
        yield _per_position("llamacpp", {}, spec.per_position, "Accepted tokens per draft position")


def _sglang_metrics(cfg: ServerConfig, engine: DecodeEngine) -> Iterator[Any]:
    # python/sglang/srt/metrics/collector.py; the speculative ones are last-interval gauges, not counters.
    s = engine.stats
    labels = {"model_name": cfg.model}
    window = _window(s)
    yield from _counters(
        labels,
        {
            "sglang:prompt_tokens": ("Number of prefill tokens processed.", s.prompt_tokens),
            "sglang:generation_tokens": ("Number of generation tokens processed.", s.generation_tokens),
        },
    )
    yield from _gauges(
        labels,
        {
            "sglang:num_running_reqs": ("The number of running requests.", s.running),
            "sglang:num_queue_reqs": ("The number of requests in the waiting queue.", s.waiting),
            "sglang:gen_throughput": ("The generation throughput (token/s).", window.tok_s),
            "sglang:spec_accept_length": (
                "The average acceptance length of speculative decoding.",
                window.accept_length,
            ),
            "sglang:spec_accept_rate": (
                "The average acceptance rate of speculative decoding (accepted / draft tokens).",
                window.accept_rate,
            ),
        },
    )


@dataclass(frozen=True)
class _Window:
    tok_s: float
    accept_length: float
    accept_rate: float


def _window(s: EngineStats) -> _Window:
    """Figures over the engine's most recent steps (what engines report as last-interval gauges)."""
    recent = list(s.recent)
    if len(recent) < 2:
        return _Window(0.0, 0.0, 0.0)
    span = recent[-1][0] - recent[0][0]
    tokens = sum(r[1] for r in recent[1:])
    drafts = sum(r[2] for r in recent)
    accepted = sum(r[3] for r in recent)
    draft_tokens = drafts * len(s.spec.per_position)
    return _Window(
        tok_s=tokens / span if span > 0 else 0.0,
        accept_length=1.0 + accepted / drafts if drafts else 0.0,
        accept_rate=accepted / draft_tokens if draft_tokens else 0.0,
    )


def _counters(
    labels: Mapping[str, str], values: Mapping[str, tuple[str, float]]
) -> Iterator[CounterMetricFamily]:
    for name, (doc, v) in values.items():
        m = CounterMetricFamily(name, doc, labels=list(labels))
        m.add_metric(list(labels.values()), v)
        yield m


def _gauges(
    labels: Mapping[str, str], values: Mapping[str, tuple[str, float]]
) -> Iterator[GaugeMetricFamily]:
    for name, (doc, v) in values.items():
        m = GaugeMetricFamily(name, doc, labels=list(labels))
        m.add_metric(list(labels.values()), v)
        yield m


def _spec_counters(
    prefix: str, labels: Mapping[str, str], engine: DecodeEngine
) -> Iterator[CounterMetricFamily]:
    spec = engine.stats.spec
    yield from _counters(
        labels,
        {
            f"{prefix}:spec_decode_num_drafts": ("Number of spec decoding drafts.", spec.drafts),
            f"{prefix}:spec_decode_num_draft_tokens": ("Number of draft tokens.", spec.draft_tokens),
            f"{prefix}:spec_decode_num_accepted_tokens": ("Number of accepted tokens.", spec.accepted),
        },
    )
    yield _per_position(prefix, labels, spec.per_position, "Accepted tokens per draft position.")


def _per_position(prefix: str, labels: Mapping[str, str], counts: list[int], doc: str) -> CounterMetricFamily:
    name = f"{prefix}:spec_decode_num_accepted_tokens_per_pos"
    m = CounterMetricFamily(name, doc, labels=[*labels, "position"])
    for i, v in enumerate(counts):
        m.add_metric([*labels.values(), str(i)], v)
    return m


class Metrics:
    """The server's own CollectorRegistry (one per server instance, so servers in one process don't mix)."""

    def __init__(self, srv: ReferenceServer) -> None:
        self._srv = srv
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(srv))

    def exposition(self) -> bytes | None:
        """Prometheus text, or None when the personality exports no metrics (plain OpenAI)."""
        if self._srv.cfg.personality == "openai":
            return None
        return generate_latest(self.registry)
