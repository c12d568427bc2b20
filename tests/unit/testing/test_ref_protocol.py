"""Request parsing and payload shapes of the OpenAI APIs and SGLang's /generate."""

from __future__ import annotations

import json

import pytest

from tokbench.testing import protocol as proto


def test_chat_prompt_is_the_joined_contents_and_max_completion_tokens_wins() -> None:
    p = proto.parse_openai(
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            ],
            "max_tokens": 5,
            "max_completion_tokens": 9,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0,
        },
        "chat",
    )
    assert p.prompt == "be brief\nhi" and p.max_tokens == 9 and p.stream and p.include_usage and p.ignore_eos
    assert p.temperature == 0.0


def test_completions_accept_string_lists_and_token_ids() -> None:
    assert proto.parse_openai({"prompt": ["a b"]}, "completions").prompt == "a b"
    assert proto.parse_openai({"prompt": [1, 2]}, "completions").prompt == "1 2"
    assert proto.parse_openai({"prompt": "x"}, "completions").max_tokens == 16  # OpenAI's default


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ],
)
def test_bad_bodies_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(proto.BadRequest, match=field):
        proto.parse_openai(body, "chat")


def test_sglang_generate_defaults() -> None:
    p = proto.parse_sglang({"text": "hello", "sampling_params": {"ignore_eos": True}, "stream": True})
    assert p.api == "sglang" and p.max_tokens == 128 and p.ignore_eos and p.stream and p.return_meta_info
    with pytest.raises(proto.BadRequest, match="text"):
        proto.parse_sglang({"sampling_params": {}})


def test_sse_framing_and_usage_chunk() -> None:
    h = proto.Head("cmpl-1", 0, "m")
    raw = proto.sse(proto.usage_chunk("completions", h, proto.usage(3, 4)))
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    obj = json.loads(raw[6:])
    assert obj["choices"] == [] and obj["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }
