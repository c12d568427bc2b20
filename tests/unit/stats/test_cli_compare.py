"""The compare, import and calibrate commands through click, on result files (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from stats_fakes import run_of, speed_trial

from tokbench.cli import main
from tokbench.report.export import write_result_json

NEXTN = """\
   C |  Agg tok/s |  Per-req tok/s |   Tokens |  Wall(s) |   Ok
-----------------------------------------------------------------
   1 |      172.1 |          176.1 |     4000 |     23.2 |    4
   4 |      541.9 |          159.4 |     7245 |     13.4 |    8
  16 |     1686.1 |          119.5 |    29567 |     17.5 |   32
  32 |     2162.3 |           82.1 |    52593 |     24.3 |   64
"""
BASELINE = "| C | Agg tok/s |\n|---|---|\n| 1 | 172.2 |\n| 4 | 542.2 |\n| 16 | 1646.7 |\n| 32 | 2156.4 |\n"


def _files(tmp_path: Path, a_speed: float, b_speed: float) -> tuple[Path, Path]:
    speeds = (1.0, 1.01, 0.99)
    a = run_of([speed_trial(c, k, a_speed * s) for c in (1, 4) for k, s in enumerate(speeds)], "base")
    b = run_of([speed_trial(c, k, b_speed * s) for c in (1, 4) for k, s in enumerate(speeds)], "new")
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    write_result_json(a, pa)
    write_result_json(b, pb)
    return pa, pb


def test_import_the_seed_tables_then_compare(tmp_path: Path) -> None:
    (tmp_path / "nextn.md").write_text(NEXTN)
    (tmp_path / "base.md").write_text(BASELINE)
    runner = CliRunner()
    r = runner.invoke(main, ["import", str(tmp_path / "nextn.md"), "--out", str(tmp_path / "nextn.json")])
    assert r.exit_code == 0, r.output
    assert "7245" in r.output and "1 trial(s) per level" in r.output
    r = runner.invoke(main, ["import", str(tmp_path / "base.md"), "--label", "baseline"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "base.result.json").is_file()

    r = runner.invoke(
        main, ["compare", str(tmp_path / "base.result.json"), str(tmp_path / "nextn.json"), "--json"]
    )
    assert r.exit_code == 0, r.output
    verdicts = json.loads(r.stdout)
    assert "A (baseline) is an imported summary table" in r.stderr  # run warnings beside the JSON, not in it
    assert [v["concurrency"] for v in verdicts] == [1, 4, 16, 32]
    assert {v["verdict"] for v in verdicts} == {"insufficient_data"}
    assert round(verdicts[2]["delta_pct"], 1) == 2.4

    r = runner.invoke(main, ["compare", str(tmp_path / "base.result.json"), str(tmp_path / "nextn.json")])
    assert r.exit_code == 0, r.output
    assert r.output.count("insufficient data") == 4
    assert "one run each cannot tell a change from run-to-run noise" in r.output


def test_compare_prints_verdicts_for_result_files(tmp_path: Path) -> None:
    pa, pb = _files(tmp_path, 1.0, 1.1)
    r = CliRunner().invoke(main, ["compare", str(pa), str(pb)])
    assert r.exit_code == 0, r.output
    assert r.output.count("faster") == 2
    assert "B new vs A base" in r.output
    r = CliRunner().invoke(main, ["compare", str(pa), str(pb), "--metric", "e2e_p50", "--json"])
    assert r.exit_code == 0, r.output
    assert [v["verdict"] for v in json.loads(r.stdout)] == ["faster", "faster"]
    assert all(v["delta_pct"] < 0 for v in json.loads(r.stdout))


def test_compare_errors_name_the_problem(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["compare", str(tmp_path / "missing.json"), str(tmp_path / "other.json")])
    assert r.exit_code == 5 and "missing.json" in r.output
    pa, pb = _files(tmp_path, 1.0, 1.0)
    r = CliRunner().invoke(main, ["compare", str(pa), str(pb), "--margin", "-3"])
    assert r.exit_code == 2 and "--margin" in r.output


def test_calibrate_from_an_earlier_aa_run(tmp_path: Path) -> None:
    pa, _ = _files(tmp_path, 1.0, 1.0)
    r = CliRunner().invoke(main, ["calibrate", "--from", str(pa), "--detect", "3"])
    assert r.exit_code == 0, r.output
    assert "A/A calibration of agg_tok_s" in r.output and "K for 3%" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--from", str(pa), "--detect", "0.5", "--margin", "5"])
    assert r.exit_code == 0, r.output
    assert "(compare margin ±5%)" in r.output and "never" in r.output  # 0.5% inside ±5%: no_difference
    r = CliRunner().invoke(main, ["calibrate"])
    assert r.exit_code == 2 and "--base-url" in r.output
    r = CliRunner().invoke(main, ["calibrate", "--from", str(pa), "--margin", "-1"])
    assert r.exit_code == 2 and "--margin" in r.output


def test_import_without_a_table_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("we ran it and it was fast\n")
    r = CliRunner().invoke(main, ["import", str(tmp_path / "notes.md")])
    assert r.exit_code == 2 and "no results table found" in r.output


def test_compare_run_ids_from_the_store_records_the_verdicts(tmp_path: Path) -> None:
    from tokbench.store import Store

    speeds = (1.0, 1.01, 0.99)
    a = run_of([speed_trial(4, k, s) for k, s in enumerate(speeds)], "base")
    b = run_of([speed_trial(4, k, 1.1 * s) for k, s in enumerate(speeds)], "new")
    db = tmp_path / "t.db"
    with Store(db) as store:
        id_a, id_b = store.save_run(a), store.save_run(b)
    r = CliRunner().invoke(main, ["compare", id_a, id_b, "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    assert [v["verdict"] for v in json.loads(r.stdout)] == ["faster"]
    with Store(db) as store:
        saved = store.verdicts()
    assert [(v["concurrency"], v["verdict"], v["metric"]) for v in saved] == [(4, "faster", "agg_tok_s")]
