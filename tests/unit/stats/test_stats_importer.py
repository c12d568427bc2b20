"""Summary tables from other tools: the seed's own two tables, markdown, CSV, several trials, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokbench.errors import ConfigError
from tokbench.report.export import read_result_json, write_result_json
from tokbench.stats.compare import compare_runs
from tokbench.stats.importer import import_summary, parse_tables
from tokbench.stats.summary import trial_figures

# The NEXTN run exactly as the seed printed it, with the prose around it.
SEED_NEXTN = """\
It contains the output of a parallel throughput benchmark:

   C |  Agg tok/s |  Per-req tok/s |   Tokens |  Wall(s) |   Ok
-----------------------------------------------------------------
   1 |      172.1 |          176.1 |     4000 |     23.2 |    4
   4 |      541.9 |          159.4 |     7245 |     13.4 |    8
  16 |     1686.1 |          119.5 |    29567 |     17.5 |   32
  32 |     2162.3 |           82.1 |    52593 |     24.3 |   64

These numbers tell a devastating story for speculative decoding.
"""

# The baseline: the seed quotes only its aggregate figures (172.2 at C=1 ... 2156.4 at C=32).
SEED_BASELINE = """\
| C | Agg tok/s |
|---|-----------|
| 1 | 172.2 |
| 4 | 542.2 |
| 16 | 1646.7 |
| 32 | 2156.4 |
"""


def test_seed_table_parses_exactly() -> None:
    run = import_summary(SEED_NEXTN, source="seed.txt", label="nextn", started_at="2026-01-01T00:00:00+00:00")
    assert [lv.concurrency for lv in run.levels] == [1, 4, 16, 32]
    f = trial_figures(run.levels[1].trials[0])
    assert (f.agg_tok_s, f.per_req_tok_s, f.tokens, f.wall_s, f.ok) == (541.9, 159.4, 7245, 13.4, 8)
    assert run.meta.source == "import:seed.txt" and run.meta.label == "nextn"
    assert all(len(lv.trials) == 1 and lv.trials[0].records == () for lv in run.levels)


def test_seed_comparison_is_insufficient_data_at_every_level() -> None:
    base = import_summary(SEED_BASELINE, source="b.md", label="baseline", started_at="")
    nextn = import_summary(SEED_NEXTN, source="n.md", label="nextn", started_at="")
    verdicts = compare_runs(base, nextn)
    assert [v.verdict for v in verdicts] == ["insufficient_data"] * 4
    # The point changes are still reported, for what one run each is worth: C=16 is the seed's "+2.4%".
    deltas = [round(v.delta_pct, 1) for v in verdicts if v.delta_pct is not None]
    assert deltas == [-0.1, -0.1, 2.4, 0.3]
    assert all(v.ci_low_pct is None for v in verdicts)


def _tables(rows: list[tuple[float, float]]) -> str:
    return "\n\n".join(f"| C | Agg tok/s |\n|---|---|\n| 1 | {a} |\n| 4 | {b} |" for a, b in rows)


def test_several_tables_are_several_trials_and_then_a_verdict() -> None:
    a = import_summary(_tables([(100, 400), (101, 404), (99, 398)]), source="a.md", label="a", started_at="")
    b = import_summary(_tables([(120, 480), (121, 482), (119, 479)]), source="b.md", label="b", started_at="")
    assert [len(lv.trials) for lv in a.levels] == [3, 3]
    assert [t.trial for t in a.levels[0].trials] == [0, 1, 2]
    assert [v.verdict for v in compare_runs(a, b)] == ["faster", "faster"]


def test_csv_with_blank_line_separated_trials_and_snake_case_names() -> None:
    header = "concurrency,agg_tok_s,per_req_tok_s,tokens,wall_s,ok\n"
    text = header + "1,172.1,176.1,4000,23.2,4\n4,541.9,159.4,7245,13.4,8\n\n"
    text += header + "1,171.0,175.0,4000,23.4,4\n4,540.0,158.0,7245,13.5,8\n"
    tables = parse_tables(text, "r.csv")
    assert len(tables) == 2
    expected = {"agg_tok_s": 540.0, "per_req_tok_s": 158.0, "tokens": 7245, "wall_s": 13.5, "ok": 8}
    assert tables[1][4] == expected


def test_csv_trial_column() -> None:
    text = "C,trial,Agg tok/s\n1,0,100\n1,1,102\n4,0,400\n4,1,404\n"
    tables = parse_tables(text, "r.csv")
    assert tables == [{1: {"agg_tok_s": 100.0}, 4: {"agg_tok_s": 400.0}},
                      {1: {"agg_tok_s": 102.0}, 4: {"agg_tok_s": 404.0}}]  # fmt: skip


def test_ok_as_fraction_and_thousands_separators() -> None:
    (table,) = parse_tables("| C | Agg tok/s | Ok |\n|--|--|--|\n| 32 | 2,162.3 | 63/64 |\n", "x.md")
    assert table[32] == {"agg_tok_s": 2162.3, "ok": 63.0}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("no table here, just words\n", "no results table found"),
        (
            "| C | Agg tok/s |\n|---|---|\n| 1 | fast |\n",
            r"x\.md:3: column 'agg_tok_s': 'fast' is not a number",
        ),
        ("| C | Agg tok/s |\n|---|---|\n| 1 | 10 |\n| 1 | 11 |\n", "C=1 appears twice"),
        ("| C | Agg tok/s |\n|---|---|\n| 1 | 10 | 3 |\n", "3 cells but the header has 2 columns"),
        ("| C | Agg tok/s |\n|---|---|\n| 1.5 | 10 |\n", "positive integer"),
        ("C,Agg tok/s\n1,\n", "no Agg tok/s value for C=1"),
    ],
)
def test_bad_tables_name_the_line_and_the_fix(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_tables(text, "x.md")


def test_imported_run_round_trips_through_a_result_file(tmp_path: Path) -> None:
    run = import_summary(SEED_NEXTN, source="seed.txt", label="nextn", started_at="2026-01-01T00:00:00+00:00")
    path = tmp_path / "nextn.json"
    write_result_json(run, path)
    back = read_result_json(path)
    assert back.meta.source == "import:seed.txt"
    assert [trial_figures(lv.trials[0]).agg_tok_s for lv in back.levels] == [172.1, 541.9, 1686.1, 2162.3]
