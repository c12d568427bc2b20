"""The reference server over real sockets: wire formats, exact token counts, the batching model, seeded noise,
every fault kind, die-after / fail-start / SIGTERM in subprocess mode, and the timeline against the client."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokbench.testing import (
    DIE_EXIT_CODE,
    ReferenceServer,
    ServerConfig,
    answer_text,
    natural_length,
    prompt_key,
    read_jsonl,
)

FAST: dict[str, Any] = {"ttft_ms": 5.0, "itl_ms": 1.0}
TIMEOUT = aiohttp.ClientTimeout(total=20)


def chat_body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tokbench-reference",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    body.update(extra)
    return body


class Stream:
    """What the client saw: each SSE data line with its arrival time, and how the stream ended."""

    def __init__(self) -> None:
        self.status = 0
        self.events: list[tuple[int, str]] = []
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1][1] == "[DONE]"

    def json_events(self) -> list[dict[str, Any]]:
        out = []
        for _, data in self.events:
            if data != "[DONE]":
                out.append(json.loads(data))
        return out

    def text(self) -> str:
        return "".join(t for _, t in self.content())

    def content(self) -> list[tuple[int, str]]:
        """(arrival ns, text) of each event that carried text."""
        out = []
        for ns, data in self.events:
            if data == "[DONE]":
                continue
            obj = json.loads(data)
            for choice in obj.get("choices") or []:
                text = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                if text:
                    out.append((ns, text))
        return out


async def stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], read_timeout: float | None = None
) -> Stream:
    s = Stream()
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=20, sock_read=read_timeout)
        ) as r:
            s.status = r.status
            buf = b""
            async for piece in r.content.iter_any():
                now = time.perf_counter_ns()
                buf += piece
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if line.startswith(b"data: "):
                            s.events.append((now, line[6:].decode()))
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        s.error = e
    return s


def chat_url(srv: ReferenceServer) -> str:
    return srv.base_url + "/v1/chat/completions"


def finish_reasons(s: Stream) -> list[str]:
    return [
        e["choices"][0]["finish_reason"]
        for e in s.json_events()
        if e["choices"] and e["choices"][0]["finish_reason"]
    ]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
        yield s


# ---- wire format -------------------------------------------------------------------------------------------


async def test_chat_stream_format_usage_and_done(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST)) as srv:
        s = await stream(session, chat_url(srv), chat_body("hello there", 7))
        models = await (await session.get(srv.base_url + "/v1/models")).json()
    assert s.status == 200 and s.done and s.error is None
    events = s.json_events()
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    finish = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finish] == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 7
    text = s.text()
    assert len(text.split()) == 7
    assert models["data"][0]["id"] == "tokbench-reference"


async def test_completions_stream_and_unary(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST, model="m1")) as srv:
        body = {
            "model": "m1",
            "prompt": "count to ten",
            "max_tokens": 9,
            "ignore_eos": True,
            "temperature": 0,
        }
        s = await stream(session, srv.base_url + "/v1/completions", {**body, "stream": True})
        async with session.post(srv.base_url + "/v1/completions", json=body) as r:
            unary = await r.json()
        async with session.post(srv.base_url + "/v1/completions", json={**body, "model": "other"}) as r:
            wrong_model = r.status
    assert s.done and all(e["object"] == "text_completion" for e in s.json_events())
    streamed = s.text()
    assert streamed == unary["choices"][0]["text"]
    assert unary["usage"]["completion_tokens"] == 9 and unary["choices"][0]["finish_reason"] == "length"
    assert not any("usage" in e for e in s.json_events())  # no include_usage, no usage chunk
    assert wrong_model == 404


async def test_tokens_per_chunk_groups_words_after_a_lone_first_token(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST, tokens_per_chunk=4)) as srv:
        s = await stream(session, chat_url(srv), chat_body("chunky", 14))
        trace = srv.traces()[0]
    words = [len(t.split()) for _, t in s.content()]
    assert words == [1, 4, 4, 4, 1]
    assert trace.chunk_tokens == words


async def test_max_tokens_exact_with_ignore_eos_and_natural_stop_without(
    session: aiohttp.ClientSession,
) -> None:
    cfg = ServerConfig(**FAST, natural_max=40)
    # Prompts whose natural answer is shorter than max_tokens, so only ignore_eos makes them run to the end.
    prompts = [f"prompt {i}" for i in range(50) if natural_length(f"prompt {i}", 40) < 30][:3]
    assert prompts
    async with ReferenceServer(cfg) as srv:
        url = chat_url(srv)
        for prompt in prompts:
            full = await stream(session, url, chat_body(prompt, 30))
            free = await stream(session, url, chat_body(prompt, 30, ignore_eos=False))
            floor = await stream(session, url, chat_body(prompt, 30, ignore_eos=False, min_tokens=30))
            natural = natural_length(prompt, 40)
            assert full.json_events()[-1]["usage"]["completion_tokens"] == 30
            assert free.json_events()[-1]["usage"]["completion_tokens"] == natural
            assert finish_reasons(free) == ["stop"]
            assert floor.json_events()[-1]["usage"]["completion_tokens"] == 30


async def test_text_is_a_pure_function_of_prompt_and_position(session: aiohttp.ClientSession) -> None:
    body = chat_body("the same question", 12)
    async with (
        ReferenceServer(ServerConfig(**FAST, seed=1)) as a,
        ReferenceServer(ServerConfig(**FAST, seed=2)) as b,
    ):
        ta = (await stream(session, chat_url(a), body)).text()
        tb = (await stream(session, chat_url(b), body)).text()
        prompt = a.traces()[0].prompt
    async with ReferenceServer(ServerConfig(**FAST, diverge_at=5)) as c:
        tc = (await stream(session, chat_url(c), body)).text()
    assert ta == tb == answer_text(prompt_key(prompt), 0, 12)
    assert tc.split()[:5] == ta.split()[:5] and tc.split()[5:] != ta.split()[5:]


async def test_bad_requests_get_400_naming_the_field(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST)) as srv:
        async with session.post(chat_url(srv), json={"max_tokens": 3}) as r:
            assert r.status == 400 and "messages" in (await r.json())["error"]["message"]
        bad = chat_body("x", 0)
        async with session.post(chat_url(srv), json=bad) as r:
            assert r.status == 400 and "max_tokens" in (await r.json())["error"]["message"]


# ---- timeline = what the client received -------------------------------------------------------------------


async def test_timeline_matches_what_the_client_received(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST, tokens_per_chunk=2)) as srv:
        url = chat_url(srv)
        streams = await asyncio.gather(*(stream(session, url, chat_body(f"q{i}", 11)) for i in range(4)))
        traces = {t.id: t for t in srv.traces()}
    for s in streams:
        events = s.json_events()
        trace = traces[events[0]["id"]]
        received = s.content()
        assert trace.chunk_tokens == [len(t.split()) for _, t in received]
        assert trace.text == "".join(t for _, t in received)
        assert trace.completion_tokens == events[-1]["usage"]["completion_tokens"] == 11
        assert trace.finish_reason == "length" and trace.ok
        for sent_ns, (got_ns, _) in zip(trace.chunk_ns, received, strict=True):
            assert 0 <= got_ns - sent_ns < 0.5e9  # same clock: received after it was sent
        assert trace.accepted_ns < trace.chunk_ns[0] <= trace.chunk_ns[-1] <= trace.end_ns  # type: ignore[operator]


# ---- the batching model ------------------------------------------------------------------------------------


async def _aggregate_tok_s(
    srv: ReferenceServer, session: aiohttp.ClientSession, concurrency: int, tokens: int = 40
) -> float:
    """Output tokens / wall time of one batch of `concurrency` requests, from the server's timeline."""
    url = chat_url(srv)
    before = len(srv.timeline)
    await asyncio.gather(
        *(stream(session, url, chat_body(f"c{concurrency}-{i}", tokens)) for i in range(concurrency))
    )
    traces = list(srv.timeline.values())[before:]
    tokens = sum(t.completion_tokens for t in traces)
    wall = max(t.end_ns or 0 for t in traces) - min(t.accepted_ns for t in traces)
    return tokens / (wall / 1e9)


