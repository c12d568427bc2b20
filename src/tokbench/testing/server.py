"""ReferenceServer: an OpenAI-compatible streaming server on aiohttp.web whose every byte is on its timeline.

    async with ReferenceServer(ServerConfig(itl_ms=2)) as srv:
        ...  # talk to srv.base_url; then srv.timeline[id] says when each chunk left and what it carried

Endpoints: POST /v1/chat/completions, /v1/completions (stream and not), GET /v1/models, /health, plus the
chosen personality's own (see personalities.py). Generation timing comes from the shared DecodeEngine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from tokbench.errors import ConfigError
from tokbench.testing import personalities as pers
from tokbench.testing import protocol as proto
from tokbench.testing.engine import DecodeEngine, Emission, Job
from tokbench.testing.faults import Fault, FaultPlan, strike_after
from tokbench.testing.settings import ServerConfig
from tokbench.testing.text import answer_text, count_prompt_tokens, natural_length, prompt_key
from tokbench.testing.timeline import RequestTrace, write_jsonl

DIE_EXIT_CODE = 1
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_ID_PREFIX = {"chat": "chatcmpl", "completions": "cmpl", "sglang": "rid", "llamacpp": "cmpl"}


class ReferenceServer:
    """The reference server, in-process. `start()`/`close()` or `async with`.

    `rng` seeds everything random (run speed, step jitter, acceptance, faults, sampled text); by default it is
    `numpy.random.default_rng(cfg.seed)`. `clock` stamps the timeline (default `time.perf_counter_ns`).
    """

    def __init__(
        self,
        cfg: ServerConfig | None = None,
        *,
        rng: np.random.Generator | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.cfg = cfg or ServerConfig()
        root = rng if rng is not None else np.random.default_rng(self.cfg.seed)
        engine_rng, fault_rng, text_rng = root.spawn(3)
        self._engine_rng = engine_rng
        self._faults = FaultPlan(self.cfg.faults, fault_rng)
        self._text_rng = text_rng
        self._clock = clock
        self.timeline: dict[str, RequestTrace] = {}
        self.engine: DecodeEngine | None = None
        self.port: int = 0
        self._seq = 0
        self._finished = 0
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._started_mono = 0.0
        self._created = int(time.time())
        self._open: set[asyncio.Transport] = set()
        self.dead = False
        self._die_task: asyncio.Task[None] | None = None
        self.metrics = pers.Metrics(self)

    # ---- lifecycle -----------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    @property
    def loading(self) -> bool:
        return time.monotonic() - self._started_mono < self.cfg.load_time_s

    async def start(self) -> None:
        self.engine = DecodeEngine(self.cfg, self._engine_rng)
        self.engine.start()
        self._started_mono = time.monotonic()
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._dead_middleware])
        self._routes(app)
        # Short shutdown timeout: a stalled stream must not hold up a test's teardown.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        try:
            await self._site.start()
        except OSError as e:
            await self._runner.cleanup()
            await self.engine.close()
            raise ConfigError(f"--port: cannot listen on {self.cfg.host}:{self.cfg.port}: {e}") from e
        for addr in self._runner.addresses:
            if isinstance(addr, tuple):
                self.port = int(addr[1])
                break

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.engine is not None:
            await self.engine.close()
        if self.cfg.timeline_out:
            write_jsonl(self.timeline.values(), self.cfg.timeline_out)

    async def __aenter__(self) -> ReferenceServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def traces(self, *, ok_only: bool = False) -> list[RequestTrace]:
        """Generation requests in arrival order."""
        return [t for t in self.timeline.values() if t.ok or not ok_only]

    # ---- routes --------------------------------------------------------------------------------------------

    @web.middleware
    async def _dead_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        # In-process stand-in for a dead process: pooled keep-alive connections still reach us, so cut them.
        if self.dead:
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=503)
        return await handler(request)

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        personality = self.cfg.personality
        if personality == "sglang":
            app.router.add_post("/generate", self._sglang_generate)
            app.router.add_get("/health_generate", self._health)
            app.router.add_get("/get_server_info", self._sglang_server_info)
            app.router.add_get("/server_info", self._sglang_server_info)
            app.router.add_get("/get_model_info", self._sglang_model_info)
        elif personality == "llamacpp":
            app.router.add_get("/props", self._llamacpp_props)
            app.router.add_get("/slots", self._llamacpp_slots)
            app.router.add_get("/v1/health", self._health)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", lambda b: proto.parse_openai(b, "chat"))

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions", lambda b: proto.parse_openai(b, "completions"))

    async def _sglang_generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "sglang", proto.parse_sglang)

    async def _models(self, request: web.Request) -> web.Response:
        owned_by = {"vllm": "vllm", "llamacpp": "llamacpp", "sglang": "sglang"}.get(
            self.cfg.personality, "tokbench"
        )
        return web.json_response(proto.models_body(self.cfg.model, self._created, owned_by))

    async def _health(self, request: web.Request) -> web.Response:
        status, body = pers.health(self.cfg.personality, self.loading)
        if body is None:
            return web.Response(status=status)
        return web.json_response(body, status=status)

    async def _metrics(self, request: web.Request) -> web.Response:
        text = self.metrics.exposition()
        if text is None:
            return web.Response(status=404, text="metrics are not exported by this personality\n")
        return web.Response(body=text, content_type="text/plain", charset="utf-8")

    async def _sglang_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(pers.sglang_server_info(self.cfg, self._engine()))

    async def _sglang_model_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"model_path": self.cfg.model, "tokenizer_path": self.cfg.model, "is_generation": True}
        )

    async def _llamacpp_props(self, request: web.Request) -> web.Response:
        return web.json_response(pers.llamacpp_props(self.cfg))

    async def _llamacpp_slots(self, request: web.Request) -> web.Response:
        return web.json_response(pers.llamacpp_slots(self.cfg, self._engine()))

    def _engine(self) -> DecodeEngine:
        if self.engine is None:
            raise RuntimeError("ReferenceServer.start() was not called")
        return self.engine

    # ---- generation ----------------------------------------------------------------------------------------

    def _new_trace(self, request: web.Request, api: str) -> RequestTrace:
        seq = self._seq
        self._seq += 1
        trace = RequestTrace(
            id=f"{_ID_PREFIX.get(api, 'req')}-{seq}",
            seq=seq,
            path=request.path,
            api=api,
            accepted_ns=self._clock(),
        )
        self.timeline[trace.id] = trace
        return trace

    def _error(self, trace: RequestTrace, status: int, message: str, type_: str) -> web.Response:
        trace.status = status
        trace.end_ns = self._clock()
        headers = {"Retry-After": "1"} if status == 429 else None
        return web.json_response(proto.error_body(message, status, type_), status=status, headers=headers)

    async def _generate(
        self, request: web.Request, api: proto.Api, parse: Callable[[Any], proto.GenParams]
    ) -> web.StreamResponse:
        trace = self._new_trace(request, api)
        try:
            return await self._generate_traced(request, api, parse, trace)
        finally:
            if trace.end_ns is None:
                trace.end_ns = self._clock()
            self._request_done()

    async def _generate_traced(
        self,
        request: web.Request,
        api: proto.Api,
        parse: Callable[[Any], proto.GenParams],
        trace: RequestTrace,
    ) -> web.StreamResponse:
        cfg = self.cfg
        try:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise proto.BadRequest("the request body is not valid JSON") from None
            p = parse(body)
        except proto.BadRequest as e:
            return self._error(trace, 400, str(e), "BadRequestError")
        trace.prompt, trace.max_tokens, trace.stream, trace.ignore_eos = (
            p.prompt,
            p.max_tokens,
            p.stream,
            p.ignore_eos,
        )
        trace.prompt_tokens = count_prompt_tokens(p.prompt)
        if self.loading:
            return self._error(trace, 503, "Loading model", "unavailable_error")
        if cfg.personality == "sglang" and api != "sglang" and p.stream and p.return_meta_info:
            trace.status = 400
            trace.end_ns = self._clock()
            return web.json_response(pers.sglang_error(pers.SGLANG_STREAM_META_ERROR), status=400)
        if cfg.personality in ("openai", "vllm") and p.model is not None and p.model != cfg.model:
            return self._error(trace, 404, f"The model `{p.model}` does not exist.", "NotFoundError")
        fault = self._faults.draw()
        trace.fault = fault.value if fault else None
        if fault is Fault.HTTP_500:
            trace.fault_ns = self._clock()
            return self._error(trace, 500, "injected fault: internal server error", "InternalServerError")
        if fault is Fault.HTTP_429:
            trace.fault_ns = self._clock()
            return self._error(trace, 429, "injected fault: too many requests", "RateLimitError")

        natural = max(p.min_tokens, natural_length(p.prompt, cfg.natural_max))
        if p.ignore_eos or natural >= p.max_tokens:
            target, finish_reason = p.max_tokens, "length"
        else:
            target, finish_reason = natural, "stop"
        trace.target_tokens = target
        salt = 0
        if p.temperature > 0:
            salt = p.seed if p.seed is not None else int(self._text_rng.integers(1, 2**62))
        gen = _Generation(self, request, trace, p, fault, finish_reason, prompt_key(p.prompt, salt))
        job = self._engine().submit(target, trace.prompt_tokens)
        if request.transport is not None:
            self._open.add(request.transport)
        try:
            if p.stream:
                return await gen.stream(job)
            return await gen.unary(job)
        except ConnectionError:
            trace.client_gone = True  # the client hung up mid-response
            return web.Response()  # never sent: the connection is gone
        finally:
            self._engine().cancel(job)
            if request.transport is not None:
                self._open.discard(request.transport)

    def _request_done(self) -> None:
        self._finished += 1
        if self.cfg.die_after is not None and self._finished >= self.cfg.die_after and not self.dead:
            self.dead = True
            # Let the last response's bytes leave before dying.
            asyncio.get_running_loop().call_later(0.02, self._die)

    def _die(self) -> None:
        if self.cfg.hard_exit:
            print(
                f"tokbench.testing: --die-after {self.cfg.die_after} reached; exiting hard", file=sys.stderr
            )
            sys.stderr.flush()
            sys.stdout.flush()
            os._exit(DIE_EXIT_CODE)
        # In-process we cannot exit: stop listening and cut every open connection instead.
        for tr in list(self._open):
            tr.abort()
        self._open.clear()
        if self._site is not None:
            self._die_task = asyncio.get_running_loop().create_task(self._site.stop())


class _Generation:
    """Serves one accepted generation request from its engine job: chunking, faults, personality extras."""

    def __init__(
        self,
        srv: ReferenceServer,
        request: web.Request,
        trace: RequestTrace,
        p: proto.GenParams,
        fault: Fault | None,
        finish_reason: str,
        key: int,
    ) -> None:
        self.srv, self.request, self.trace, self.p = srv, request, trace, p
        self.fault = fault if fault is not None and fault.mid_stream else None
        self.finish_reason = finish_reason
        self.key = key
        self.head = proto.Head(trace.id, srv._created, srv.cfg.model)
        self.clock = srv._clock

    def _account(self, e: Emission) -> None:
        if e.draft_tokens:
            self.trace.spec_verify_ct += 1
            self.trace.spec_draft_tokens += e.draft_tokens
            self.trace.spec_accepted += e.accepted
            hist = self.trace.spec_histogram
            if len(hist) < e.draft_tokens + 1:
                hist.extend([0] * (e.draft_tokens + 1 - len(hist)))
            hist[e.accepted] += 1

    def _text(self, start: int, count: int) -> str:
        return answer_text(self.key, start, count, self.srv.cfg.diverge_at)

    async def unary(self, job: Job) -> web.StreamResponse:
        while True:
            e = await job.next()
            self._account(e)
            if e.done:
                break
        n = job.generated
        text = self._text(0, n)
        tr = self.trace
        if self.fault is Fault.STALL:
            tr.fault_ns = self.clock()
            await asyncio.sleep(self.srv.cfg.stall_s)
        elif self.fault is Fault.DISCONNECT:
            tr.fault_ns = self.clock()
            if self.request.transport is not None:
                self.request.transport.abort()
            return web.Response()  # never sent: the connection is gone
        elif self.fault is Fault.MALFORMED:
            tr.fault_ns = self.clock()
            tr.add_chunk(self.clock(), n, text)
            return web.Response(
                body=b'{"id": "' + tr.id.encode() + b'", "choices": [{', content_type="application/json"
            )
        elif self.fault is Fault.ERROR_EVENT:
            tr.fault_ns = self.clock()
            return web.json_response(
                proto.error_body("injected fault: error during generation", 500, "InternalServerError"),
                status=500,
            )
        use = proto.usage(tr.prompt_tokens, n)
        body = pers.unary_body(
            self.srv.cfg, self.p, self.head, text, self.finish_reason, use, tr, self.srv._engine()
        )
        tr.add_chunk(self.clock(), n, text)
        tr.finish_reason = self.finish_reason
        resp = web.json_response(body)
        tr.end_ns = self.clock()
        return resp

    async def stream(self, job: Job) -> web.StreamResponse:
        cfg, tr, p = self.srv.cfg, self.trace, self.p
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(self.request)
        strike = strike_after(job.target_tokens) if self.fault is not None else None
        sent = buffered = 0
        started = False
        while True:
            e = await job.next()
            self._account(e)
            buffered += e.tokens
            # The first token goes out alone (TTFT); later tokens in chunks of tokens_per_chunk.
            if sent > 0 and buffered < cfg.tokens_per_chunk and not e.done:
                continue
            if not started:
                started = True
                for payload in pers.stream_preamble(cfg, p, self.head):
                    await resp.write(proto.sse(payload))
            finished = e.done and strike is None
            for payload, ntok, piece in pers.content_events(
                cfg, p, self.head, tr, sent, self._text, buffered, self.finish_reason if finished else None,
                self.srv._engine(),
            ):  # fmt: skip
                if ntok:
                    tr.add_chunk(self.clock(), ntok, piece)
                await resp.write(proto.sse(payload))
            sent += buffered
            buffered = 0
            if strike is not None and sent >= strike:
                strike = None
                if await self._strike(resp):
                    return resp
            if e.done:
                break
        for payload in pers.final_events(cfg, p, self.head, tr, self.finish_reason, self.srv._engine()):
            await resp.write(proto.sse(payload))
        await resp.write(proto.DONE)
        tr.finish_reason = self.finish_reason
        tr.end_ns = self.clock()
        await resp.write_eof()
        return resp

    async def _strike(self, resp: web.StreamResponse) -> bool:
        """Apply the mid-stream fault; True when the response is over."""
        tr = self.trace
        tr.fault_ns = self.clock()
        if self.fault is Fault.DISCONNECT:
            if self.request.transport is not None:
                self.request.transport.abort()
            tr.end_ns = self.clock()
            return True
        if self.fault is Fault.STALL:
            await asyncio.sleep(self.srv.cfg.stall_s)
            return False
        if self.fault is Fault.MALFORMED:
            await resp.write(b'data: {"id": "' + tr.id.encode() + b'", "choices": [{"delta": \n\n')
            return False
        # ERROR_EVENT: engines send an error object in the stream and then end it.
        err = proto.error_body("injected fault: error during generation", 500, "InternalServerError")
        await resp.write(proto.sse(err))
        await resp.write(proto.DONE)
        tr.end_ns = self.clock()
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return True
