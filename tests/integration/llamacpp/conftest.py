"""Fixtures for tests against the real llama.cpp llama-server with Gemma 3 270M.

The engine comes from `install_llamacpp()` (cached; built on first use). These tests run in CI and never skip:
an engine that cannot be installed is a failure. Every process a test starts carries a tag in its environment,
and each test checks afterwards that none is left running.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest
from llama_helpers import TAG, TAG_ENV, running_llama, tagged_processes, wait_gone

from tokbench.errors import EngineInstallError
from tokbench.server.install import EnginePaths, InstallStep, install_llamacpp
from tokbench.server.launch import ServerProcess


@pytest.fixture(scope="session")
def llama_engine() -> EnginePaths:
    """The cached llama-server build and the model; installs them if missing (minutes, once)."""
    stages: set[str] = set()

    def progress(step: InstallStep) -> None:
        if step.stage not in stages:  # one line per stage, not one per compiler line
            stages.add(step.stage)
            print(step)

    try:
        return install_llamacpp(progress)
    except EngineInstallError as e:
        pytest.fail(f"the llama.cpp engine could not be installed, so the llamacpp tests cannot run: {e}")


@pytest.fixture(scope="session")
def baseline_server(
    llama_engine: EnginePaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One llama-server shared by the tests that only need a plain baseline to send requests to."""
    with running_llama(llama_engine, tmp_path_factory.mktemp("baseline"), name="baseline") as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def _tag_children() -> Iterator[None]:
    # Children inherit the environment (through `tokbench` subprocesses too); /proc/PID/environ shows it.
    old = os.environ.get(TAG_ENV)
    os.environ[TAG_ENV] = TAG
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(TAG_ENV, None)
        else:
            os.environ[TAG_ENV] = old


@pytest.fixture(autouse=True)
def no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that leaves a process it started running (session servers excepted), then cleans up."""
    before = {pid for pid, _ in tagged_processes()}
    yield
    left = wait_gone(before)
    for pid, _ in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"{request.node.name} left processes running: {left}"
