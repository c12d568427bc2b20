"""Helpers for the llama.cpp integration tests: llama-server command lines, a server that always stops, the
`tokbench` CLI as a subprocess, and the scan for processes a test left behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from tokbench.cli.demo import llama_server_argv
from tokbench.config import ServerSpec
from tokbench.server.install import EnginePaths
from tokbench.server.launch import ServerProcess

TAG_ENV = "TOKBENCH_TEST_TAG"
TAG = uuid.uuid4().hex


def llama_argv(engine: EnginePaths, *extra: str, parallel: int = 4) -> list[str]:
    """llama-server serving Gemma on {host}:{port}, as the demo runs it."""
    return list(llama_server_argv(engine, *extra, parallel=parallel))


@contextlib.contextmanager
def running_llama(
    engine: EnginePaths, log_dir: Path, *extra: str, name: str = "llama", parallel: int = 4
) -> Iterator[ServerProcess]:
    """Start llama-server on a free port, wait for /health, and always stop it (SIGTERM, then SIGKILL)."""
    spec = ServerSpec(
        name=name,
        engine="llamacpp",
        argv=tuple(llama_argv(engine, *extra, parallel=parallel)),
        ready_timeout_s=120,
    )
    server = ServerProcess(spec, log_dir / f"{name}.log")
    try:
        server.start()
        server.wait_ready(120.0)
        yield server
    finally:
        server.stop(grace_s=5.0)


def tagged_processes() -> list[tuple[int, str]]:
    """(pid, command line) of live processes started under this test session's tag."""
    needle = f"{TAG_ENV}={TAG}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2 :].split()[0] == "Z":
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((int(entry.name), cmd))
    return found


def wait_gone(ignore: set[int], timeout_s: float = 10.0) -> list[tuple[int, str]]:
    """Tagged processes not in `ignore` still alive after up to `timeout_s` (teardown may take a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [(pid, cmd) for pid, cmd in tagged_processes() if pid not in ignore]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def tokbench(
    *args: str, timeout_s: float = 300.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the `tokbench` CLI in a subprocess (as a user would), with a deadline."""
    return subprocess.run(
        [sys.executable, "-m", "tokbench", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        check=False,
    )
