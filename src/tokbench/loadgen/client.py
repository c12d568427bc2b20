"""Streaming HTTP client: one aiohttp session per run, every request becomes a RequestRecord.

Failures are data: each aiohttp/asyncio exception is translated here, at the edge, into an ErrorKind with a
message. The API key goes into the session's headers and nowhere else; messages are scrubbed of it anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import aiohttp

from tokbench.config import LoadSpec
from tokbench.errors import ConfigError
from tokbench.loadgen.protocol import PATHS, StreamDecoder, build_payload, new_decoder
from tokbench.records import ErrorKind, RequestRecord
from tokbench.workload import Prompt

Clock = Callable[[], int]

# Large enough that a 100k-token response (or one SGLang cumulative event of it) never throttles the socket
# (vllm #39963: the 64 KiB default cut long-context throughput ~10x).
READ_BUFSIZE = 1 << 22
_CONNECT_TIMEOUT = getattr(aiohttp, "ConnectionTimeoutError", ())  # aiohttp >= 3.10 tells connect from read
_DRAIN_AFTER_DONE_S = 1.0


class StreamClient:
    """Sends streamed requests for one run. Use as `async with StreamClient(spec, key) as client:`.

    `spec.model` must be set for the OpenAI APIs (the runner resolves it first). `clock` stamps every event;
    inject a fake one in tests.
    """

    def __init__(
        self, spec: LoadSpec, api_key: str | None = None, *, clock: Clock = time.perf_counter_ns
    ) -> None:
        self.spec = spec
        self._api_key = api_key or None
        self._clock = clock
        self._url = spec.base_url + PATHS[spec.api]
        self._session: aiohttp.ClientSession | None = None

    @property
    def clock(self) -> Clock:
        return self._clock

    async def __aenter__(self) -> StreamClient:
        s = self.spec
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            # total = the per-request deadline; sock_read = the stall timeout (no byte for that long). The
            # connect limit sits below the deadline so a connect that never completes is called one.
            timeout=aiohttp.ClientTimeout(
                total=s.timeout_s, sock_connect=min(s.timeout_s / 2, 30.0), sock_read=s.stall_timeout_s
            ),
            headers=headers,
            read_bufsize=READ_BUFSIZE,
        )
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def body(self, prompt: Prompt) -> bytes:
        return json.dumps(
            build_payload(self.spec, self.spec.model or "", prompt.text, prompt.messages)
        ).encode()

    async def request(
        self, prompt: Prompt, index: int, scheduled_ns: int, *, warmup: bool = False
    ) -> RequestRecord:
        """Send one request and stream it to the end. Never raises for a failed request: the record says why.

        Cancelling the task that awaits this makes it return a `cancelled` record with whatever had
        arrived; the caller decides whether to stop.
        """
        if self._session is None:
            raise RuntimeError("StreamClient used outside `async with`")
        clock = self._clock
        body = self.body(prompt)
        dec = new_decoder(self.spec.api)
        status: int | None = None
        retried = False
        kind: ErrorKind | None = None
        message: str | None = None
        sent = clock()
        end: int | None = None
        try:
            while True:
                try:
                    async with self._session.post(self._url, data=body) as resp:
                        status = resp.status
                        if not 200 <= status < 300:
                            kind, message = ErrorKind.HTTP_STATUS, await _status_message(resp)
                            break
                        end = await self._stream(resp.content, dec)
                    break
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                    # A pooled keep-alive connection the server had closed (llama-server drops idle ones
                    # after 5 s) fails before any response byte: nothing was received, so resend once.
                    if status is None and not retried and not isinstance(e, aiohttp.ClientConnectorError):
                        retried = True
                        # One loop turn first, so the pool sees any other sockets the server closed.
                        await asyncio.sleep(0)
                        sent = clock()
                        continue
                    raise
        except asyncio.CancelledError:
            if not dec.done:
                kind, message = ErrorKind.CANCELLED, "cancelled while in flight"
        except Exception as e:  # translated into an error kind: a failed request is data, not an exception
            if not (status is not None and dec.finished and dec.error_kind is None):
                kind, message = _classify(e, status, retried)
        if kind is None:
            if dec.error_kind is not None:
                kind, message = dec.error_kind, dec.error_message
            elif not dec.finished:
                kind, message = ErrorKind.DISCONNECT, "the stream ended before [DONE] or a finish reason"
        if end is None:
            done_at = dec.last_event_ns if kind is None and dec.done else None
            end = done_at if done_at is not None else clock()
        return RequestRecord(
            index=index,
            prompt_id=prompt.id,
            scheduled_ns=scheduled_ns,
            sent_ns=sent,
            end_ns=end,
            first_token_ns=dec.first_ns,
            chunk_ns=tuple(dec.chunk_ns),
            chunk_tokens=tuple(dec.chunk_tokens),
            output_text=dec.output_text,
            prompt_tokens=dec.prompt_tokens,
            completion_tokens=dec.completion_tokens,
            finish_reason=dec.finish_reason,
            http_status=status,
            error_kind=kind,
            error_message=self._scrub(message) if message else None,
            extras=dec.extras,
            retried=retried,
            warmup=warmup,
        )

    async def _stream(self, content: aiohttp.StreamReader, dec: StreamDecoder) -> int | None:
        """The hot loop: read, stamp, decode. Returns the end marker's arrival time, or None at EOF."""
        clock = self._clock
        feed = dec.feed
        readany = content.readany
        while True:
            data = await readany()
            if not data:
                dec.close(clock())
                return None
            feed(data, clock())
            if dec.done:
                if not content.is_eof():
                    # Read the body's terminating chunk so the connection goes back to the pool.
                    with contextlib.suppress(asyncio.TimeoutError, aiohttp.ClientError):
                        await asyncio.wait_for(content.read(), _DRAIN_AFTER_DONE_S)
                return dec.last_event_ns
            if dec.error_kind is not None:
                return None

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text


