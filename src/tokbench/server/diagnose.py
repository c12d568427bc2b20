"""Crash triage: from a server's log and exit status, the line that explains why it died.

Rules are data: (pattern, label) pairs, most specific first. The root cause is the last log line any rule
matches, because engines print their real error last (a traceback ends with its exception; C++ aborts after
its message).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

TAIL_LINES = 30

# (pattern, label), checked in order on each line: a line that matches several gets the most specific label.
RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError", re.I),
        "CUDA out of memory",
    ),
    (
        re.compile(r"address already in use|EADDRINUSE|couldn't bind HTTP server socket", re.I),
        "address in use",
    ),
    (
        re.compile(
            r"unrecognized arguments?:|unknown argument|error: invalid argument|invalid argument: -"
            r"|error while handling argument|unrecognized option|no such option"
        ),
        "unknown argument",
    ),
    (re.compile(r"GGML_ASSERT"), "GGML_ASSERT"),
    (re.compile(r"error loading model|failed to load model", re.I), "model load failed"),
    (re.compile(r"terminate called (after throwing|without an active exception)"), "C++ terminate"),
    (re.compile(r"^\s*(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Exit)\b(?::\s.*)?\s*$"), "Python exception"),
    (re.compile(r"(?:^|[\s:\]])error: \S"), "error"),
    (re.compile(r"\bSegmentation fault\b|\bcore dumped\b|\bAborted\b"), "fatal signal"),
)

_FILE_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")
_ASSERTION = re.compile(r"^\s*(?:[\w.]+\.)?AssertionError\s*$")


@dataclass(frozen=True)
class Triage:
    """Why a server died: the root-cause line (None if no rule matched), exit status, the log's tail."""

    root_cause: str | None
    exit_code: int | None
    tail: tuple[str, ...]
    label: str | None = None

    @property
    def exit_description(self) -> str:
        return describe_exit(self.exit_code)


def describe_exit(code: int | None) -> str:
    """-9 -> 'killed by SIGKILL (-9)'; 137 from a shell -> 'exit code 137 (128+9: SIGKILL)'."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {_signal_name(-code)} ({code})"
    if code > 128 and _signal_name(code - 128, default="") != "":
        return f"exit code {code} (128+{code - 128}: {_signal_name(code - 128)}, as a shell reports a signal)"
    return f"exit code {code}"


def _signal_name(num: int, default: str | None = None) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return default if default is not None else f"signal {num}"


def _assert_source(lines: list[str], at: int) -> str | None:
    """The failed assert's source above a bare AssertionError: the lines after the last `File` frame."""
    start = at - 1
    while start >= 0 and not _FILE_LINE.match(lines[start]):
        start -= 1
    if start < 0:
        return None
    m = _FILE_LINE.match(lines[start])
    src = " ".join(ln.strip() for ln in lines[start + 1 : at] if ln.strip() and not _CARETS.match(ln))
    where = f" at {m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}" if m else ""
    return f"assert failed{where}: {src}" if src else f"assert failed{where}"


_USAGE = re.compile(r"^\s*usage:", re.I)
# Who printed the line, as multi-process engines prefix it: vLLM `(APIServer pid=7) ` or
# `(EngineCore_DP0 pid=9) `, torch.distributed `[rank0]: `. Dropped before matching, so an exception reads
# as it would unprefixed.
_PROCESS_PREFIX = re.compile(r"^(?:\((?:[\w .-]+ )?pid=\d+\)\s?|\[rank\d+\]:\s?)+")


def root_cause(lines: list[str]) -> tuple[str | None, str | None]:
    """(line, label) of the last line that any rule matches, scanning from the end. A command-line parser
    prints its usage text after the error (llama-server, argparse), so matches inside it do not count."""
    lines = [_PROCESS_PREFIX.sub("", ln) for ln in lines]
    usage = next((i for i in range(len(lines) - 1, -1, -1) if _USAGE.match(lines[i])), None)
    if usage is not None:
        cause = _scan(lines, usage)
        if cause[0] is not None:
            return cause
    return _scan(lines, len(lines))


def _scan(lines: list[str], end: int) -> tuple[str | None, str | None]:
    for i in range(end - 1, -1, -1):
        line = lines[i].rstrip()
        for pattern, label in RULES:
            if pattern.search(line):
                text = line.strip()
                if _ASSERTION.match(line):
                    src = _assert_source(lines, i)
                    text = f"AssertionError ({src})" if src else "AssertionError (no message)"
                return text, label
    return None, None


def triage(log_text: str, exit_code: int | None) -> Triage:
    """Read a server log after it died or failed to become ready."""
    lines = log_text.splitlines()
    cause, label = root_cause(lines)
    tail = tuple(ln.rstrip() for ln in lines[-TAIL_LINES:])
    return Triage(root_cause=cause, exit_code=exit_code, tail=tail, label=label)


def format_triage(t: Triage, *, config: str, what: str, log_path: str | None = None) -> str:
    """A multi-line message for ServerStartError/ServerCrashError: what happened, the cause, the tail."""
    head = f"{config}: {what} ({t.exit_description})"
    lines = [head, f"  root cause: {t.root_cause or 'no known error line in the log; read the tail below'}"]
    if log_path:
        lines.append(f"  log: {log_path}")
    if t.tail:
        lines.append(f"  last {len(t.tail)} log lines:")
        lines.extend(f"    | {ln}" for ln in t.tail)
    else:
        lines.append("  the log is empty")
    return "\n".join(lines)
