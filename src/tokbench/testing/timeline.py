"""The server's ground truth: one RequestTrace per request, filled in as the request is served.

Times are `perf_counter_ns` (the clock the client uses in-process). A chunk is recorded right before its bytes
are written to the socket, with the number of tokens it carries (0-token events such as the chat role chunk,
the finish chunk and the usage chunk are not chunks here).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RequestTrace:
    id: str  # the response's `id` (chatcmpl-N / cmpl-N / the SGLang rid)
    seq: int  # arrival order, from 0
    path: str
    api: str  # chat | completions | sglang | llamacpp
    accepted_ns: int  # the handler started
    prompt: str = ""
    prompt_tokens: int = 0
    max_tokens: int | None = None
    stream: bool = False
    ignore_eos: bool = False
    target_tokens: int = 0  # what the engine was asked to generate (max_tokens, or the natural stop)
    fault: str | None = None
    fault_ns: int | None = None  # when the fault struck
    status: int = 200
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    first_token_ns: int | None = None
    end_ns: int | None = None  # the last byte was handed to the socket (or the request was abandoned)
    completion_tokens: int = 0  # tokens actually sent to the client
    finish_reason: str | None = None  # set only when the response finished normally
    client_gone: bool = False  # the client closed the connection before the end
    spec_verify_ct: int = 0  # speculative decode steps this request took part in
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_histogram: list[int] = field(default_factory=list)  # [i]: verify steps that accepted i drafts
    # The text sent, kept as pieces: appending to one string would copy it per chunk (quadratic in length).
    text_parts: list[str] = field(default_factory=list, repr=False)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def ok(self) -> bool:
        return self.finish_reason is not None and self.fault is None and not self.client_gone

    def add_chunk(self, ns: int, tokens: int, text: str) -> None:
        if self.first_token_ns is None:
            self.first_token_ns = ns
        self.chunk_ns.append(ns)
        self.chunk_tokens.append(tokens)
        self.completion_tokens += tokens
        self.text_parts.append(text)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: every field, with the text as one string under "text"."""
        d = asdict(self)
        d["text"] = "".join(d.pop("text_parts"))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestTrace:
        d = dict(d)
        text = d.pop("text", "")
        return cls(**d, text_parts=[text] if text else [])


def write_jsonl(traces: Iterable[RequestTrace], path: str | Path) -> None:
    """One JSON object per request, in arrival order; written to a temporary name then renamed."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for t in traces:
            f.write(json.dumps(t.to_dict(), separators=(",", ":")) + "\n")
    tmp.replace(path)


def read_jsonl(path: str | Path) -> list[RequestTrace]:
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(RequestTrace.from_dict(json.loads(line)))
    return out