def _classify(e: Exception, status: int | None, retried: bool) -> tuple[ErrorKind, str]:
    if isinstance(e, _CONNECT_TIMEOUT):
        return ErrorKind.CONNECT, f"connect timed out: {e}"
    if isinstance(e, aiohttp.ServerTimeoutError):
        return ErrorKind.STALL, f"no byte received within the stall timeout ({e})"
    if isinstance(e, asyncio.TimeoutError):
        return ErrorKind.TIMEOUT, "the per-request deadline passed"
    if isinstance(e, aiohttp.ClientConnectorError):
        return ErrorKind.CONNECT, str(e)
    if status is None and isinstance(e, aiohttp.ClientConnectionError):
        again = " (also after one retry on a fresh connection)" if retried else ""
        return ErrorKind.CONNECT, f"connection closed before any response byte{again}: {e!r}"
    if isinstance(e, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
        return ErrorKind.DISCONNECT, f"the stream broke off: {e!r}"
    if isinstance(e, aiohttp.ClientResponseError):
        return ErrorKind.PROTOCOL, f"bad HTTP response: {e.message}"
    if isinstance(e, aiohttp.ClientError):
        return ErrorKind.PROTOCOL, repr(e)
    raise e  # a bug in tokbench, not a server failure


async def _status_message(resp: aiohttp.ClientResponse) -> str:
    try:
        snippet = (await resp.content.read(2048)).decode("utf-8", "replace").strip()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        snippet = ""
    head = f"HTTP {resp.status} {resp.reason or ''}".rstrip()
    return f"{head}: {snippet[:500]}" if snippet else head


async def resolve_model(base_url: str, api_key: str | None = None) -> str:
    """The first model id from GET /v1/models; ConfigError naming --model if the server does not say."""
    url = base_url.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0), headers=headers) as s,
            s.get(url) as resp,
        ):
            if resp.status != 200:
                raise ConfigError(f"--model: GET {url} answered HTTP {resp.status}; pass --model NAME")
            data: Any = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        reason = "timed out" if isinstance(e, asyncio.TimeoutError) else type(e).__name__
        raise ConfigError(f"--model: could not list models at {url} ({reason}); pass --model NAME") from None
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ConfigError(f"--model: {url} lists no model ids; pass --model NAME") from None


async def fetch_text(base_url: str, path: str, timeout_s: float = 5.0) -> str | None:
    """GET base_url+path as text (e.g. /metrics); None when it fails in any way: scrapes are optional."""
    url = base_url.rstrip("/") + path
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s,
            s.get(url) as resp,
        ):
            if resp.status != 200:
                return None
            return await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
        return None
