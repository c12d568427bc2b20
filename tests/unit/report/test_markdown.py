"""Markdown report: golden render, and the figures in it checked against the records they come from."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
from report_runs import make_run, make_trial, vllm_scrape

from tokbench.records import RunResult, group_trials
from tokbench.report.markdown import markdown_report
from tokbench.stats.compare import compare_runs
from tokbench.stats.summary import trial_figures

GOLDEN = Path(__file__).parent / "golden" / "report.md"
T_975_DF2 = 4.302652729911275  # Student t quantile, 97.5%, 2 degrees of freedom (3 trials)


def two_runs() -> tuple[RunResult, RunResult]:
    base = make_run("base")
    spec = make_run(
        "ngram",
        speed=1.08,
        seed=1,
        server={"engine": "llamacpp", "argv": ["llama-server", "--spec-type", "ngram-simple"]},
    )
    return base, spec


def rows_of(md: str, first_cell: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in md.splitlines()
        if line.startswith(f"| {first_cell} |")
    ]


def test_golden_render() -> None:
    base, spec = two_runs()
    verdicts = {"ngram vs base": compare_runs(base, spec, rng=np.random.default_rng(0))}
    per_position = {"ngram": {1: [0.81, 0.62, 0.4], 4: [0.7, 0.45, 0.25]}}
    md = markdown_report([base, spec], verdicts, spec=per_position)
    if os.environ.get("TOKBENCH_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(md)
    assert md == GOLDEN.read_text()


def test_seed_cells_are_mean_and_t_interval_of_the_trials() -> None:
    base, _ = two_runs()
    md = markdown_report([base])
    level = base.level(4)
    assert level is not None
    aggs = [trial_figures(t).agg_tok_s for t in level.trials]
    mean = statistics.mean(aggs)
    half = T_975_DF2 * statistics.stdev(aggs) / math.sqrt(3)
    [row] = rows_of(md, "4")
    assert row[1] == "3"  # K
    assert row[2] == f"{mean:.1f} ± {half:.1f}"
    tokens = [sum(r.output_tokens for r in t.records) for t in level.trials]
    assert row[4] == f"{statistics.mean(tokens):.0f}"
    assert row[6] == str(sum(len(t.records) for t in level.trials))
    assert "Configuration differences" not in md  # one run: nothing to diff


def test_one_trial_shows_no_interval_and_errors_and_incomplete_are_said() -> None:
    t = make_trial(2, 0, 0, errors=2)
    run = make_run("one", levels=(2,), trials=1)
    run = RunResult(replace(run.meta, complete=False), group_trials([replace(t, interrupted=True)]))
    md = markdown_report([run])
    [row] = rows_of(md, "2")
    assert "±" not in row[2]
    assert row[6] == "4/6"
    assert row[9] == "interrupted, http_status ×2"
    assert "**incomplete run**" in md
    assert "K trials per level" not in md


def test_verdict_rows_follow_compare() -> None:
    base, spec = two_runs()
    vs = compare_runs(base, spec, rng=np.random.default_rng(0))
    md = markdown_report([base, spec], {"ngram vs base": vs})
    assert "**ngram vs base**" in md
    for v in vs:
        [row] = [r for r in rows_of(md, str(v.concurrency)) if len(r) == 7]
        assert row[3] == f"{v.delta_pct:+.1f}%"
        assert row[4] == f"[{v.ci_low_pct:+.1f}%, {v.ci_high_pct:+.1f}%]"
        assert row[5] == v.verdict.replace("_", " ")


def test_speculative_section_is_computed_from_scrapes_when_not_given() -> None:
    before = vllm_scrape(1000, 3000, 1500, (800, 500, 200), 50_000)
    after = vllm_scrape(1100, 3300, 1650, (880, 550, 220), 51_000)
    run = make_run("eagle", levels=(1,), trials=1)
    t = replace(run.levels[0].trials[0], metrics_before=before, metrics_after=after)
    run = RunResult(run.meta, group_trials([t]))
    md = markdown_report([run])
    assert "### Speculative decoding" in md
    [row] = [r for r in rows_of(md, "1") if len(r) == 6]
    # deltas: 100 drafts, 300 draft tokens, 150 accepted, 1000 tokens -> 850 target steps
    assert row[1] == f"{1000 / 850:.2f}"
    assert row[2] == "50.0%"
    assert row[4] == "0.80 0.50 0.20"
    assert row[5] == "prometheus:vllm"
    assert "### Speculative decoding" not in markdown_report([make_run("plain")])


def test_config_diff_lists_only_what_differs() -> None:
    base, spec = two_runs()
    md = markdown_report([base, spec])
    diff = md[md.index("### Configuration differences") :]
    assert "| server.argv |" in diff
    assert "server.engine" not in diff and "load.max_tokens" not in diff
    same = markdown_report([base, replace(spec, meta=replace(spec.meta, server=base.meta.server))])
    assert "Resolved server configuration and load settings are identical." in same

    # Per-launch facts are not configuration: a new port, seed, media marker or launch list is no difference,
    # a changed resolved setting is
    def launched(port: int, marker: str, n_ctx: int) -> dict[str, object]:
        return {**base.meta.server, "name": f"cfg{port}", "launches": [{"base_url": f"http://h:{port}"}],
                "resolved": {"props": {"media_marker": marker, "n_ctx": n_ctx}, "port": port}}  # fmt: skip

    a = replace(
        base, meta=replace(base.meta, server=launched(1, "<m1>", 4096), load={"label": "a", "seed": 1})
    )
    b = replace(
        base, meta=replace(base.meta, server=launched(2, "<m2>", 8192), load={"label": "b", "seed": 2})
    )
    diff = markdown_report([a, b])
    diff = diff[diff.index("### Configuration differences") :]
    assert "server.resolved.props.n_ctx" in diff and "load.seed" in diff
    for fact in ("media_marker", "server.resolved.port", "launches", "server.name", "load.label"):
        assert fact not in diff, fact


def test_table_cells_cannot_break_the_table() -> None:
    base, spec = two_runs()
    spec = replace(spec, meta=replace(spec.meta, server={"engine": "a|b"}))
    md = markdown_report([base, spec])
    assert "a\\|b" in md
