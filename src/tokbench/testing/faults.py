"""Seeded fault injection: which request gets which fault, and where in its stream the fault strikes.

Each generation request draws once from the server's fault generator in arrival order, so a seed fixes the
fault sequence. A request gets at most one fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import numpy as np


class Fault(str, Enum):
    HTTP_500 = "http_500"  # 500 with an OpenAI-style error body, before any byte of the stream
    HTTP_429 = "http_429"  # 429 with Retry-After, before any byte of the stream
    DISCONNECT = "disconnect"  # the connection is closed mid-stream (no finish chunk, no [DONE])
    STALL = "stall"  # the stream stops sending mid-stream for ServerConfig.stall_s, then resumes
    MALFORMED = "malformed"  # one `data:` line mid-stream is not valid JSON; the stream then goes on
    ERROR_EVENT = "error_event"  # a `data: {"error": {...}}` event mid-stream, then `data: [DONE]`

    @property
    def mid_stream(self) -> bool:
        return self not in (Fault.HTTP_500, Fault.HTTP_429)


class FaultPlan:
    """Draws each request's fault (or None) from seeded per-kind rates."""

    def __init__(self, rates: Mapping[str, float], rng: np.random.Generator) -> None:
        self._kinds = [(Fault(k), r) for k, r in sorted(rates.items()) if r > 0]
        self._rng = rng

    def draw(self) -> Fault | None:
        if not self._kinds:
            return None
        u = float(self._rng.random())
        edge = 0.0
        for kind, rate in self._kinds:
            edge += rate
            if u < edge:
                return kind
        return None


def strike_after(target_tokens: int) -> int:
    """A mid-stream fault strikes once this many tokens were sent: half-way, and after at least one token so
    the client has seen the stream start."""
    return max(1, target_tokens // 2)
