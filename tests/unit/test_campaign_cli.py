"""`tokbench campaign check`: validates and preflights a plan without launching anything."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tokbench.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_check_passes_the_seed_example_and_prints_the_schedule() -> None:
    r = CliRunner().invoke(main, ["campaign", "check", str(EXAMPLES / "seed-nextn.yaml")])
    assert r.exit_code == 0, r.output
    assert (
        "2 configuration(s), baseline 'base', design interleaved, 3 trial(s) per level, 6 launch(es)"
        in r.output
    )
    assert "preflight passed" in r.output
    order = [ln.split()[1] for ln in r.output.splitlines() if ln.strip()[:2].rstrip(".").isdigit()]
    assert order == ["base", "nextn", "nextn", "base", "base", "nextn"]


def test_check_fails_fast_on_a_flag_conflict(tmp_path: Path) -> None:
    text = (EXAMPLES / "seed-nextn.yaml").read_text()
    bad = text.replace(
        "--speculative-algorithm, NEXTN,", "--speculative-algorithm, NEXTN, --speculative-eagle-topk, '2',"
    )
    assert bad != text
    plan = tmp_path / "bad.yaml"
    plan.write_text(bad)
    r = CliRunner().invoke(main, ["campaign", "check", str(plan)])
    assert r.exit_code == 2
    assert "error: " in r.output and "nothing was started" in r.output
    assert "nextn: --speculative-eagle-topk 2 with SGLANG_ENABLE_SPEC_V2=1" in r.output
    assert "Spec v2 currently only supports topk = 1 for speculative decoding." in r.output
    assert "fix: " in r.output


def test_check_reports_plan_errors_with_their_path(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("configs:\n  - name: a\n    argv: [llama-server]\n")
    r = CliRunner().invoke(main, ["campaign", "check", str(plan)])
    assert r.exit_code == 2
    assert "configs[0].port: no port" in r.output


def test_check_shows_warnings(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text(
        "configs:\n"
        "  - {name: base, engine: llamacpp, argv: [llama-server, -m, g.gguf, --port, '{port}']}\n"
        "  - {name: draft, engine: llamacpp, argv: [llama-server, -md, g.gguf, --port, '{port}']}\n"
    )
    r = CliRunner().invoke(main, ["campaign", "check", str(plan)])
    assert r.exit_code == 0, r.output
    assert "warning: draft: -md without --spec-type" in r.output and "--spec-type draft-simple" in r.output


def test_check_rejects_an_unknown_metric_before_anything_runs(tmp_path: Path) -> None:
    plan = tmp_path / "p.yaml"
    plan.write_text("metric: tokens_per_watt\nconfigs:\n  - {name: a, argv: [x, --port, '{port}']}\n")
    r = CliRunner().invoke(main, ["campaign", "check", str(plan)])
    assert r.exit_code == 2
    assert "metric: unknown metric 'tokens_per_watt'; choose one of agg_tok_s" in r.output
