"""Deterministic output text: token i of the answer to a prompt is a pure function of (prompt, i).

One token is one word with a leading space, so a chunk carrying k tokens has k words, and two servers answer
the same prompt with the same text (what the lossless check compares) unless one is told to diverge.
"""

from __future__ import annotations

import hashlib

_WORDS = (  # noqa: SIM905 (a word list reads better as text)
    "alpha bravo cedar delta ember fable garnet harbor island jasper kettle lumen meadow nectar orbit pebble "
    "quartz river saddle timber umber velvet willow xenon yonder zephyr amber basil cobalt dune echo fern "
    "glacier hazel indigo juniper kelp lagoon maple nova onyx pine quill raven sierra tundra ultra vale "
    "walnut yarrow zinc acorn birch canyon dawn estuary fjord grove heath inlet jetty knoll ledge marsh "
    "north oasis prairie quarry ridge shoal thicket upland valley wharf yard zenith anchor beacon compass "
    "drift eddy flint gale horizon isle jib keel lantern mast nautical oar port quay rudder sail tide"
).split()
_MASK = (1 << 64) - 1
_DIVERGE_SALT = 0x5DEECE66D


def prompt_key(prompt: str, salt: int = 0) -> int:
    """A 64-bit key for a prompt; `salt` (a request seed at temperature > 0) gives a different text."""
    digest = hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return (int.from_bytes(digest, "little") ^ (salt * 0x9E3779B97F4A7C15)) & _MASK


def _mix(x: int) -> int:
    # splitmix64 finaliser: cheap, well-spread, pure integer arithmetic.
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def token_text(key: int, position: int, diverge_at: int | None = None) -> str:
    """The text of token `position` (0-based) of the answer with this key."""
    if diverge_at is not None and position >= diverge_at:
        key ^= _DIVERGE_SALT
    return " " + _WORDS[_mix(key ^ (position * 0xD6E8FEB86659FD93 & _MASK)) % len(_WORDS)]


def answer_text(key: int, start: int, count: int, diverge_at: int | None = None) -> str:
    """Tokens start .. start+count-1 joined."""
    return "".join(token_text(key, i, diverge_at) for i in range(start, start + count))


def natural_length(prompt: str, natural_max: int) -> int:
    """Where the answer to `prompt` stops without ignore_eos: 1 .. natural_max, a pure function of it."""
    return 1 + _mix(prompt_key(prompt) ^ 0xE05E05) % natural_max


def count_prompt_tokens(prompt: str) -> int:
    """Prompt length in tokens: whitespace-separated words (at least 1), the server's only tokenizer."""
    return max(1, len(prompt.split()))
