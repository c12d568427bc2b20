"""Unit tests for `tokbench engines` and the demo's plan (no build, no server: a hand-seeded cache)."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from tokbench.cli import main
from tokbench.cli.demo import default_out_dir, demo_plan
from tokbench.cli.engines import _Display
from tokbench.server import install
from tokbench.server.install import EnginePaths, InstallStep
from tokbench.server.preflight import preflight_plan


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return install.cache_root()


def _seed(root: Path) -> EnginePaths:
    d = root / "llamacpp" / install.LLAMACPP_VERSION
    d.mkdir(parents=True)
    (d / "llama-server").write_text("#!/bin/sh\n")
    (d / "llama-server").chmod(0o755)
    manifest = {
        "version": install.LLAMACPP_VERSION,
        "host": install._host_fingerprint(),
        "server_version": "version: 1 (test)",
        "build_seconds": 321.0,
        "jobs": 2,
        "built_at": "2026-01-01T00:00:00Z",
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    model = root / "models" / install.MODEL_FILE
    model.parent.mkdir(parents=True)
    model.write_bytes(b"GGUF")
    model.with_name(model.name + ".sha256").write_text(json.dumps({"sha256": "x", "size": 4}))
    return EnginePaths(d / "llama-server", model, install.LLAMACPP_VERSION, d / "manifest.json")


def test_engines_path_without_install_says_how_to_install(cache: Path) -> None:
    res = CliRunner().invoke(main, ["engines", "path", "llamacpp"])
    assert res.exit_code == 4
    assert "tokbench engines install llamacpp" in res.output


def test_engines_path_and_install_reuse_the_cache(cache: Path) -> None:
    paths = _seed(cache)
    res = CliRunner().invoke(main, ["engines", "path", "llamacpp"])
    assert res.exit_code == 0 and res.output.strip() == str(paths.server)
    res = CliRunner().invoke(main, ["engines", "path", "llamacpp", "--model"])
    assert res.output.strip() == str(paths.model)
    # cached: no download, no build; the manifest's build facts are shown
    res = CliRunner().invoke(main, ["engines", "install", "llamacpp"])
    assert res.exit_code == 0, res.output
    assert str(paths.server) in res.output and "321.0 s with 2 jobs" in res.output


def test_engines_rejects_unknown_engine() -> None:
    res = CliRunner().invoke(main, ["engines", "install", "vllm"])
    assert res.exit_code == 2 and "llamacpp" in res.output


def test_build_progress_in_a_log_is_one_line_per_stage_and_tenth() -> None:
    buf = io.StringIO()
    display = _Display(Console(file=buf, force_terminal=False, width=200))
    with display:
        display(InstallStep("configure", "configuring llama.cpp with cmake"))
        display(InstallStep("build", "building", 0.0, 0.0, 300.0))
        for i in range(1, 101):
            display(InstallStep("build", f"[{i:3d}%] Building x.o", i / 100, i * 3.0, 300.0 - i * 3))
        display(InstallStep("done", "ready"))
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[configure] configuring llama.cpp with cmake"
    build = [ln for ln in lines if ln.startswith("[build]")]
    assert len(build) == 1 + 11  # the start, then 0%, 10%, ..., 100%
    assert "~4m30s left" in build[2]  # 10% after 30 s: the estimate the step carried
    assert lines[-1] == "[done] ready"


def test_demo_plan_is_valid_and_passes_preflight(tmp_path: Path) -> None:
    engine = EnginePaths(tmp_path / "llama-server", tmp_path / "m.gguf", "1", tmp_path / "manifest.json")
    plan = demo_plan(engine, (1, 2, 4), trials=3, max_tokens=128, out_dir=tmp_path / "out")
    assert [c.name for c in plan.configs] == ["baseline", "ngram", "draft-same-model"]
    assert plan.baseline.name == "baseline" and plan.design == "interleaved" and plan.rounds == 3
    assert all(c.engine == "llamacpp" and c.port is None for c in plan.configs)
    for c in plan.configs:
        assert c.argv[0] == str(engine.server) and "{port}" in c.argv and "--metrics" in c.argv
    draft = plan.configs[2].argv
    assert draft[draft.index("-md") + 1] == str(engine.model)
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert plan.load_spec("http://127.0.0.1:1").max_tokens == 128
    assert preflight_plan(plan) == []  # no warnings either: -md comes with its --spec-type


def test_default_out_dir_is_timestamped_under_user_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    out = default_out_dir(datetime(2026, 1, 2, 3, 4, 5))
    assert out == tmp_path / "tokbench" / "demo" / "20260102-030405"
