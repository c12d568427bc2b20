"""A reference OpenAI-compatible streaming server: configurable timing, noise, faults, engine personalities
and speculative decoding, and a timeline of every byte it sent. The ground truth for tokbench's tests.

In-process: `async with ReferenceServer(ServerConfig(...)) as srv: srv.base_url, srv.timeline`.
Subprocess: `python -m tokbench.testing --port 0 ...` prints `listening on http://127.0.0.1:PORT` first.
"""

from tokbench.testing.faults import Fault
from tokbench.testing.server import DIE_EXIT_CODE, ReferenceServer
from tokbench.testing.settings import (
    FAULT_KINDS,
    PERSONALITIES,
    ServerConfig,
    parse_accept,
    parse_fault_rates,
)
from tokbench.testing.text import answer_text, natural_length, prompt_key, token_text
from tokbench.testing.timeline import RequestTrace, read_jsonl, write_jsonl

__all__ = [
    "DIE_EXIT_CODE",
    "FAULT_KINDS",
    "PERSONALITIES",
    "Fault",
    "ReferenceServer",
    "RequestTrace",
    "ServerConfig",
    "answer_text",
    "natural_length",
    "parse_accept",
    "parse_fault_rates",
    "prompt_key",
    "read_jsonl",
    "token_text",
    "write_jsonl",
]
