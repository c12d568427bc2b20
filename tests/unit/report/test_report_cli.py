"""`tokbench runs ls|show|import`, `tokbench report` and `tokbench export` through the real CLI group."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_runs import make_run

from tokbench.cli import main
from tokbench.report.export import result_to_json, write_result_json
from tokbench.store import Store


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "base.json", tmp_path / "ngram.json"
    write_result_json(make_run("base"), a)
    write_result_json(make_run("ngram", speed=1.08, seed=1), b)
    return a, b


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_runs_ls_on_a_fresh_machine_says_so(tmp_path: Path) -> None:
    code, out, _ = run("runs", "ls", "--db", str(tmp_path / "none.db"))
    assert code == 0 and "no runs stored yet" in out
    assert not (tmp_path / "none.db").exists()


def test_import_ls_show(tmp_path: Path, files: tuple[Path, Path]) -> None:
    db = str(tmp_path / "t.db")
    code, out, _ = run("runs", "import", *map(str, files), "--db", db)
    assert code == 0 and "stored as run run-base" in out and "stored as run run-ngram" in out
    code, out, _ = run("runs", "ls", "--db", db, "--label", "ngram")
    assert code == 0 and "run-ngram" in out and "run-base" not in out
    assert "42" in out  # 3 trials x (2+4+8) requests
    code, out, _ = run("runs", "show", "run-ng", "--db", db)
    assert code == 0 and "run-ngram" in out and "Agg tok/s" in out
    code, _, err = run("runs", "ls", "--db", db, "--since", "yesterday")
    assert code == 2 and "--since: 'yesterday' is not a date" in err
    code, _, err = run("runs", "show", "zzz", "--db", db)
    assert code == 5 and "no run 'zzz'" in err


def test_import_refuses_a_bad_file_before_storing_any(tmp_path: Path, files: tuple[Path, Path]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    db = tmp_path / "t.db"
    code, _, err = run("runs", "import", str(files[0]), str(bad), "--db", str(db))
    assert code == 5 and "bad.json: missing key 'schema_version'" in err
    with Store(db) as store:
        assert store.list_runs() == []


def test_report_takes_files_and_ids_and_judges_against_the_first(
    tmp_path: Path, files: tuple[Path, Path]
) -> None:
    db = tmp_path / "t.db"
    with Store(db) as store:
        store.save_run(make_run("stored", speed=0.9, seed=3))
    code, out, _ = run("report", str(files[0]), "run-stored", str(files[1]), "--db", str(db))
    assert code == 0
    assert "**stored vs base**" in out and "**ngram vs base**" in out
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    code, _, err = run("report", str(files[0]), str(files[1]), "--html", str(html), "--md", str(md))
    assert code == 0 and f"wrote {html}" in err
    assert html.read_text().count("<svg") == 3  # throughput, trade-off, latency (no speculative data)
    assert "**ngram vs base**" in md.read_text()


def test_report_with_the_same_label_twice_tells_runs_apart(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_result_json(make_run("same"), a)
    other = make_run("same", seed=4)
    write_result_json(replace(other, meta=replace(other.meta, run_id="run-other")), b)
    code, out, _ = run("report", str(a), str(b))
    assert code == 0 and "**run-other vs run-same**" in out
    code, out, _ = run("report", str(a), str(a))
    assert code == 0 and "**run-same #2 vs run-same #1**" in out


@pytest.mark.parametrize("fmt", ["json", "vllm", "csv", "csv-trials"])
def test_export_formats(tmp_path: Path, files: tuple[Path, Path], fmt: str) -> None:
    out = tmp_path / f"out.{fmt}"
    code, _, err = run("export", str(files[0]), "--format", fmt, "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    if fmt == "json":
        assert json.loads(text) == result_to_json(make_run("base"))
    elif fmt == "vllm":
        objs = [json.loads(line) for line in text.splitlines()]
        assert [o["max_concurrency"] for o in objs] == [1, 1, 1, 2, 2, 2, 4, 4, 4]
    elif fmt == "csv":
        assert len(list(csv.DictReader(io.StringIO(text)))) == 42
    else:
        assert len(list(csv.DictReader(io.StringIO(text)))) == 9


def test_export_of_an_unknown_run_fails_cleanly(tmp_path: Path) -> None:
    code, _, err = run("export", "nope", "--format", "csv", "--out", str(tmp_path / "x.csv"),
                       "--db", str(tmp_path / "none.db"))  # fmt: skip
    assert code == 5 and "'nope' is neither a result file nor a run id" in err
