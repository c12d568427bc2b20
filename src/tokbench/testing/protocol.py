"""Wire formats: request parsing and response/SSE payloads for the OpenAI APIs and SGLang's native /generate.

Pure functions of their inputs (no I/O), so the shapes are unit-testable. Personality extras (SGLang
`meta_info`, llama.cpp `timings`) are added by personalities.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["chat", "completions", "sglang"]

DONE = b"data: [DONE]\n\n"


class BadRequest(Exception):
    """The request body is not what the API accepts; becomes a 400 with this message."""


@dataclass(frozen=True)
class GenParams:
    """A generation request, whatever API it came through."""

    api: Api
    prompt: str
    stream: bool
    max_tokens: int
    ignore_eos: bool = False
    min_tokens: int = 0
    temperature: float = 0.0
    seed: int | None = None
    include_usage: bool = False
    continuous_usage: bool = False
    return_meta_info: bool = False
    model: str | None = None


def sse(obj: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _int(body: Mapping[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise BadRequest(f"{name} must be an integer >= {minimum}, got {v!r}")
    return v


def _float(body: Mapping[str, Any], name: str, default: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
        raise BadRequest(f"{name} must be a number >= 0, got {v!r}")
    return float(v)


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    if content is None:
        return ""
    raise BadRequest("messages[].content must be a string or a list of content parts")


def parse_openai(body: Any, api: Literal["chat", "completions"]) -> GenParams:
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object")
    if api == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list of {role, content} objects")
        parts = []
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m:
                raise BadRequest("each message must be an object with a role and content")
            parts.append(_message_text(m.get("content")))
        # The message contents joined by newlines: a one-message chat and a completion with the same text get
        # the same answer.
        prompt = "\n".join(parts)
        default_max = 4096
        max_tokens = _int(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens", default_max, 1)
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and raw and all(isinstance(p, str) for p in raw):
            raw = raw[0]
        elif isinstance(raw, list) and raw and all(isinstance(p, int) for p in raw):
            raw = " ".join(str(p) for p in raw)  # token ids
        if not isinstance(raw, str):
            raise BadRequest("prompt must be a string, a list of strings or a list of token ids")
        prompt = raw
        max_tokens = _int(body, "max_tokens", 16, 1)  # OpenAI's default for completions
    opts = body.get("stream_options") or {}
    if not isinstance(opts, Mapping):
        raise BadRequest("stream_options must be an object")
    model = body.get("model")
    assert max_tokens is not None
    return GenParams(
        api=api,
        prompt=prompt,
        stream=bool(body.get("stream", False)),
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        min_tokens=_int(body, "min_tokens", 0, 0) or 0,
        temperature=_float(body, "temperature", 1.0),  # OpenAI's default: not deterministic
        seed=_int(body, "seed", None, -(2**63)),
        include_usage=bool(opts.get("include_usage", False)),
        continuous_usage=bool(opts.get("continuous_usage_stats", False)),
        return_meta_info=bool(body.get("return_meta_info", False)),
        model=model if isinstance(model, str) else None,
    )


def parse_sglang(body: Any) -> GenParams:
    """SGLang's native `/generate`: {"text": ..., "sampling_params": {...}, "stream": bool}."""
    if not isinstance(body, Mapping):
        raise BadRequest("the request body must be a JSON object")
    text = body.get("text")
    if isinstance(text, list) and text and isinstance(text[0], str):
        text = text[0]
    if text is None and isinstance(body.get("input_ids"), list):
        text = " ".join(str(i) for i in body["input_ids"])
    if not isinstance(text, str):
        raise BadRequest("text must be a string (or give input_ids)")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, Mapping):
        raise BadRequest("sampling_params must be an object")
    max_new = _int(sp, "max_new_tokens", 128, 1)  # SGLang's default
    assert max_new is not None
    return GenParams(
        api="sglang",
        prompt=text,
        stream=bool(body.get("stream", False)),
        max_tokens=max_new,
        ignore_eos=bool(sp.get("ignore_eos", False)),
        min_tokens=_int(sp, "min_new_tokens", 0, 0) or 0,
        temperature=_float(sp, "temperature", 1.0),
        seed=_int(sp, "sampling_seed", None, -(2**63)),
        return_meta_info=True,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Head:
    """The fields every payload of one response shares."""

    id: str
    created: int
    model: str


def role_chunk(h: Head) -> dict[str, Any]:
    """The chat stream's first event: the assistant role with empty content (OpenAI and vLLM send it)."""
    return {
        "id": h.id,
        "object": "chat.completion.chunk",
        "created": h.created,
        "model": h.model,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }


def content_chunk(api: Api, h: Head, text: str) -> dict[str, Any]:
    if api == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": None,
        }
        return {"id": h.id, "object": "chat.completion.chunk", "created": h.created, "model": h.model,
                "choices": [choice]}  # fmt: skip
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    return {
        "id": h.id,
        "object": "text_completion",
        "created": h.created,
        "model": h.model,
        "choices": [choice],
    }


def finish_chunk(api: Api, h: Head, finish_reason: str) -> dict[str, Any]:
    if api == "chat":
        choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": [choice]}


def usage_chunk(api: Api, h: Head, use: Mapping[str, int]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if api == "chat" else "text_completion"
    return {
        "id": h.id,
        "object": obj,
        "created": h.created,
        "model": h.model,
        "choices": [],
        "usage": dict(use),
    }


def unary_body(api: Api, h: Head, text: str, finish_reason: str, use: Mapping[str, int]) -> dict[str, Any]:
    if api == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": [choice],
            "usage": dict(use)}  # fmt: skip


def error_body(message: str, code: int, type_: str) -> dict[str, Any]:
    """OpenAI-style error object, the shape vLLM, SGLang and llama.cpp all answer with."""
    return {"error": {"message": message, "type": type_, "code": code}}


def models_body(model: str, created: int, owned_by: str = "tokbench") -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": owned_by}],
    }
