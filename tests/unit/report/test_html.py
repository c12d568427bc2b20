"""HTML report: every section and plot present, self-contained (nothing fetched), escaped, ids unique."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from html.parser import HTMLParser

import numpy as np
import pytest
from report_runs import make_run, vllm_scrape

from tokbench.records import RunResult, TrialResult, group_trials
from tokbench.report.html import html_report
from tokbench.stats.compare import compare_runs

SECTIONS = (
    "summary",
    "throughput",
    "tradeoff",
    "latency",
    "verdicts",
    "speculative",
    "config",
    "environment",
)


class Page(HTMLParser):
    """Which elements each <section> holds, every id, and every attribute that could load something."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.section: str | None = None
        self.tags: dict[str, Counter[str]] = {}
        self.drawn_paths: dict[str, int] = {}
        self.ids: Counter[str] = Counter()
        self.loads: list[tuple[str, str, str]] = []
        self.all_tags: Counter[str] = Counter()
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.all_tags[tag] += 1
        if tag == "section":
            self.section = a.get("id")
        if "id" in a:
            self.ids[a["id"]] += 1
        for k, v in a.items():
            if k in ("src", "srcset", "data") or (k in ("href", "xlink:href") and not v.startswith("#")):
                self.loads.append((tag, k, v))
        if self.section:
            self.tags.setdefault(self.section, Counter())[tag] += 1
            if tag == "path" and len(a.get("d", "")) > 20:
                self.drawn_paths[self.section] = self.drawn_paths.get(self.section, 0) + 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.section = None


@pytest.fixture(scope="module")
def page_text() -> str:
    base = make_run("base", levels=(1, 2, 4, 8))
    spec = make_run("ngram", levels=(1, 2, 4, 8), speed=1.08, seed=1, server={"engine": "llamacpp", "x": 1})
    per_position = {"ngram": {1: [0.8, 0.6, 0.4], 8: [0.7, 0.5, 0.3]}}
    verdicts = {"ngram vs base": compare_runs(base, spec, rng=np.random.default_rng(0))}
    return html_report([base, spec], verdicts, spec=per_position)


def test_every_section_and_plot_is_there(page_text: str) -> None:
    page = Page(page_text)
    assert set(SECTIONS) <= set(page.tags)
    for section in ("throughput", "tradeoff", "latency", "speculative"):
        assert page.tags[section]["svg"] == 1, section
        assert page.drawn_paths.get(section, 0) >= 4, section  # lines, boxes, markers with real path data
    assert page.tags["summary"]["table"] == 2
    assert page.tags["verdicts"]["tr"] == 1 + 4  # header + one row per level
    assert 'class="verdict verdict-faster">faster<' in page_text


def test_ci_bands_are_drawn_only_with_several_trials(page_text: str) -> None:
    throughput = page_text[page_text.index('id="throughput"') : page_text.index('id="tradeoff"')]
    assert throughput.count("fill-opacity: 0.2") >= 2  # one band per run
    single = html_report([make_run("once", trials=1)])
    one = single[single.index('id="throughput"') : single.index('id="tradeoff"')]
    assert "fill-opacity: 0.2" not in one and "<svg" in one


def test_self_contained_and_ids_unique(page_text: str) -> None:
    page = Page(page_text)
    assert page.loads == []
    assert page.all_tags["script"] == 0 and page.all_tags["link"] == 0 and page.all_tags["img"] == 0
    assert "default-src 'none'" in page_text
    dupes = [i for i, n in page.ids.items() if n > 1]
    assert dupes == []


def test_user_text_is_escaped() -> None:
    evil = make_run("<script>alert(1)</script>", levels=(1,), trials=1)
    evil = replace(evil, meta=replace(evil.meta, environment={"host": "<img src=x onerror=alert(2)>"}))
    text = html_report([evil])
    page = Page(text)
    assert page.all_tags["script"] == 0 and page.all_tags["img"] == 0
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;img src=x onerror=alert(2)&gt;" in text


def test_config_diff_and_environment(page_text: str) -> None:
    config = page_text[page_text.index('id="config"') : page_text.index('id="environment"')]
    assert ">server.x<" in config and ">server.argv<" in config
    assert ">server.engine<" not in config  # same in both runs
    env = page_text[page_text.index('id="environment"') :]
    assert ">python<" in env and ">3.11.7<" in env
    assert '<tr class="differs"><td class="key">run_id' not in env


def test_speculative_acceptance_computed_from_scrapes() -> None:
    run = make_run("eagle", levels=(1,), trials=1)
    t = replace(
        run.levels[0].trials[0],
        metrics_before=vllm_scrape(0, 0, 0, (0, 0), 0),
        metrics_after=vllm_scrape(200, 400, 300, (180, 120), 2000),
    )
    text = html_report([RunResult(run.meta, group_trials([t]))])
    section = text[text.index('id="speculative"') : text.index('id="config"')]
    assert "<svg" in section
    assert ">0.90 0.60<" in section and ">75.0%<" in section  # 180/200, 120/200; 300/400


def test_summary_only_import_has_no_latency_plot() -> None:
    imported = TrialResult(
        concurrency=4, trial=0, order=0, started_at=0.0, start_ns=0, end_ns=0,
        imported={"agg_tok_s": 321.0, "per_req_tok_s": 80.0, "tokens": 400, "wall_s": 1.2, "ok": 8},
    )  # fmt: skip
    run = RunResult(replace(make_run("seed").meta, source="import:seed.md"), group_trials([imported]))
    text = html_report([run])
    page = Page(text)
    assert page.tags["throughput"]["svg"] == 1
    assert "svg" not in page.tags["latency"]
    assert "No per-request latency data" in text
    assert ">import:seed.md<" in text
