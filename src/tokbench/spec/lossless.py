"""Lossless check: at temperature 0, speculative decoding must not change the output. Compare A's and B's
texts prompt by prompt (same level, same trial, same prompt id) and locate the first divergence.

Caveat printed with the result: even without speculation, greedy outputs can differ with batch composition
(floating-point reduction order), so a few late divergences at high concurrency are not proof of a bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokbench.records import RequestRecord, RunResult

_EXCERPT = 24


@dataclass(frozen=True)
class Divergence:
    concurrency: int
    trial: int
    prompt_id: str
    char: (
        int  # first differing character (0-based); the shorter length when one text is a prefix of the other
    )
    word: int  # first differing whitespace-separated word (0-based)
    a_chars: int
    b_chars: int
    a_excerpt: str  # the text from the divergence on, cut short
    b_excerpt: str


@dataclass(frozen=True)
class LosslessResult:
    pairs: int  # prompts compared (both sides succeeded and produced text)
    identical: int
    divergences: tuple[Divergence, ...]
    unmatched: int  # records with no partner on the other side
    skipped: int  # pairs where either side failed or produced no text
    by_level: Mapping[int, tuple[int, int]] = field(default_factory=dict)  # concurrency -> (pairs, identical)
    notes: tuple[str, ...] = ()

    @property
    def share_identical(self) -> float | None:
        return self.identical / self.pairs if self.pairs else None


def first_divergence(a: str, b: str) -> tuple[int, int] | None:
    """(character, word) index of the first difference; None when the texts are identical."""
    if a == b:
        return None
    n = min(len(a), len(b))
    char = next((i for i in range(n) if a[i] != b[i]), n)
    wa, wb = a.split(), b.split()
    m = min(len(wa), len(wb))
    word = next((i for i in range(m) if wa[i] != wb[i]), m)
    return char, word


def _by_prompt(records: tuple[RequestRecord, ...]) -> dict[tuple[str, int], RequestRecord]:
    """Key each measured record by (prompt id, occurrence): a prompt drawn twice pairs in order."""
    seen: dict[str, int] = {}
    out = {}
    for r in records:
        if r.warmup:
            continue
        k = seen.get(r.prompt_id, 0)
        seen[r.prompt_id] = k + 1
        out[(r.prompt_id, k)] = r
    return out


def _temperature(meta_load: Mapping[str, Any]) -> float | None:
    t = meta_load.get("temperature")
    return float(t) if isinstance(t, (int, float)) else None


def lossless_check(a: RunResult, b: RunResult) -> LosslessResult:
    """Compare outputs of every prompt both runs sent at the same level and trial."""
    pairs = identical = unmatched = skipped = 0
    divergences: list[Divergence] = []
    by_level: dict[int, tuple[int, int]] = {}
    for lv_a in a.levels:
        lv_b = b.level(lv_a.concurrency)
        trials_b = {t.trial: t for t in lv_b.trials} if lv_b is not None else {}
        lp = li = 0
        for ta in lv_a.trials:
            tb = trials_b.pop(ta.trial, None)
            ra = _by_prompt(ta.records)
            rb = _by_prompt(tb.records) if tb is not None else {}
            unmatched += len(ra.keys() ^ rb.keys())
            for key in sorted(ra.keys() & rb.keys()):
                x, y = ra[key], rb[key]
                if not (x.ok and y.ok) or not (x.output_text or y.output_text):
                    skipped += 1
                    continue
                lp += 1
                d = first_divergence(x.output_text, y.output_text)
                if d is None:
                    li += 1
                    continue
                char, word = d
                divergences.append(
                    Divergence(
                        lv_a.concurrency,
                        ta.trial,
                        key[0],
                        char,
                        word,
                        len(x.output_text),
                        len(y.output_text),
                        x.output_text[char : char + _EXCERPT],
                        y.output_text[char : char + _EXCERPT],
                    )
                )
        unmatched += sum(len(_by_prompt(t.records)) for t in trials_b.values())
        pairs, identical = pairs + lp, identical + li
        if lp:
            by_level[lv_a.concurrency] = (lp, li)
    for lv_b in b.levels:
        if a.level(lv_b.concurrency) is None:
            unmatched += sum(len(_by_prompt(t.records)) for t in lv_b.trials)
    notes = []
    temps = {_temperature(a.meta.load), _temperature(b.meta.load)}
    if any(t is not None and t > 0 for t in temps):
        notes.append("not run at temperature 0: sampled outputs may differ without any fault")
    if unmatched and not pairs:
        notes.append(
            "no prompt was sent by both runs at the same level and trial "
            "(use the same seed, or --same-prompts)"
        )
    return LosslessResult(
        pairs, identical, tuple(divergences), unmatched, skipped, dict(sorted(by_level.items())), tuple(notes)
    )
