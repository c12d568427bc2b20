"""The streaming client and the runner over real sockets: against the reference server (its timeline is the
ground truth), and against tiny raw servers for the keep-alive race, connect failures and API keys."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from tokbench.config import LoadSpec, load_spec
from tokbench.loadgen.client import StreamClient, fetch_text, resolve_model
from tokbench.loadgen.runner import run_sweep
from tokbench.records import ErrorKind, RequestRecord
from tokbench.stats.summary import trial_figures
from tokbench.testing import ReferenceServer, RequestTrace, ServerConfig
from tokbench.workload import Prompt, builtin_corpus

FAST = {"ttft_ms": 5.0, "itl_ms": 2.0}


def spec_for(base_url: str, **kw: Any) -> LoadSpec:
    values: dict[str, Any] = {
        "base_url": base_url,
        "model": "tokbench-reference",
        "max_tokens": 20,
        "warmup": 0,
    }
    values.update(kw)
    return load_spec(**values)


async def one(spec: LoadSpec, text: str = "hello there", api_key: str | None = None) -> RequestRecord:
    async with StreamClient(spec, api_key) as client:
        return await client.request(Prompt("p", text), 0, time.perf_counter_ns())


def by_prompt(srv: ReferenceServer) -> dict[str, RequestTrace]:
    return {t.prompt: t for t in srv.traces()}


# ---- against the reference server ------------------------------------------------------------------------


async def test_records_agree_with_the_server_timeline() -> None:
    async with ReferenceServer(ServerConfig(**FAST)) as srv:
        spec = spec_for(srv.base_url, concurrencies=(1, 4), max_tokens=200, warmup=1)
        run = await run_sweep(spec, environment={})
        traces = by_prompt(srv)
    assert run.meta.complete and run.meta.model == "tokbench-reference"
    for level in run.levels:
        (trial,) = level.trials
        measured = trial.measured
        assert len(measured) == spec.requests_for(level.concurrency)
        served = []
        for r in measured:
            tr = traces[prompt_text(r)]
            served.append(tr)
            assert r.ok and tr.ok
            assert r.completion_tokens == tr.completion_tokens == 200
            assert r.chunk_tokens == tuple(tr.chunk_tokens) and r.output_text == tr.text
            # Every chunk arrived after the server wrote it, and promptly (same host, idle client).
            lags = [(c - s) / 1e6 for c, s in zip(r.chunk_ns, tr.chunk_ns, strict=True)]
            assert min(lags) >= 0 and max(lags) < 100
            assert r.sent_ns <= tr.accepted_ns and r.end_ns >= (tr.end_ns or 0) - 1_000_000
        # The seed's Agg tok/s from the records against what the server's own timeline implies.
        figures = trial_figures(trial)
        tokens = sum(t.completion_tokens for t in served)
        server_wall = max(t.end_ns or 0 for t in served) - min(t.accepted_ns for t in served)
        assert figures.tokens == tokens
        assert figures.agg_tok_s == pytest.approx(tokens / (server_wall / 1e9), rel=0.02)
        assert trial.achieved_concurrency == pytest.approx(level.concurrency, rel=0.1)
    warm = [r for r in run.levels[0].trials[0].records if r.warmup]
    assert len(warm) == 1 and warm[0].ok


def prompt_text(r: RequestRecord) -> str:
    """The text the server saw for a record's built-in prompt (what the timeline is keyed by)."""
    return {p.id: p.text for p in builtin_corpus()}[r.prompt_id]


