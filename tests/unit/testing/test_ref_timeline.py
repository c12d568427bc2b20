"""The timeline's JSONL form round-trips."""

from __future__ import annotations

from pathlib import Path

from tokbench.testing import RequestTrace, read_jsonl, write_jsonl


def test_jsonl_round_trip(tmp_path: Path) -> None:
    t = RequestTrace(id="chatcmpl-0", seq=0, path="/v1/chat/completions", api="chat", accepted_ns=10)
    t.add_chunk(20, 1, " a")
    t.add_chunk(30, 2, " b c")
    t.end_ns, t.finish_reason = 31, "length"
    write_jsonl([t], tmp_path / "t.jsonl")
    (back,) = read_jsonl(tmp_path / "t.jsonl")
    assert back.to_dict() == t.to_dict() and back.text == " a b c"
    assert back.first_token_ns == 20 and back.completion_tokens == 3 and back.ok