async def test_throughput_grows_sublinearly_with_concurrency(session: aiohttp.ClientSession) -> None:
    cfg = ServerConfig(ttft_ms=5, itl_ms=3, batch_slope=0.15)
    async with ReferenceServer(cfg) as srv:
        one = await _aggregate_tok_s(srv, session, 1)
        eight = await _aggregate_tok_s(srv, session, 8)
    # Model: 8 / (1 + 0.15 * 7) = 3.9x; anything clearly above 1x and clearly below 8x shows the shape.
    assert 2.0 < eight / one < 6.0


async def test_run_noise_is_seeded(session: aiohttp.ClientSession) -> None:
    async def run(seed: int) -> tuple[float, float]:
        async with ReferenceServer(ServerConfig(noise=0.2, seed=seed, ttft_ms=1, itl_ms=4)) as srv:
            assert srv.engine is not None
            return srv.engine.run_multiplier, await _aggregate_tok_s(srv, session, 1)

    (m3, tok_s3), (m3_again, _), (m4, tok_s4) = await run(3), await run(3), await run(4)
    assert m3 == m3_again != m4
    # The drawn multiplier shows in measured throughput (20% noise makes the two seeds far apart).
    assert (tok_s3 / tok_s4) / (m3 / m4) == pytest.approx(1, abs=0.15)