async def test_open_loop_poisson_arrivals() -> None:
    async with ReferenceServer(ServerConfig(**FAST)) as srv:
        spec = spec_for(srv.base_url, concurrencies=(8,), requests=30, request_rate=100.0, max_tokens=5)
        run = await run_sweep(spec, environment={})
    (trial,) = run.levels[0].trials
    assert trial.request_rate == 100.0 and len(trial.records) == 30 and all(r.ok for r in trial.records)
    due = sorted(r.scheduled_ns for r in trial.records)
    gaps_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(due)]
    assert 3 < sum(gaps_ms) / len(gaps_ms) < 30  # about 10 ms apart on average
    # Sent when due: the cap of 8 is never reached by 15 ms requests arriving every 10 ms or so.
    late_ms = sorted((r.sent_ns - r.scheduled_ns) / 1e6 for r in trial.records)
    assert late_ms[len(late_ms) // 2] < 5


@pytest.mark.parametrize(
    "fault, kind, status",
    [
        ("http_500", ErrorKind.HTTP_STATUS, 500),
        ("http_429", ErrorKind.HTTP_STATUS, 429),
        ("disconnect", ErrorKind.DISCONNECT, 200),
        ("stall", ErrorKind.STALL, 200),
        ("malformed", ErrorKind.PROTOCOL, 200),
        ("error_event", ErrorKind.SERVER_ERROR_EVENT, 200),
    ],
)
async def test_each_fault_lands_in_its_error_kind(fault: str, kind: ErrorKind, status: int) -> None:
    async with ReferenceServer(ServerConfig(**FAST, faults={fault: 1.0}, stall_s=30)) as srv:
        t0 = time.monotonic()
        r = await one(spec_for(srv.base_url, stall_timeout_s=0.3))
        elapsed = time.monotonic() - t0
        (trace,) = srv.traces()
    assert trace.fault == fault
    assert r.error_kind is kind and r.http_status == status
    assert r.error_message
    assert elapsed < 5  # a stalled stream ends at the stall timeout, not when the server resumes
    if status != 200:
        assert str(status) in r.error_message and "injected fault" in r.error_message
    if fault in ("disconnect", "stall", "malformed", "error_event"):
        assert r.chunk_tokens and r.first_token_ns is not None  # what arrived before the fault is kept


async def test_per_request_deadline() -> None:
    async with ReferenceServer(ServerConfig(ttft_ms=5, itl_ms=100)) as srv:
        t0 = time.monotonic()
        r = await one(spec_for(srv.base_url, max_tokens=100, timeout_s=0.5, stall_timeout_s=5))
    assert r.error_kind is ErrorKind.TIMEOUT
    assert time.monotonic() - t0 < 3
    assert 0 < sum(r.chunk_tokens) < 100


async def test_faulty_sweep_accounts_for_every_request_and_ends_in_time() -> None:
    faults = {"http_500": 0.1, "disconnect": 0.1, "stall": 0.1, "malformed": 0.05, "error_event": 0.05}
    kinds = {"http_500": ErrorKind.HTTP_STATUS, "disconnect": ErrorKind.DISCONNECT, "stall": ErrorKind.STALL,
             "malformed": ErrorKind.PROTOCOL, "error_event": ErrorKind.SERVER_ERROR_EVENT}  # fmt: skip
    async with ReferenceServer(ServerConfig(ttft_ms=2, itl_ms=1, faults=faults, stall_s=60, seed=3)) as srv:
        spec = spec_for(srv.base_url, concurrencies=(1, 4, 8), trials=2, stall_timeout_s=0.3, timeout_s=10)
        t0 = time.monotonic()
        run = await run_sweep(spec, environment={})
        traces = by_prompt(srv)
    assert time.monotonic() - t0 < 30
    seen = set()
    for level in run.levels:
        for trial in level.trials:
            ok = sum(r.ok for r in trial.measured)
            errors = sum(not r.ok for r in trial.measured)
            assert ok + errors == len(trial.measured) == spec.requests_for(level.concurrency)
            for r in trial.measured:
                tr = traces[prompt_text(r)]
                assert r.error_kind is (kinds[tr.fault] if tr.fault else None), (tr.fault, r.error_message)
                seen.add(r.error_kind)
    assert len(seen) >= 4  # the seed gave a mix of faults


@pytest.mark.parametrize(
    "personality, api", [("sglang", "sglang"), ("llamacpp", "chat"), ("vllm", "completions")]
)
async def test_engine_personalities(personality: str, api: str) -> None:
    cfg = ServerConfig(**FAST, personality=personality, tokens_per_chunk=3)  # type: ignore[arg-type]
    async with ReferenceServer(cfg) as srv:
        model = await resolve_model(srv.base_url)
        spec = spec_for(srv.base_url, api=api, model=model, max_tokens=30)
        r = await one(spec)
        (trace,) = srv.traces()
    assert r.ok, r.error_message
    assert r.completion_tokens == 30 and r.output_text == trace.text
    assert len(r.chunk_ns) == len(trace.chunk_ns)
    if personality != "vllm":  # plain OpenAI streams don't say how many tokens a chunk carried
        assert r.chunk_tokens == tuple(trace.chunk_tokens)
    if personality == "sglang":
        assert r.extras["meta_info"]["completion_tokens"] == 30
    if personality == "llamacpp":
        assert "timings" in r.extras


async def test_continuous_usage_counts_multi_token_chunks() -> None:
    async with ReferenceServer(ServerConfig(**FAST, personality="vllm", tokens_per_chunk=4)) as srv:
        extra = {"stream_options": {"continuous_usage_stats": True}}
        r = await one(spec_for(srv.base_url, max_tokens=21, extra_body=extra))
        (trace,) = srv.traces()
    assert r.ok and r.chunk_tokens == tuple(trace.chunk_tokens) and max(r.chunk_tokens) == 4


async def test_fetch_text_and_resolve_model_failures() -> None:
    async with ReferenceServer(ServerConfig(**FAST, personality="vllm")) as srv:
        assert "vllm:" in (await fetch_text(srv.base_url, "/metrics") or "")
        assert await fetch_text(srv.base_url, "/nope") is None
    port = free_port()
    assert await fetch_text(f"http://127.0.0.1:{port}", "/metrics", timeout_s=1) is None
    from tokbench.errors import ConfigError

    with pytest.raises(ConfigError, match="--model"):
        await resolve_model(f"http://127.0.0.1:{port}")


@pytest.mark.parametrize("api", ["chat", "sglang"])
async def test_a_100k_token_response_in_one_event_is_read_whole(api: str) -> None:
    # One SSE event of ~600 KB: far past aiohttp's 64 KiB default buffer and any line-length limit.
    cfg = ServerConfig(personality="sglang" if api == "sglang" else "openai", ttft_ms=0, itl_ms=0.001,
                       tokens_per_chunk=100_000)  # fmt: skip
    async with ReferenceServer(cfg) as srv:
        r = await one(spec_for(srv.base_url, api=api, max_tokens=100_000), text="a long one")
        (trace,) = srv.traces()
    assert r.ok, (r.error_kind, r.error_message)
    assert r.completion_tokens == trace.completion_tokens == 100_000
    assert r.output_text == trace.text and len(trace.text) > 400_000
    assert len(r.chunk_ns) == 2  # the first token alone, then the rest in one event


# ---- raw servers: keep-alive race, connect failures, keys, cancellation -----------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SSE_BODY = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
OK_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
    b"Content-Length: " + str(len(SSE_BODY)).encode() + b"\r\n\r\n" + SSE_BODY
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A bare HTTP/1.1 server; `handler(reader, writer, n)` gets each connection and its number."""
    conns: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(len(conns))
        try:
            await handler(reader, writer, len(conns) - 1)
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", conns
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head


async def test_keepalive_connection_closed_by_server_is_retried_once() -> None:
    # Like llama-server's 5 s keep-alive: the pooled connection is closed just as the next request reaches it.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(OK_RESPONSE)
        await writer.drain()
        await read_request(reader)  # the second request on this connection: close without a byte

    async with raw_server(handler) as (url, conns), StreamClient(spec_for(url)) as client:
        first = await client.request(Prompt("a", "x"), 0, 0)
        second = await client.request(Prompt("b", "y"), 1, 0)
    assert first.ok and not first.retried
    assert second.ok and second.retried and second.output_text == "hi"
    assert len(conns) == 2  # the retry went out on a fresh connection


async def test_server_that_always_drops_is_a_connect_error_after_one_retry() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)

    async with raw_server(handler) as (url, conns):
        r = await one(spec_for(url))
    assert r.error_kind is ErrorKind.CONNECT and r.retried
    assert "retry" in (r.error_message or "")
    assert len(conns) == 2


async def test_connect_that_never_completes_is_a_connect_timeout() -> None:
    # A listener that never accepts, its backlog full: the kernel drops further SYNs, so connect hangs.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(4):
            f = socket.socket()
            f.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                f.connect(("127.0.0.1", port))
            fillers.append(f)
        t0 = time.monotonic()
        try:
            r = await one(spec_for(f"http://127.0.0.1:{port}", timeout_s=1.0))
        finally:
            for f in fillers:
                f.close()
    assert r.error_kind is ErrorKind.CONNECT, (r.error_kind, r.error_message)
    assert "connect timed out" in (r.error_message or "") and r.http_status is None
    assert time.monotonic() - t0 < 10


async def test_refused_connection_is_a_connect_error() -> None:
    r = await one(spec_for(f"http://127.0.0.1:{free_port()}"))
    assert r.error_kind is ErrorKind.CONNECT and not r.retried and r.http_status is None


async def test_garbage_response_is_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": 1}\n\n\n'
        )
        await writer.drain()

    async with raw_server(handler) as (url, _):
        r = await one(spec_for(url))
    assert r.error_kind is ErrorKind.PROTOCOL and r.http_status == 200


async def test_api_key_is_sent_but_never_recorded() -> None:
    key = "sk-test-SECRET-1234"
    seen: list[str] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        seen.append(auth)
        # A careless server that echoes the credentials in its error body.
        return web.json_response({"error": {"message": f"forbidden for {auth}"}}, status=403)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        r = await one(spec_for(f"http://127.0.0.1:{port}"), api_key=key)
    finally:
        await runner.cleanup()
    assert seen == [f"Bearer {key}"]
    assert r.error_kind is ErrorKind.HTTP_STATUS and r.http_status == 403
    assert key not in json.dumps(r.error_message) and "***" in (r.error_message or "")


async def test_cancelled_sweep_keeps_finished_records() -> None:
    async with ReferenceServer(ServerConfig(ttft_ms=2, itl_ms=20)) as srv:
        spec = spec_for(srv.base_url, concurrencies=(2,), requests=20, max_tokens=10)
        finished: list[RequestRecord] = []
        task = asyncio.ensure_future(
            run_sweep(spec, on_record=lambda c, t, r: finished.append(r), environment={})
        )
        while len(finished) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        run = await asyncio.wait_for(task, 10)
    assert not run.meta.complete
    (trial,) = run.levels[0].trials
    assert trial.interrupted
    kinds = [r.error_kind for r in trial.records]
    assert kinds.count(ErrorKind.CANCELLED) == 2  # the two in flight
    assert sum(r.ok for r in trial.records) >= 3
    assert len(finished) == len(trial.records)  # every record was handed over as it finished
