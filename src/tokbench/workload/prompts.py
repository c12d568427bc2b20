"""Prompt sources: the built-in corpus shipped with the package, and JSONL / ShareGPT files.

Draws are deterministic by seed. By default every (level, trial) gets prompts no other cell of the plan gets,
so a prefix cache warmed by one level cannot flatter the next; `same_prompts` gives every cell one sequence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from tokbench.config import LoadSpec
from tokbench.errors import ConfigError

BUILTIN = "builtin"
_WARMUP_KEY = (0, 0)  # warmup draws use concurrency 0; no measured level can be 0


@dataclass(frozen=True)
class Prompt:
    """One prompt. `messages` (chat turns) win over `text` for the chat API; `text` feeds the others."""

    id: str
    text: str
    messages: tuple[dict[str, str], ...] | None = None

    def variant(self, n: int) -> Prompt:
        """The same prompt with a distinct opening, so a cycled corpus never repeats a prefix (n >= 1)."""
        tag = f"(Variant {n}.) "
        if self.messages is None:
            return Prompt(f"{self.id}~{n}", tag + self.text)
        msgs = [dict(m) for m in self.messages]
        # Tag the first user turn: a shared system prompt may stay cached, as it would in real traffic.
        at = next((i for i, m in enumerate(msgs) if m.get("role") == "user"), 0)
        msgs[at]["content"] = tag + msgs[at].get("content", "")
        return Prompt(f"{self.id}~{n}", tag + self.text, tuple(msgs))


class PromptSource:
    """A fixed pool of prompts laid out as one seeded stream: warmup first, then each (level, trial) of the
    plan in canonical order (trial-major, ascending levels). Offsets follow the plan, not execution order."""

    def __init__(self, pool: Sequence[Prompt], spec: LoadSpec) -> None:
        if not pool:
            raise ConfigError(f"--prompts: {spec.prompts!r} holds no prompts")
        rng = np.random.default_rng([spec.seed, 0x70])
        self._pool: list[Prompt] = [pool[int(i)] for i in rng.permutation(len(pool))]
        self._same = spec.same_prompts
        self._offsets: dict[tuple[int, int], tuple[int, int]] = {_WARMUP_KEY: (0, spec.warmup)}
        offset = spec.warmup
        for trial in range(spec.trials):
            for c in sorted(set(spec.concurrencies)):
                n = spec.requests_for(c)
                self._offsets[(c, trial)] = (offset, n)
                offset += n
        self._planned_end = offset
        self._warmup = spec.warmup

    def __len__(self) -> int:
        return len(self._pool)

    def draw(self, concurrency: int, trial: int, n: int) -> list[Prompt]:
        """`n` prompts for one cell; `draw(0, 0, n)` is the warmup. Same arguments, same prompts, always."""
        if n <= 0:
            return []
        if self._same and (concurrency, trial) != _WARMUP_KEY:
            # After the warmup's prompts, so warmup never pre-fills the cache for the measured ones.
            return [self._at(self._warmup + i) for i in range(n)]
        start, planned = self._offsets.get((concurrency, trial), (-1, 0))
        if start < 0 or n > planned:
            # Outside the plan: a deterministic region past it (distinct from the plan, maybe not each other).
            start = self._planned_end + (concurrency * 7919 + trial * 104729) % (1 << 20)
        return [self._at(start + i) for i in range(n)]

    def _at(self, i: int) -> Prompt:
        p = self._pool[i % len(self._pool)]
        lap = i // len(self._pool)
        return p if lap == 0 else p.variant(lap)


def load_prompts(spec: LoadSpec) -> PromptSource:
    """The built-in corpus, or the JSONL / ShareGPT file named by `spec.prompts`; ConfigError if it is bad."""
    if spec.prompts == BUILTIN:
        return PromptSource(builtin_corpus(), spec)
    return PromptSource(read_prompt_file(Path(spec.prompts), spec.prompt_format), spec)


def builtin_corpus() -> list[Prompt]:
    text = resources.files("tokbench.workload").joinpath("corpus.jsonl").read_text(encoding="utf-8")
    return _parse_jsonl_lines(text.splitlines(), "builtin corpus", "jsonl")


def read_prompt_file(path: Path, fmt: str = "auto") -> list[Prompt]:
    """Prompts from a JSONL file (one {"prompt": ...} or {"messages": [...]} or ShareGPT object per line) or a
    JSON array (ShareGPT's usual layout). Errors name the file and the line (or array element)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"--prompts: cannot read {str(path)!r}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--prompts: {str(path)!r} is not UTF-8 text") from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--prompts: {path}:{e.lineno}: invalid JSON ({e.msg})") from None
        prompts = [p for i, item in enumerate(items) if (p := _prompt(item, f"{path}[{i}]", str(i), fmt))]
    else:
        prompts = _parse_jsonl_lines(text.splitlines(), str(path), fmt)
    if not prompts:
        raise ConfigError(
            f"--prompts: {path} holds no usable prompts (expected 'prompt', 'messages' or ShareGPT "
            "'conversations' with a human turn)"
        )
    return prompts


def _parse_jsonl_lines(lines: Iterable[str], where: str, fmt: str) -> list[Prompt]:
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"--prompts: {where}:{lineno}: invalid JSON ({e.msg}); one object per line"
            ) from None
        p = _prompt(item, f"{where}:{lineno}", str(lineno), fmt)
        if p is not None:
            out.append(p)
    return out