async def test_max_batch_queues_and_queueing_shows_in_ttft(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(ttft_ms=5, itl_ms=2, max_batch=2)) as srv:
        url = chat_url(srv)
        await asyncio.gather(*(stream(session, url, chat_body(f"b{i}", 40)) for i in range(4)))
        traces = sorted(srv.traces(), key=lambda t: t.first_token_ns or 0)
    # Judged by order, not by wall-clock margins, so a loaded machine cannot flip it.
    for t in traces:
        assert t.first_token_ns is not None and t.end_ns is not None
        in_flight = [u for u in traces if u is not t and u.first_token_ns < t.first_token_ns < u.end_ns]  # type: ignore[operator]
        assert len(in_flight) <= 1, "never more than max_batch requests generate at once"
    slot_free = min(t.end_ns for t in traces[:2])  # type: ignore[type-var]
    queued = [t for t in traces[2:] if t.accepted_ns < slot_free]
    assert queued, "a request arrived while both slots were busy (40 steps of >= 2 ms give it time)"
    for t in queued:
        # Its TTFT holds the wait for a slot and then its own prefill (5 ms).
        assert t.first_token_ns - t.accepted_ns >= slot_free - t.accepted_ns + 5_000_000  # type: ignore[operator]


# ---- faults ------------------------------------------------------------------------------------------------


async def _one_with_fault(session: aiohttp.ClientSession, kind: str, **cfg: Any) -> tuple[Stream, Any]:
    async with ReferenceServer(ServerConfig(**FAST, faults={kind: 1.0}, **cfg)) as srv:
        s = await stream(session, chat_url(srv), chat_body("fault?", 10), read_timeout=5)
        return s, srv.traces()[0]


async def test_fault_http_statuses(session: aiohttp.ClientSession) -> None:
    for kind, status in (("http_500", 500), ("http_429", 429)):
        s, trace = await _one_with_fault(session, kind)
        assert s.status == status and trace.status == status and trace.fault == kind
        assert not trace.chunk_ns


async def test_fault_disconnect_cuts_the_stream_midway(session: aiohttp.ClientSession) -> None:
    s, trace = await _one_with_fault(session, "disconnect")
    assert s.status == 200 and not s.done and isinstance(s.error, aiohttp.ClientError)
    assert len(s.text().split()) == trace.completion_tokens == 5
    assert trace.fault == "disconnect" and trace.finish_reason is None


async def test_fault_stall_pauses_then_resumes(session: aiohttp.ClientSession) -> None:
    s, trace = await _one_with_fault(session, "stall", stall_s=0.4)
    assert s.done
    gaps = [b - a for a, b in itertools.pairwise(trace.chunk_ns)]
    assert max(gaps) >= 0.4e9 and trace.fault_ns is not None
    # A client with a shorter read timeout than the stall sees no bytes and gives up.
    async with ReferenceServer(ServerConfig(**FAST, faults={"stall": 1.0}, stall_s=30)) as srv:
        t0 = time.monotonic()
        cut = await stream(session, chat_url(srv), chat_body("x", 10), read_timeout=0.3)
        assert isinstance(cut.error, asyncio.TimeoutError) and time.monotonic() - t0 < 5


async def test_fault_malformed_line_then_stream_goes_on(session: aiohttp.ClientSession) -> None:
    s, trace = await _one_with_fault(session, "malformed")
    bad = []
    for _, data in s.events:
        try:
            json.loads(data) if data != "[DONE]" else None
        except json.JSONDecodeError:
            bad.append(data)
    assert len(bad) == 1 and s.done and trace.fault == "malformed"


