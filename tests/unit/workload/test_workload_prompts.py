"""Prompt sources: the built-in corpus, seeded draws (distinct per cell, or the same sequence), and the
JSONL / ShareGPT loaders with errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokbench.config import LoadSpec, load_spec
from tokbench.errors import ConfigError
from tokbench.workload import Prompt, builtin_corpus, load_prompts, read_prompt_file


def spec(**kw: object) -> LoadSpec:
    return load_spec(base_url="http://h", **kw)


def plan_draws(s: LoadSpec) -> dict[tuple[int, int], list[Prompt]]:
    src = load_prompts(s)
    cells = {(0, 0): src.draw(0, 0, s.warmup)}
    for t in range(s.trials):
        for c in s.concurrencies:
            cells[(c, t)] = src.draw(c, t, s.requests_for(c))
    return cells


def test_builtin_corpus_is_varied_and_unique() -> None:
    corpus = builtin_corpus()
    assert len(corpus) >= 300
    assert len({p.id for p in corpus}) == len({p.text for p in corpus}) == len(corpus)
    openings = {p.text.split()[0] for p in corpus}
    assert len(openings) >= 10  # not one template: prefixes differ early


def test_draws_are_deterministic_by_seed() -> None:
    a = plan_draws(spec(trials=2))
    assert a == plan_draws(spec(trials=2))
    b = plan_draws(spec(trials=2, seed=1))
    assert [p.id for p in a[(4, 0)]] != [p.id for p in b[(4, 0)]]


def test_every_cell_gets_distinct_prompts_even_beyond_the_corpus() -> None:
    s = spec(concurrencies=(1, 4, 16, 32), trials=5)  # 5 * 108 + 2 prompts > 400 in the corpus
    cells = plan_draws(s)
    texts = [p.text for ps in cells.values() for p in ps]
    assert len(texts) > len(builtin_corpus())
    assert len(set(texts)) == len(texts)
    # Once the corpus is used up, prompts come back with a distinct opening, so no prefix is shared.
    recycled = [p for ps in cells.values() for p in ps if "~" in p.id]
    assert recycled and all(p.text.startswith("(Variant 1.) ") for p in recycled)


def test_draws_do_not_depend_on_execution_order() -> None:
    s = spec(concurrencies=(1, 4), trials=2)
    src1, src2 = load_prompts(s), load_prompts(s)
    forward = [src1.draw(c, t, s.requests_for(c)) for c, t in [(1, 0), (4, 0), (1, 1), (4, 1)]]
    backward = [src2.draw(c, t, s.requests_for(c)) for c, t in [(4, 1), (1, 1), (4, 0), (1, 0)]]
    assert forward == backward[::-1]


def test_same_prompts_reuses_one_sequence_apart_from_warmup() -> None:
    cells = plan_draws(spec(concurrencies=(4, 8), trials=2, same_prompts=True))
    first = cells[(4, 0)]
    assert cells[(4, 1)] == first
    assert cells[(8, 0)][: len(first)] == first  # a longer cell extends the same sequence
    assert not {p.id for p in cells[(0, 0)]} & {p.id for p in cells[(8, 1)]}  # warmup never warms the cache


def test_draws_outside_the_plan_are_deterministic() -> None:
    s = spec(concurrencies=(4,))
    assert load_prompts(s).draw(64, 9, 3) == load_prompts(s).draw(64, 9, 3)
    assert load_prompts(s).draw(4, 0, 0) == []


def test_variant_tags_the_first_user_turn() -> None:
    p = Prompt("x", "s\nu", ({"role": "system", "content": "s"}, {"role": "user", "content": "u"}))
    v = p.variant(2)
    assert v.id == "x~2"
    assert v.messages == ({"role": "system", "content": "s"}, {"role": "user", "content": "(Variant 2.) u"})


# ---- files -----------------------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, lines: list[object] | str) -> Path:
    path = tmp_path / name
    text = lines if isinstance(lines, str) else "\n".join(json.dumps(x) for x in lines) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_prompts_and_messages(tmp_path: Path) -> None:
    path = write(tmp_path, "p.jsonl", [
        {"prompt": "hello", "id": "a"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}]},
    ])  # fmt: skip
    ps = read_prompt_file(path)
    assert ps[0] == Prompt("a", "hello")
    assert ps[1].id == "2" and ps[1].messages is not None and ps[1].messages[1]["content"] == "why?"
    src = load_prompts(spec(prompts=str(path), concurrencies=(1,), warmup=0))
    assert {p.id for p in src.draw(1, 0, 2)} == {"a", "2"}


def test_sharegpt_jsonl_and_json_array(tmp_path: Path) -> None:
    conv = [
        {"id": "c1", "conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"}]},
        {"id": "c2", "conversations": [{"from": "gpt", "value": "no human turn"}]},  # skipped, as vLLM does
        {"id": "c3", "conversations": [{"from": "system", "value": "s"}, {"from": "user", "value": "Q3"}]},
    ]
    for path in (write(tmp_path, "s.jsonl", conv), write(tmp_path, "s.json", json.dumps(conv))):
        assert read_prompt_file(path) == [Prompt("c1", "Q1"), Prompt("c3", "Q3")]
        assert read_prompt_file(path, "sharegpt") == [Prompt("c1", "Q1"), Prompt("c3", "Q3")]


@pytest.mark.parametrize(
    "content, fmt, needle",
    [
        ('{"prompt": "ok"}\n{"prompt": "x"\n', "auto", ":2: invalid JSON"),
        ('{"prompt": "ok"}\n\n[1, 2]\n', "auto", ":3: expected a JSON object"),
        ('{"prompt": ""}\n', "auto", ":1: 'prompt' must be a non-empty string"),
        ('{"text": "x"}\n', "auto", ":1: expected a 'prompt' string or a 'messages' list"),
        ('{"messages": [{"role": "user"}]}\n', "auto", ":1: messages[0] needs string 'role' and 'content'"),
        ('{"conversations": "x"}\n', "auto", ":1: ShareGPT 'conversations' must be a list"),
        ('{"prompt": "x"}\n', "sharegpt", ":1: ShareGPT 'conversations' must be a list"),
        ('{"conversations": [{"from": "human"}]}\n', "auto", ":1: conversations[0] needs string"),
        ('[{"prompt": "a"}, 3]', "auto", "[1]: expected a JSON object"),
        ("[{]", "auto", ":1: invalid JSON"),
        ('{"conversations": []}\n', "auto", "holds no usable prompts"),
    ],
)
def test_bad_files_name_file_and_line(tmp_path: Path, content: str, fmt: str, needle: str) -> None:
    path = write(tmp_path, "bad.jsonl", content)
    with pytest.raises(ConfigError) as e:
        read_prompt_file(path, fmt)
    assert str(e.value).startswith("--prompts: ")
    assert str(path) in str(e.value) and needle in str(e.value)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--prompts: cannot read"):
        load_prompts(spec(prompts=str(tmp_path / "nope.jsonl")))
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_prompt_file(binary)
