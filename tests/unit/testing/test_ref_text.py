"""Output text is a pure function of (prompt, position); divergence and natural stops are deterministic."""

from __future__ import annotations

from tokbench.testing import answer_text, natural_length, prompt_key, token_text
from tokbench.testing.text import count_prompt_tokens


def test_text_depends_only_on_prompt_and_position() -> None:
    key = prompt_key("why is the sky blue?")
    assert answer_text(key, 0, 50) == answer_text(prompt_key("why is the sky blue?"), 0, 50)
    assert answer_text(key, 10, 5) == answer_text(key, 0, 15)[len(answer_text(key, 0, 10)) :]
    assert answer_text(key, 0, 50) != answer_text(prompt_key("why is the sea blue?"), 0, 50)
    assert answer_text(key, 0, 50) != answer_text(prompt_key("why is the sky blue?", salt=7), 0, 50)


def test_one_token_is_one_word() -> None:
    text = answer_text(prompt_key("p"), 0, 37)
    assert len(text.split()) == 37 and text.startswith(" ")


def test_divergence_starts_exactly_at_the_position() -> None:
    key = prompt_key("q")
    same = [token_text(key, i) for i in range(40)]
    moved = [token_text(key, i, diverge_at=12) for i in range(40)]
    assert moved[:12] == same[:12]
    assert sum(a != b for a, b in zip(moved[12:], same[12:], strict=True)) > 20


def test_natural_length_is_deterministic_and_in_range() -> None:
    lengths = [natural_length(f"prompt {i}", 50) for i in range(300)]
    assert lengths == [natural_length(f"prompt {i}", 50) for i in range(300)]
    assert min(lengths) >= 1 and max(lengths) <= 50 and len(set(lengths)) > 30


def test_prompt_tokens_are_words() -> None:
    assert count_prompt_tokens("a b  c\nd") == 4 and count_prompt_tokens("") == 1