async def test_fault_error_event_ends_the_stream(session: aiohttp.ClientSession) -> None:
    s, trace = await _one_with_fault(session, "error_event")
    objs = [json.loads(d) for _, d in s.events if d != "[DONE]"]
    assert "error" in objs[-1] and objs[-1]["error"]["code"] == 500 and s.done
    assert not any(o.get("choices") and o["choices"][0].get("finish_reason") for o in objs)
    assert trace.finish_reason is None and trace.fault == "error_event"


async def test_fault_sequence_is_seeded(session: aiohttp.ClientSession) -> None:
    async def kinds(seed: int) -> list[str | None]:
        cfg = ServerConfig(**FAST, seed=seed, faults={"http_500": 0.3, "http_429": 0.3})
        async with ReferenceServer(cfg) as srv:
            for i in range(16):
                await stream(session, chat_url(srv), chat_body(f"s{i}", 2))
            return [t.fault for t in srv.traces()]

    a, b, c = await kinds(7), await kinds(7), await kinds(8)
    assert a == b != c
    assert 0 < sum(k is not None for k in a) < 16


async def test_in_process_die_after_cuts_connections(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST, die_after=1)) as srv:
        url = chat_url(srv)
        first = await stream(session, url, chat_body("a", 3))
        await asyncio.sleep(0.2)
        after = await stream(session, url, chat_body("b", 3))
    assert first.done and not after.done and isinstance(after.error, aiohttp.ClientError)


# ---- subprocess mode ---------------------------------------------------------------------------------------


def _spawn(args: Sequence[str], tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokbench.testing", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "stderr.log").open("w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on http://127.0.0.1:"), line
    return proc, line.split()[-1]


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


async def test_subprocess_prints_port_and_exits_cleanly_on_sigterm(
    session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    timeline = tmp_path / "timeline.jsonl"
    proc, url = _spawn(["--itl-ms", "1", "--timeline-out", str(timeline)], tmp_path)
    try:
        s = await stream(session, url + "/v1/chat/completions", chat_body("sub", 5))
        assert s.done
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        _stop(proc)
    traces = read_jsonl(timeline)
    assert [t.completion_tokens for t in traces] == [5]


async def test_subprocess_die_after_exits_hard(session: aiohttp.ClientSession, tmp_path: Path) -> None:
    proc, url = _spawn(["--itl-ms", "1", "--die-after", "2"], tmp_path)
    try:
        for i in range(2):
            assert (await stream(session, url + "/v1/chat/completions", chat_body(f"d{i}", 3))).done
        assert proc.wait(10) == DIE_EXIT_CODE
    finally:
        _stop(proc)
    assert "--die-after 2" in (tmp_path / "stderr.log").read_text()


def test_subprocess_fail_start_prints_the_assertion(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokbench.testing", "--fail-start", "draft model and target disagree"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert "Traceback (most recent call last):" in lines
    assert lines[-1] == "AssertionError: draft model and target disagree"
    assert done.stdout == ""


def test_subprocess_bad_flag_names_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokbench.testing", "--fault-rate", "explode=0.1"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ},
    )
    assert done.returncode == 2 and "--fault-rate" in done.stderr and "explode" in done.stderr


# ---- personalities -----------------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text -> {(sample name, sorted labels): value}, parsed by prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_sglang_generate_stream_meta_info_and_server_info(session: aiohttp.ClientSession) -> None:
    cfg = ServerConfig(**FAST, personality="sglang", spec_accept=(0.9, 0.5))
    async with ReferenceServer(cfg) as srv:
        body = {
            "text": "sglang native",
            "sampling_params": {"max_new_tokens": 20, "ignore_eos": True},
            "stream": True,
        }
        s = await stream(session, srv.base_url + "/generate", body)
        async with session.get(srv.base_url + "/get_server_info") as r:
            info = await r.json()
        async with session.get(srv.base_url + "/server_info") as r:
            assert (await r.json())["internal_states"] == info["internal_states"]
        async with session.get(srv.base_url + "/health_generate") as r:
            assert r.status == 200
        trace = srv.traces()[0]
        assert srv.engine is not None
        spec = srv.engine.stats.spec
    assert s.done
    events = s.json_events()
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))  # cumulative text
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 20 == len(texts[-1].split())
    last = events[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 20}
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert "spec_verify_ct" not in events[0]["meta_info"]  # speculative fields only once finished
    assert last["spec_verify_ct"] == trace.spec_verify_ct > 0
    assert last["spec_accept_length"] == pytest.approx(20 / trace.spec_verify_ct)
    assert last["spec_num_proposed_drafts"] == 2 * trace.spec_verify_ct
    assert last["spec_accept_rate"] == pytest.approx(
        last["spec_num_correct_drafts"] / last["spec_num_proposed_drafts"]
    )
    assert sum(last["spec_correct_drafts_histogram"]) == trace.spec_verify_ct
    assert info["speculative_algorithm"] and "attention_backend" in info and "page_size" in info
    assert info["internal_states"][0]["avg_spec_accept_length"] == pytest.approx(
        1 + spec.accepted / spec.drafts
    )


