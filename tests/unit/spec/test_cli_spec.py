"""`tokbench spec` and `tokbench spec-model` end to end on result files (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from spec_fakes import throughput_run

from tokbench.cli import main
from tokbench.records import run_to_dict
from tokbench.spec.model import predicted_speedup, step_cost

META = {
    "meta_info": {
        "completion_tokens": 100,
        "spec_verify_ct": 40,
        "spec_num_correct_drafts": 60,
        "spec_num_proposed_drafts": 120,
    }
}


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    base = throughput_run({1: 100.0, 4: 300.0}, label="base")
    spec = throughput_run({1: 180.0, 4: 310.0}, label="spec", extras=META)
    pa, pb = tmp_path / "base.json", tmp_path / "spec.json"
    pa.write_text(json.dumps(run_to_dict(base)))
    pb.write_text(json.dumps(run_to_dict(spec)))
    return str(pa), str(pb)


def test_spec_prints_accounting_diagnosis_and_lossless(pair: tuple[str, str]) -> None:
    res = CliRunner().invoke(main, ["spec", *pair])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Speculative accounting" in out
    assert "meta_info:sglang" in out
    assert "C=1: speculation pays: S = 1.80" in out
    assert "C=4: step cost too high: S = 1.03 keeps 2% of the gain" in out
    assert "C=4: speedup eroding as concurrency grows: S 1.80 at C=1 → 1.03 at C=4" in out
    assert "Lossless check" in out


def test_spec_json_carries_every_figure(pair: tuple[str, str]) -> None:
    res = CliRunner().invoke(main, ["spec", *pair, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    lv1, lv4 = doc["levels"]
    assert lv1["speedup"] == pytest.approx(1.8, rel=0.01)
    assert lv1["acceptance"]["accepted"] == 60 * 2  # one request per trial, two trials
    assert lv1["step_cost"] == pytest.approx(lv1["length"] / lv1["speedup"])
    assert [f["check"] for f in lv4["findings"]] == ["erosion", "step_cost"]
    assert doc["lossless"]["pairs"] == 0 and doc["lossless"]["skipped"] > 0  # no output text in these records


def test_spec_model_prints_the_model_per_concurrency() -> None:
    res = CliRunner().invoke(
        main, ["spec-model", "--accept", "0.8,0.6,0.4", "--c", "0.05", "--knee", "16", "-c", "1,4,16,32,64"]
    )
    assert res.exit_code == 0, res.output
    assert "L = 2.800" in res.output
    rows = {
        int(line.split()[0]): line.split() for line in res.output.splitlines() if line.strip()[:1].isdigit()
    }
    assert set(rows) == {1, 4, 16, 32, 64}
    for c, cols in rows.items():
        assert float(cols[2]) == pytest.approx(step_cost(3, 0.05, 16, c), abs=0.005)
        assert float(cols[3]) == pytest.approx(predicted_speedup((0.8, 0.6, 0.4), 3, 0.05, 16, c), abs=0.005)


def test_spec_model_alpha_needs_k_and_exactly_one_acceptance_source() -> None:
    r = CliRunner().invoke(main, ["spec-model", "--alpha", "0.7"])
    assert r.exit_code == 2 and "--k" in r.output
    r = CliRunner().invoke(main, ["spec-model", "--alpha", "0.7", "--accept", "0.5"])
    assert r.exit_code == 2 and "exactly one" in r.output
    r = CliRunner().invoke(main, ["spec-model", "--accept", "0.8,x"])
    assert r.exit_code == 2 and "--accept" in r.output
    r = CliRunner().invoke(main, ["spec-model", "--alpha", "0.7", "--k", "3"])
    assert r.exit_code == 0 and "L = 2.533" in r.output


def test_spec_model_fit_reports_draft_cost_knee_and_residuals(pair: tuple[str, str]) -> None:
    r = CliRunner().invoke(main, ["spec-model", "--fit", "--baseline", pair[0], "--spec", pair[1]])
    assert r.exit_code == 0, r.output
    # k is inferred from the runs: 120 proposed drafts / 40 verify steps = 3.
    assert "(k = 3)" in r.output
    assert "implied draft cost c =" in r.output and "knee =" in r.output
    assert "Speedup: measured vs model" in r.output
    r = CliRunner().invoke(main, ["spec-model", "--fit", "--baseline", pair[0]])
    assert r.exit_code == 2 and "--spec" in r.output
