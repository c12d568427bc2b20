"""Sans-IO wire protocol: request bodies for the three APIs, and an incremental SSE decoder (bytes in;
per-chunk timestamps, token counts, usage and engine extras out). No sockets, so every byte split is testable.

The decoder is the client's hot loop: one `str.split` per read, one `json.loads` per event, and only list
appends per content chunk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from tokbench.config import Api, LoadSpec
from tokbench.records import ErrorKind

PATHS: Final[Mapping[str, str]] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "sglang": "/generate",
}
# Response keys kept raw in RequestRecord.extras: llama.cpp `timings`, SGLang `meta_info`, vLLM per-request
# `metrics`, and the last `usage` seen.
EXTRA_KEYS: Final = ("timings", "meta_info", "metrics", "usage", "sglext")
_DONE: Final = "[DONE]"
_SSE_FIELDS: Final = frozenset(("event", "id", "retry"))
_loads = json.loads


def build_payload(
    spec: LoadSpec, model: str, text: str, messages: tuple[dict[str, str], ...] | None = None
) -> dict[str, Any]:
    """The JSON body for one streamed request. `spec.extra_body` is merged last (nested objects merge key by
    key, so `{"stream_options": {"continuous_usage_stats": true}}` keeps include_usage)."""
    body: dict[str, Any]
    if spec.api == "sglang":
        sp: dict[str, Any] = {"max_new_tokens": spec.max_tokens, "temperature": spec.temperature}
        if spec.ignore_eos:
            sp["ignore_eos"] = True
        if spec.min_tokens is not None:
            sp["min_new_tokens"] = spec.min_tokens
        if spec.top_p is not None:
            sp["top_p"] = spec.top_p
        if spec.request_seed is not None:
            sp["sampling_seed"] = spec.request_seed
        body = {"text": text, "sampling_params": sp, "stream": True}
    else:
        body = {"model": model}
        if spec.api == "chat":
            body["messages"] = list(messages) if messages else [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        body |= {
            "max_tokens": spec.max_tokens,
            "temperature": spec.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        # Engine extensions (vLLM, SGLang, llama.cpp) only when asked: strict OpenAI servers reject them.
        if spec.ignore_eos:
            body["ignore_eos"] = True
        if spec.min_tokens is not None:
            body["min_tokens"] = spec.min_tokens
        if spec.top_p is not None:
            body["top_p"] = spec.top_p
        if spec.request_seed is not None:
            body["seed"] = spec.request_seed
    return merge_body(body, spec.extra_body)


def merge_body(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge_body(out[k], v)
        else:
            out[k] = v
    return out


class StreamDecoder:
    """Decodes one OpenAI-style SSE response (chat or completions) incrementally.

    Feed each read with its arrival time; afterwards the public attributes hold the request's data. A content
    chunk carries 1 token unless the server says otherwise: once a content chunk carries `usage` (vLLM's
    continuous usage stats), chunk tokens are the differences of its cumulative `completion_tokens`.
    """

    __slots__ = (
        "_buf",
        "_continuous",
        "_last_ct",
        "_pending_cr",
        "chunk_ns",
        "chunk_tokens",
        "done",
        "error_kind",
        "error_message",
        "extras",
        "finish_reason",
        "first_ns",
        "last_event_ns",
        "texts",
        "usage",
    )

    def __init__(self) -> None:
        self._buf = b""
        self._pending_cr = False
        self._continuous = False
        self._last_ct = 0
        self.chunk_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.texts: list[str] = []
        self.first_ns: int | None = None
        self.last_event_ns: int | None = None
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.extras: dict[str, Any] = {}
        self.done = False  # the end marker ([DONE]) arrived
        self.error_kind: ErrorKind | None = None
        self.error_message: str | None = None

    # -- framing ---------------------------------------------------------------------------------------------

    def feed(self, data: bytes, now_ns: int) -> None:
        """Consume one read. Events completed by it are decoded with `now_ns` as their arrival time."""
        if self.done or self.error_kind is not None:
            return
        if self._pending_cr:
            data = b"\r" + data
            self._pending_cr = False
        if b"\r" in data:
            # A CR at the end may be half of a CRLF split across reads: hold it back.
            if data.endswith(b"\r"):
                data = data[:-1]
                self._pending_cr = True
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if self._buf:
            data = self._buf + data
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._buf = data
            return
        self._buf = data[cut + 2 :]
        try:
            # Decoding whole events at once keeps split UTF-8 characters intact; json.loads then takes str.
            blocks = data[:cut].decode("utf-8").split("\n\n")
        except UnicodeDecodeError as e:
            self._fail(ErrorKind.PROTOCOL, f"stream is not UTF-8: {e.reason} at byte {e.start}")
            return
        self.last_event_ns = now_ns
        loads = _loads
        event = self._event
        for block in blocks:
            if block.startswith("data: ") and "\n" not in block:
                payload = block[6:]
            else:
                slow = self._slow_block(block)
                if slow is None:
                    if self.error_kind is not None:
                        return
                    continue
                payload = slow
            if payload == _DONE:
                self.done = True
                return
            try:
                obj = loads(payload)
            except ValueError as e:
                self._fail(ErrorKind.PROTOCOL, f"event data is not JSON ({e}): {payload[:200]!r}")
                return
            if type(obj) is not dict:
                self._fail(ErrorKind.PROTOCOL, f"event data is not a JSON object: {payload[:200]!r}")
                return
            event(obj, now_ns)
            if self.error_kind is not None:
                return

    def _slow_block(self, block: str) -> str | None:
        """An event with several lines, comments or other fields; returns its data (lines joined by \\n)."""
        data: list[str] = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, colon, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name not in _SSE_FIELDS or not colon:
                self._fail(ErrorKind.PROTOCOL, f"not a server-sent event line: {line[:200]!r}")
                return None
        return "\n".join(data) if data else None

    def close(self, now_ns: int) -> None:
        """End of the response body: leftover bytes must be empty or a final event without its blank line."""
        if self.error_kind is not None or self.done:
            return
        rest = self._buf
        self._buf = b""
        if self._pending_cr:
            rest += b"\n"
            self._pending_cr = False
        # Some servers end the last event with a single newline and close; accept that complete line. Bytes
        # without a line end are an event cut short: left out, so the caller sees an unfinished stream.
        if rest.strip() and rest.endswith(b"\n"):
            self.feed(rest.rstrip(b"\n") + b"\n\n", now_ns)

    def _fail(self, kind: ErrorKind, message: str) -> None:
        if self.error_kind is None:
            self.error_kind = kind
            self.error_message = message

    # -- events ----------------------------------------------------------------------------------------------

    def _event(self, obj: dict[str, Any], now_ns: int) -> None:
        choices = obj.get("choices")
        if choices:
            c = choices[0]
            delta = c.get("delta")
            if delta is not None:
                text = delta.get("content")
                # Reasoning models stream thinking in a separate field; those tokens are output tokens too.
                counted = text or delta.get("reasoning_content") or delta.get("reasoning")
            else:
                text = counted = c.get("text")
            fr = c.get("finish_reason")
            usage = obj.get("usage")
            if counted and usage is None:
                # The common case, inlined: one token, two int appends.
                if self.first_ns is None:
                    self.first_ns = now_ns
                self.chunk_ns.append(now_ns)
                self.chunk_tokens.append(1)
                if text:
                    self.texts.append(text)
            elif counted and usage is not None:
                self._continuous = True
                self._chunk(now_ns, self._usage_step(usage), text)
            elif usage is not None:
                self._usage_only(usage, now_ns)
            if fr is not None:
                self.finish_reason = fr
                self._keep_extras(obj)
                # SGLang's OpenAI endpoints with return_meta_info put meta_info inside the choice.
                self._keep_extras(c)
            return
        err = obj.get("error")
        if err is not None or obj.get("object") == "error":
            self._fail(ErrorKind.SERVER_ERROR_EVENT, _error_text(err if err is not None else obj))
            return
        usage = obj.get("usage")
        if usage is not None:
            self._usage_only(usage, now_ns)
        self._keep_extras(obj)

    def _chunk(self, now_ns: int, tokens: int, text: str | None) -> None:
        if self.first_ns is None:
            self.first_ns = now_ns
        self.chunk_ns.append(now_ns)
        self.chunk_tokens.append(tokens)
        if text:
            self.texts.append(text)

    def _usage_step(self, usage: Mapping[str, Any]) -> int:
        self.usage = usage
        ct = usage.get("completion_tokens")
        if not isinstance(ct, int):
            return 1
        step = ct - self._last_ct
        self._last_ct = ct
        return max(step, 0)

    def _usage_only(self, usage: Mapping[str, Any], now_ns: int) -> None:
        if self._continuous:
            # Tokens that detokenized to nothing still arrived now.
            step = self._usage_step(usage)
            if step > 0:
                self._chunk(now_ns, step, None)
        else:
            self.usage = usage  # the final usage report, not a chunk

    def _keep_extras(self, obj: Mapping[str, Any]) -> None:
        for k in EXTRA_KEYS:
            v = obj.get(k)
            if v is not None:
                self.extras[k] = v

    # -- results ---------------------------------------------------------------------------------------------

    @property
    def output_text(self) -> str:
        return "".join(self.texts)

    @property
    def finished(self) -> bool:
        """The response is complete: the end marker or a finish reason arrived (a close after it is fine)."""
        return self.done or self.finish_reason is not None

    @property
    def completion_tokens(self) -> int | None:
        ct = self.usage.get("completion_tokens") if self.usage else None
        return ct if isinstance(ct, int) else None

    @property
    def prompt_tokens(self) -> int | None:
        pt = self.usage.get("prompt_tokens") if self.usage else None
        return pt if isinstance(pt, int) else None


class SglangDecoder(StreamDecoder):
    """SGLang native `/generate`: each event holds the cumulative `text` and `meta_info.completion_tokens`,
    so a chunk's text and tokens are differences from the previous event. `meta_info` is kept raw."""

    __slots__ = ("_text",)

    def __init__(self) -> None:
        super().__init__()
        self._text = ""

    def _event(self, obj: dict[str, Any], now_ns: int) -> None:
        err = obj.get("error")
        if err is not None:
            self._fail(ErrorKind.SERVER_ERROR_EVENT, _error_text(err))
            return
        meta = obj.get("meta_info")
        text = obj.get("text")
        if not isinstance(meta, dict) or not isinstance(text, str):
            self._fail(ErrorKind.PROTOCOL, f"SGLang event without 'text' and 'meta_info': {str(obj)[:200]!r}")
            return
        ct = meta.get("completion_tokens")
        step = ct - self._last_ct if isinstance(ct, int) else (1 if len(text) > len(self._text) else 0)
        if isinstance(ct, int):
            self._last_ct = ct
        if step > 0 or len(text) > len(self._text):
            if self.first_ns is None:
                self.first_ns = now_ns
            self.chunk_ns.append(now_ns)
            self.chunk_tokens.append(max(step, 0))
        self._text = text
        self.extras["meta_info"] = meta
        fr = meta.get("finish_reason")
        if fr is not None:
            self.finish_reason = fr.get("type", str(fr)) if isinstance(fr, dict) else str(fr)

    @property
    def output_text(self) -> str:
        return self._text

    @property
    def completion_tokens(self) -> int | None:
        ct = self.extras.get("meta_info", {}).get("completion_tokens")
        return ct if isinstance(ct, int) else None

    @property
    def prompt_tokens(self) -> int | None:
        pt = self.extras.get("meta_info", {}).get("prompt_tokens")
        return pt if isinstance(pt, int) else None


def new_decoder(api: Api) -> StreamDecoder:
    return SglangDecoder() if api == "sglang" else StreamDecoder()


def _error_text(err: Any) -> str:
    if isinstance(err, Mapping):
        msg = err.get("message") or err.get("msg") or err.get("detail")
        code = err.get("code") or err.get("type")
        if msg:
            return f"{msg} ({code})" if code else str(msg)
    return str(err)[:300]