async def test_sglang_openai_meta_info_only_without_streaming(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST, personality="sglang", spec_accept=(0.7,))) as srv:
        url = chat_url(srv)
        rejected = await stream(session, url, chat_body("meta", 8, return_meta_info=True))
        async with session.post(url, json=chat_body("meta", 8, return_meta_info=True, stream=False)) as r:
            unary = await r.json()
        plain = await stream(session, url, chat_body("meta", 8))
    assert rejected.status == 400
    meta = unary["choices"][0]["meta_info"]
    assert meta["completion_tokens"] == 8 and meta["spec_verify_ct"] > 0
    assert plain.done and not any("meta_info" in json.dumps(e) for e in plain.json_events())


async def test_vllm_metrics_names_and_labels(session: aiohttp.ClientSession) -> None:
    cfg = ServerConfig(**FAST, personality="vllm", model="org/model-7b", spec_accept=(0.8, 0.5, 0.2))
    async with ReferenceServer(cfg) as srv:
        await asyncio.gather(
            *(stream(session, chat_url(srv), chat_body(f"v{i}", 30, model="org/model-7b")) for i in range(4))
        )
        async with session.get(srv.base_url + "/metrics") as r:
            m = samples(await r.text())
        async with session.get(srv.base_url + "/health") as r:
            assert r.status == 200 and await r.read() == b""
    labels = (("engine", "0"), ("model_name", "org/model-7b"))
    assert m[("vllm:generation_tokens_total", labels)] == 120
    drafts = m[("vllm:spec_decode_num_drafts_total", labels)]
    assert m[("vllm:spec_decode_num_draft_tokens_total", labels)] == 3 * drafts
    per_pos = [
        m[("vllm:spec_decode_num_accepted_tokens_per_pos_total", (*labels, ("position", str(i))))]
        for i in range(3)
    ]
    assert sum(per_pos) == m[("vllm:spec_decode_num_accepted_tokens_total", labels)]
    assert per_pos[0] >= per_pos[1] >= per_pos[2]


async def test_openai_personality_has_no_metrics(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST)) as srv, session.get(srv.base_url + "/metrics") as r:
        assert r.status == 404


async def test_llamacpp_loading_health_token_chunks_and_timings(session: aiohttp.ClientSession) -> None:
    cfg = ServerConfig(
        ttft_ms=5, itl_ms=5, personality="llamacpp", load_time_s=0.4, spec_accept=(0.9, 0.9, 0.9)
    )
    async with ReferenceServer(cfg) as srv:
        async with session.get(srv.base_url + "/health") as r:
            loading = (r.status, await r.json())
        early = await stream(session, chat_url(srv), chat_body("too soon", 5))
        await asyncio.sleep(0.5)
        async with session.get(srv.base_url + "/health") as r:
            ready = (r.status, await r.json())
        with_usage = await stream(session, chat_url(srv), chat_body("llama", 24))
        without = await stream(session, chat_url(srv), chat_body("llama", 24, stream_options=None))
        async with session.get(srv.base_url + "/metrics") as r:
            m = samples(await r.text())
        async with session.get(srv.base_url + "/props") as r:
            assert "total_slots" in await r.json()
        async with session.get(srv.base_url + "/slots") as r:
            assert (await r.json())[0]["speculative"] is True
        trace = srv.traces()[1]
    assert loading == (503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    assert early.status == 503 and ready == (200, {"status": "ok"})
    # Speculation emits several tokens per step, yet llama-server streams each token as its own chunk.
    assert [len(t.split()) for _, t in with_usage.content()] == [1] * 24
    # The chunks of one step leave back to back; steps are >= itl apart. 24 tokens = first + verify steps.
    bursts = 1 + sum(b - a > 1e6 for a, b in itertools.pairwise(trace.chunk_ns))
    assert bursts == 1 + trace.spec_verify_ct < 24
    last = with_usage.json_events()[-1]
    assert last["choices"] == [] and last["timings"]["predicted_n"] == 24
    assert (
        last["timings"]["draft_n"] == trace.spec_draft_tokens
        and last["timings"]["draft_n_accepted"] == trace.spec_accepted
    )
    fin = without.json_events()[-1]  # without include_usage the finish chunk carries the timings
    assert fin["choices"][0]["finish_reason"] == "length" and "timings" in fin
    assert m[("llamacpp:tokens_predicted_total", ())] == 48
    assert m[("llamacpp:spec_decode_num_drafts_total", ())] > 0
    assert ("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", (("position", "2"),)) in m


# ---- speculative decoding ----------------------------------------------------------------------------------


async def test_spec_counters_imply_the_configured_acceptance(session: aiohttp.ClientSession) -> None:
    accept = (0.8, 0.6, 0.4)
    cfg = ServerConfig(ttft_ms=1, itl_ms=0.05, batch_slope=0, personality="vllm", spec_accept=accept, seed=11)
    async with ReferenceServer(cfg) as srv:
        async with session.get(srv.base_url + "/metrics") as r:
            before = samples(await r.text())
        await asyncio.gather(*(stream(session, chat_url(srv), chat_body(f"s{i}", 600)) for i in range(24)))
        async with session.get(srv.base_url + "/metrics") as r:
            after = samples(await r.text())
    labels = (("engine", "0"), ("model_name", "tokbench-reference"))

    def delta(name: str, extra: tuple[tuple[str, str], ...] = ()) -> float:
        key = (name, (*labels, *extra))
        return after[key] - before.get(key, 0.0)

    drafts = delta("vllm:spec_decode_num_drafts_total")
    assert drafts > 4000
    mean_len = 1 + delta("vllm:spec_decode_num_accepted_tokens_total") / drafts
    assert mean_len == pytest.approx(cfg.mean_accepted_length, rel=0.02)
    expected = 1.0
    for i, p in enumerate(accept):
        expected *= p
        rate = delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),)) / drafts
        assert rate == pytest.approx(expected, abs=4 * (expected * (1 - expected) / drafts) ** 0.5)


async def test_spec_speedup_is_accepted_length_over_step_cost(session: aiohttp.ClientSession) -> None:
    accept, cost = (0.9, 0.8, 0.6), 1.5
    base = ServerConfig(ttft_ms=1, itl_ms=4)
    spec = ServerConfig(ttft_ms=1, itl_ms=4, spec_accept=accept, spec_step_cost=cost)
    rates = []
    for cfg in (base, spec):
        async with ReferenceServer(cfg) as srv:
            rates.append(await _aggregate_tok_s(srv, session, 1, tokens=150))
    assert rates[1] / rates[0] == pytest.approx(spec.mean_accepted_length / cost, rel=0.2)


async def test_client_hanging_up_frees_the_slot_and_is_on_the_timeline(
    session: aiohttp.ClientSession,
) -> None:
    async with ReferenceServer(ServerConfig(ttft_ms=2, itl_ms=3)) as srv:
        async with session.post(chat_url(srv), json=chat_body("bye", 500)) as r:
            await r.content.readline()
        # Leaving the block early closes the connection; the server notices on its next write.
        for _ in range(100):
            if srv.traces()[0].end_ns is not None:
                break
            await asyncio.sleep(0.02)
        trace = srv.traces()[0]
        assert srv.engine is not None
        running = srv.engine.stats.running
    assert trace.client_gone and not trace.ok and trace.completion_tokens < 500
    assert running == 0


async def test_sampled_text_follows_the_request_seed(session: aiohttp.ClientSession) -> None:
    async with ReferenceServer(ServerConfig(**FAST)) as srv:
        greedy = (await stream(session, chat_url(srv), chat_body("sample me", 10))).text()
        seeded = [
            (await stream(session, chat_url(srv), chat_body("sample me", 10, temperature=0.7, seed=5))).text()
            for _ in range(2)
        ]
        unseeded = (await stream(session, chat_url(srv), chat_body("sample me", 10, temperature=0.7))).text()
    assert seeded[0] == seeded[1] != greedy
    assert unseeded not in (greedy, seeded[0])
