"""Request bodies and the incremental SSE decoder, with events split at every byte."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokbench.config import load_spec
from tokbench.loadgen.protocol import SglangDecoder, StreamDecoder, build_payload, merge_body, new_decoder
from tokbench.records import ErrorKind


def ev(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def chat(text: str | None = None, finish: str | None = None, **top: Any) -> dict[str, Any]:
    delta = {"content": text} if text is not None else {}
    return {"id": "x", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **top}  # fmt: skip


def usage_only(ct: int, pt: int = 7) -> dict[str, Any]:
    return {"id": "x", "choices": [], "usage": {"prompt_tokens": pt, "completion_tokens": ct}}


DONE = b"data: [DONE]\n\n"
STREAM = (
    b": keep-alive comment\n\n"
    + ev(chat(""))  # role chunk, no content
    + ev(chat("Hel"))
    + ev(chat("lo ✓"))  # multi-byte character, so splits can land inside it
    + ev(chat(" world"))
    + ev(chat(None, "length", timings={"predicted_n": 3, "draft_n": 0}))
    + ev(usage_only(3))
    + DONE
)


def decode(parts: list[bytes], dec: StreamDecoder | None = None) -> StreamDecoder:
    d = dec or StreamDecoder()
    for i, p in enumerate(parts):
        d.feed(p, 100 + i)
    d.close(999)
    return d


def assert_full(d: StreamDecoder) -> None:
    assert d.error_kind is None, d.error_message
    assert d.done and d.finished
    assert d.output_text == "Hello ✓ world"
    assert d.chunk_tokens == [1, 1, 1]
    assert d.completion_tokens == 3 and d.prompt_tokens == 7
    assert d.finish_reason == "length"
    assert d.extras["timings"] == {"predicted_n": 3, "draft_n": 0}
    assert d.extras["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_events_split_at_every_byte_position(newline: bytes) -> None:
    stream = STREAM.replace(b"\n", newline)
    for cut in range(len(stream) + 1):
        assert_full(decode([stream[:cut], stream[cut:]]))


def test_byte_at_a_time_and_arrival_times() -> None:
    d = decode([STREAM[i : i + 1] for i in range(len(STREAM))])
    assert_full(d)
    # Each chunk is stamped with the read that completed it: the byte ending its blank line.
    ends = [STREAM.index(ev(chat(t))) + len(ev(chat(t))) - 1 for t in ("Hel", "lo ✓", " world")]
    assert d.chunk_ns == [100 + e for e in ends]
    assert d.first_ns == d.chunk_ns[0]


def test_one_read_stamps_all_its_events_alike() -> None:
    d = decode([STREAM])
    assert d.chunk_ns == [100, 100, 100]


def test_multiline_data_is_joined_with_newlines() -> None:
    body = json.dumps(chat("multi"), indent=1).split("\n")
    stream = b"".join(b"data: " + line.encode() + b"\n" for line in body) + b"\n" + DONE
    d = decode([stream])
    assert d.output_text == "multi" and d.done and d.error_kind is None


def test_data_without_space_and_other_fields() -> None:
    stream = b"event: message\nid: 7\nretry: 100\ndata:" + json.dumps(chat("a")).encode() + b"\n\n" + DONE
    d = decode([stream])
    assert d.output_text == "a" and d.chunk_tokens == [1]


def test_done_stops_decoding() -> None:
    d = decode([ev(chat("a")) + DONE + ev(chat("after")) + b"garbage\n\n"])
    assert d.done and d.output_text == "a" and d.error_kind is None


def test_usage_only_chunk_is_not_a_token_chunk() -> None:
    d = decode([ev(chat("a")) + ev(chat(None, "stop")) + ev(usage_only(42)) + DONE])
    assert d.chunk_tokens == [1]
    assert d.completion_tokens == 42  # the server's count wins over counting chunks


def test_continuous_usage_gives_tokens_per_chunk() -> None:
    # vLLM continuous_usage_stats: cumulative completion_tokens on every chunk (a speculative one carries 3).
    parts = [chat("", usage={"completion_tokens": 0})]
    parts += [chat("a", usage={"completion_tokens": 1}), chat("bcd", usage={"completion_tokens": 4})]
    parts += [chat(None, "length", usage={"completion_tokens": 5})]  # a token that detokenized to nothing
    d = decode([b"".join(ev(p) for p in parts) + ev(usage_only(5)) + DONE])
    assert d.chunk_tokens == [1, 3, 1]
    assert sum(d.chunk_tokens) == d.completion_tokens == 5


def test_final_usage_on_the_finish_chunk_is_not_a_chunk() -> None:
    # llama.cpp puts usage (and timings) on the finish chunk; without continuous usage that is the total.
    d = decode(
        [ev(chat("a")) + ev(chat("b")) + ev(chat(None, "length", usage={"completion_tokens": 2})) + DONE]
    )
    assert d.chunk_tokens == [1, 1] and d.completion_tokens == 2


def test_reasoning_tokens_count_but_stay_out_of_the_text() -> None:
    r = {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": None}]}
    d = decode([ev(r) + ev(chat("answer")) + DONE])
    assert d.chunk_tokens == [1, 1] and d.output_text == "answer"


def test_completions_text_field() -> None:
    c = {"choices": [{"index": 0, "text": "xy", "finish_reason": None}]}
    d = decode([ev(c) + ev({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}) + DONE])
    assert d.output_text == "xy" and d.finish_reason == "length"


@pytest.mark.parametrize(
    "obj, needle",
    [
        (
            {"error": {"message": "out of memory", "type": "InternalServerError", "code": 500}},
            "out of memory",
        ),
        ({"object": "error", "message": "bad things", "code": 400}, "bad things"),
    ],
)
def test_error_event(obj: dict[str, Any], needle: str) -> None:
    d = decode([ev(chat("a")) + ev(obj) + DONE])
    assert d.error_kind is ErrorKind.SERVER_ERROR_EVENT
    assert needle in (d.error_message or "")


@pytest.mark.parametrize(
    "stream",
    [
        b"data: {not json}\n\n",
        b"data: [1, 2]\n\n",
        b'{"choices": []}\n\n',  # a JSON body where an event stream was expected
        b"<html>502 Bad Gateway</html>\n\n",
    ],
)
def test_malformed_stream_is_a_protocol_error(stream: bytes) -> None:
    d = decode([ev(chat("a")) + stream + DONE])
    assert d.error_kind is ErrorKind.PROTOCOL
    assert d.output_text == "a"  # what arrived before the bad event is kept


def test_invalid_utf8_is_a_protocol_error() -> None:
    d = decode([b'data: {"choices": [{"delta": {"content": "\xff"}}]}\n\n'])
    assert d.error_kind is ErrorKind.PROTOCOL


def test_stream_cut_mid_event_is_unfinished() -> None:
    whole = ev(chat("a")) + ev(chat("b"))
    d = decode([whole[:-5]])
    assert not d.finished and d.error_kind is None and d.output_text == "a"


def test_last_event_without_blank_line_is_accepted_at_close() -> None:
    d = decode([ev(chat("a")) + ev(chat(None, "stop")) + b"data: [DONE]\n"])
    assert d.done and d.error_kind is None


def test_finish_without_done_is_finished() -> None:
    d = decode([ev(chat("a")) + ev(chat(None, "stop"))])
    assert d.finished and not d.done


# ---- SGLang native ---------------------------------------------------------------------------------------


def sgl(text: str, ct: int, finish: Any = None, **meta: Any) -> dict[str, Any]:
    info = {"id": "r1", "prompt_tokens": 9, "completion_tokens": ct, "finish_reason": finish, **meta}
    return {"text": text, "meta_info": info, "index": 0}


def test_sglang_cumulative_text_and_token_counts() -> None:
    events = [sgl("He", 1), sgl("Hello", 3), sgl("Hello", 3), sgl("Hello wor", 5)]
    events.append(sgl("Hello world", 6, {"type": "length", "length": 6}, spec_verify_ct=3))
    stream = b"".join(ev(e) for e in events) + DONE
    for cut in range(0, len(stream) + 1, 7):
        d = decode([stream[:cut], stream[cut:]], SglangDecoder())
        assert d.error_kind is None and d.done
        assert d.chunk_tokens == [1, 2, 2, 1]  # the repeated event carried nothing and is no chunk
        assert d.output_text == "Hello world"
        assert d.completion_tokens == 6 and d.prompt_tokens == 9
        assert d.finish_reason == "length"
        assert d.extras["meta_info"]["spec_verify_ct"] == 3


def test_sglang_error_and_bad_event() -> None:
    d = decode([ev(sgl("a", 1)) + ev({"error": {"message": "boom"}})], SglangDecoder())
    assert d.error_kind is ErrorKind.SERVER_ERROR_EVENT and "boom" in (d.error_message or "")
    d = decode([ev({"choices": []})], SglangDecoder())
    assert d.error_kind is ErrorKind.PROTOCOL


def test_new_decoder_by_api() -> None:
    assert type(new_decoder("sglang")) is SglangDecoder
    assert type(new_decoder("chat")) is StreamDecoder


# ---- payloads --------------------------------------------------------------------------------------------


def test_chat_payload_defaults() -> None:
    spec = load_spec(base_url="http://h")
    body = build_payload(spec, "m", "hi")
    assert body == {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000, "temperature": 0.0,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip


def test_chat_payload_options_and_messages() -> None:
    spec = load_spec(base_url="http://h", max_tokens=64, ignore_eos=False, min_tokens=8, temperature=0.7,
                     top_p=0.9, request_seed=5)  # fmt: skip
    msgs = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    body = build_payload(spec, "m", "s\nu", msgs)
    assert body["messages"] == list(msgs)
    assert "ignore_eos" not in body
    assert (body["min_tokens"], body["temperature"], body["top_p"], body["seed"]) == (8, 0.7, 0.9, 5)


def test_completions_payload() -> None:
    body = build_payload(load_spec(base_url="http://h", api="completions"), "m", "hi")
    assert body["prompt"] == "hi" and "messages" not in body
    assert body["stream_options"] == {"include_usage": True}


def test_sglang_payload() -> None:
    spec = load_spec(
        base_url="http://h", api="sglang", max_tokens=32, min_tokens=4, top_p=0.5, request_seed=1
    )
    body = build_payload(spec, "", "hi")
    assert body == {
        "text": "hi", "stream": True,
        "sampling_params": {"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True, "min_new_tokens": 4,
                            "top_p": 0.5, "sampling_seed": 1},
    }  # fmt: skip


def test_extra_body_merges_last_and_deep() -> None:
    spec = load_spec(
        base_url="http://h",
        extra_body={"stream_options": {"continuous_usage_stats": True}, "max_tokens": 5, "top_k": 20},
    )
    body = build_payload(spec, "m", "hi")
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 5 and body["top_k"] == 20
    assert merge_body({"a": {"b": 1}}, {"a": 2}) == {"a": 2}


def test_sglang_openai_meta_info_inside_the_choice_is_kept() -> None:
    # SGLang OpenAI endpoints with return_meta_info put meta_info in choices[0]; newer ones add sglext.
    final = chat(None, "length", sglext={"spec_verify_ct": 2})
    final["choices"][0]["meta_info"] = {"spec_verify_ct": 2, "completion_tokens": 3}
    d = decode([ev(chat("a")), ev(chat("b")), ev(final), DONE])
    assert d.extras["meta_info"] == {"spec_verify_ct": 2, "completion_tokens": 3}
    assert d.extras["sglext"] == {"spec_verify_ct": 2}
