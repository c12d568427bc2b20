"""Lossless check: per-prompt output comparison at the same level and trial, first divergence positions."""

from __future__ import annotations

from spec_fakes import rec, run, trial

from tokbench.records import ErrorKind
from tokbench.spec.lossless import first_divergence, lossless_check


def test_first_divergence_in_characters_and_words() -> None:
    assert first_divergence("the cat sat on the mat", "the cat sat on the mat") is None
    assert first_divergence("the cat sat on the mat", "the cat sat in the mat") == (12, 3)
    assert first_divergence("one two", "one two three") == (7, 2)  # a prefix diverges where it ends
    assert first_divergence("", "x") == (0, 0)


def test_share_identical_and_divergences_per_level_and_trial() -> None:
    a = run(
        [
            trial([rec(0, text="alpha beta"), rec(1, text="gamma delta")], concurrency=1),
            trial([rec(0, prompt_id="q", text="x y z"), rec(1, prompt_id="q", text="x y w")], concurrency=4),
        ],
        label="a",
    )
    b = run(
        [
            trial(
                [rec(1, text="gamma delta"), rec(0, text="alpha beta")], concurrency=1
            ),  # order does not matter
            trial([rec(0, prompt_id="q", text="x y z"), rec(1, prompt_id="q", text="x y z")], concurrency=4),
        ],
        label="b",
    )
    res = lossless_check(a, b)
    assert (res.pairs, res.identical) == (4, 3)
    assert res.share_identical == 0.75
    assert res.by_level == {1: (2, 2), 4: (2, 1)}
    (dv,) = res.divergences
    # The second occurrence of prompt q pairs with the second occurrence on the other side.
    assert (dv.concurrency, dv.prompt_id, dv.char, dv.word) == (4, "q", 4, 2)
    assert (dv.a_excerpt, dv.b_excerpt) == ("w", "z")
    assert res.notes == ()


def test_unmatched_failed_and_warmup_records_are_not_compared() -> None:
    a = run(
        [
            trial(
                [
                    rec(0, text="same"),
                    rec(1, text="only in a"),
                    rec(2, text="", error=ErrorKind.TIMEOUT),
                    rec(3, text="warm", warmup=True),
                ]
            ),
            trial([rec(0, text="level 8 only in a")], concurrency=8),
        ],
        load={"temperature": 0.7},
    )
    b = run([trial([rec(0, text="same"), rec(2, text="b finished"), rec(3, text="warm!", warmup=True)])])
    res = lossless_check(a, b)
    assert (res.pairs, res.identical, res.skipped) == (1, 1, 1)
    assert res.unmatched == 2  # p1 at C=1 and the C=8 level
    assert any("temperature" in n for n in res.notes)


def test_no_common_prompts_is_said_plainly() -> None:
    a = run([trial([rec(0, prompt_id="a1", text="x")])])
    b = run([trial([rec(0, prompt_id="b1", text="x")])])
    res = lossless_check(a, b)
    assert res.share_identical is None
    assert any("same seed" in n for n in res.notes)
