"""Per-engine shapes: health bodies, SGLang meta_info, llama.cpp timings, and each engine's metric names."""

from __future__ import annotations

from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tokbench.testing import ReferenceServer, RequestTrace, ServerConfig
from tokbench.testing import personalities as pers
from tokbench.testing.engine import DecodeEngine


def _trace(verify: int = 0, drafts: int = 0, accepted: int = 0) -> RequestTrace:
    t = RequestTrace(id="rid-0", seq=0, path="/generate", api="sglang", accepted_ns=0, prompt_tokens=4)
    t.add_chunk(5_000_000, 1, " a")
    t.add_chunk(25_000_000, 9, " b" * 9)
    t.spec_verify_ct, t.spec_draft_tokens, t.spec_accepted = verify, drafts, accepted
    t.spec_histogram = [1, 1, verify - 2] if verify else []
    return t


def test_health_bodies() -> None:
    assert pers.health("llamacpp", loading=True) == (
        503,
        {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
    )
    assert pers.health("llamacpp", loading=False) == (200, {"status": "ok"})
    assert pers.health("vllm", loading=False) == (200, None)
    assert pers.health("sglang", loading=True) == (503, None)


def test_sglang_spec_fields_only_on_the_finished_speculating_request() -> None:
    cfg = ServerConfig(spec_accept=(0.5, 0.5))
    t = _trace(verify=4, drafts=8, accepted=5)
    partial = pers.sglang_meta_info(cfg, t, 6, None)
    final = pers.sglang_meta_info(cfg, t, 10, "length")
    assert "spec_verify_ct" not in partial and partial["finish_reason"] is None
    assert final["finish_reason"] == {"type": "length", "length": 10}
    assert final["spec_accept_length"] == 10 / 4 and final["spec_accept_rate"] == 5 / 8
    assert final["spec_num_correct_drafts"] == final["spec_accepted_drafts"] == 5
    assert final["spec_num_proposed_drafts"] == final["spec_proposed_drafts"] == 8
    assert "spec_verify_ct" not in pers.sglang_meta_info(ServerConfig(), _trace(), 10, "stop")


def test_llamacpp_timings_carry_draft_fields_only_when_drafting() -> None:
    plain = pers.llamacpp_timings(_trace())
    assert plain["predicted_n"] == 10 and plain["prompt_n"] == 4 and "draft_n" not in plain
    assert plain["prompt_ms"] == 5.0 and plain["predicted_ms"] == 20.0
    spec = pers.llamacpp_timings(_trace(verify=3, drafts=9, accepted=6))
    assert (spec["draft_n"], spec["draft_n_accepted"]) == (9, 6)


def _scrape(personality: str, spec_accept: tuple[float, ...] = ()) -> dict[str, list[Any]]:
    srv = ReferenceServer(ServerConfig(personality=personality, model="m", spec_accept=spec_accept))  # type: ignore[arg-type]
    srv.engine = DecodeEngine(srv.cfg, np.random.default_rng(0))
    stats = srv.engine.stats
    stats.generation_tokens, stats.spec.drafts, stats.spec.draft_tokens = 50, 10, 10 * len(spec_accept)
    stats.spec.accepted, stats.spec.per_position = 12, [7, 5][: len(spec_accept)]
    text = srv.metrics.exposition()
    assert text is not None
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_vllm_metric_names_and_labels() -> None:
    m = _scrape("vllm", (0.7, 0.5))
    assert m["vllm:generation_tokens_total"] == [({"model_name": "m", "engine": "0"}, 50)]
    assert m["vllm:spec_decode_num_drafts_total"][0][1] == 10
    assert m["vllm:spec_decode_num_accepted_tokens_per_pos_total"] == [
        ({"model_name": "m", "engine": "0", "position": "0"}, 7),
        ({"model_name": "m", "engine": "0", "position": "1"}, 5),
    ]
    assert "vllm:spec_decode_num_drafts_total" not in _scrape(
        "vllm"
    )  # no speculative config, no spec metrics


def test_llamacpp_metric_names() -> None:
    m = _scrape("llamacpp", (0.7, 0.5))
    for name in (
        "llamacpp:tokens_predicted_total",
        "llamacpp:n_decode_total",
        "llamacpp:n_busy_slots_per_decode",
        "llamacpp:spec_decode_num_draft_tokens_total",
        "llamacpp:spec_decode_num_accepted_tokens_total",
        "llamacpp:spec_decode_num_drafts_total",
    ):
        assert name in m, name
    assert m["llamacpp:spec_decode_num_accepted_tokens_per_pos_total"][1] == ({"position": "1"}, 5)


def test_plain_openai_exports_no_metrics() -> None:
    srv = ReferenceServer(ServerConfig())
    assert srv.metrics.exposition() is None
