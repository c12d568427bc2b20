"""Test helper: find processes by a unique token in their command line (a /proc scan, no psutil), so a test
can prove that nothing it launched outlived it."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_with(token: str) -> list[int]:
    """Live (non-zombie) processes other than this one whose command line contains `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if token in cmdline and stat[stat.rfind(")") + 2 :].split()[0] != "Z":
            found.append(int(entry.name))
    return found


def assert_none_left(token: str, within_s: float = 5.0) -> None:
    """Processes just killed may take a moment to be reaped by init; wait a little, never forever."""
    deadline = time.monotonic() + within_s
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = processes_with(token)
    assert not left, f"processes left behind: {left}"