def _prompt(item: Any, where: str, default_id: str, fmt: str) -> Prompt | None:
    """One prompt from one object; None for a ShareGPT conversation without a human turn (files hold some)."""
    if not isinstance(item, Mapping):
        raise ConfigError(f"--prompts: {where}: expected a JSON object, got {type(item).__name__}")
    pid = item.get("id")
    pid = str(pid) if isinstance(pid, (str, int)) else default_id
    if fmt == "sharegpt" or (fmt == "auto" and "conversations" in item):
        return _sharegpt(item, where, pid)
    if "prompt" in item:
        text = item["prompt"]
        if not isinstance(text, str) or not text:
            raise ConfigError(f"--prompts: {where}: 'prompt' must be a non-empty string")
        return Prompt(pid, text)
    if "messages" in item:
        msgs = tuple(_messages(item["messages"], where))
        return Prompt(pid, "\n".join(m["content"] for m in msgs), msgs)
    raise ConfigError(
        f"--prompts: {where}: expected a 'prompt' string or a 'messages' list"
        + (" (or ShareGPT 'conversations')" if fmt == "auto" else f" (--prompt-format {fmt})")
    )


def _messages(raw: Any, where: str) -> Iterator[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"--prompts: {where}: 'messages' must be a non-empty list of {{role, content}} objects"
        )
    for j, m in enumerate(raw):
        if not (
            isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        ):
            raise ConfigError(f"--prompts: {where}: messages[{j}] needs string 'role' and 'content'")
        yield {"role": m["role"], "content": m["content"]}


_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def _sharegpt(item: Mapping[str, Any], where: str, pid: str) -> Prompt | None:
    conv = item.get("conversations")
    if not isinstance(conv, list):
        raise ConfigError(
            f"--prompts: {where}: ShareGPT 'conversations' must be a list of {{from, value}} turns"
        )
    for j, turn in enumerate(conv):
        if not (
            isinstance(turn, Mapping)
            and isinstance(turn.get("from"), str)
            and isinstance(turn.get("value"), str)
        ):
            raise ConfigError(f"--prompts: {where}: conversations[{j}] needs string 'from' and 'value'")
        # The first human turn is the prompt, as vLLM's and SGLang's benchmarks take it.
        if _SHAREGPT_ROLES.get(turn["from"]) == "user" and turn["value"]:
            return Prompt(pid, turn["value"])
    return None
