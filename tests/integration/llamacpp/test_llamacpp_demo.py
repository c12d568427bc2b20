"""`tokbench demo` end to end on the real engine, and the speculative accounting it rests on (issue 5):
ngram-simple drafts are accepted (L > 1) and speed up C=1 more than C=4, diagnosed as erosion; the model
drafting for itself is accepted almost always yet slower, diagnosed as step cost."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from llama_helpers import tokbench

from tokbench.report.export import read_result_json
from tokbench.server.install import EnginePaths
from tokbench.spec import diagnose

pytestmark = pytest.mark.llamacpp


@pytest.fixture(scope="module")
def demo_out(llama_engine: EnginePaths, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, float]:
    out = tmp_path_factory.mktemp("demo") / "out"
    t0 = time.monotonic()
    # the demo exactly as README command 1 runs it (128 output tokens, C=1,2,4, 3 interleaved trials)
    done = tokbench("demo", "--out", str(out), "--no-store", timeout_s=900)
    took = time.monotonic() - t0
    assert done.returncode == 0, (
        f"demo failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return out, done.stdout, took


def test_demo_prints_tables_verdicts_accounting_and_report(demo_out: tuple[Path, str, float]) -> None:
    out, stdout, _ = demo_out
    for name in ("baseline", "ngram", "draft-same-model"):
        assert name in stdout
        assert (out / "results" / f"{name}.json").is_file()
    assert stdout.count("Agg tok/s") >= 3, "one seed table per configuration"
    # a verdict table per tested configuration against the baseline; the same-model draft is slower at every
    # level by 35-45% on two cores, far beyond noise
    assert stdout.count("B ngram vs A baseline") == 1
    assert stdout.count("B draft-same-model vs A baseline") == 1
    draft_table = stdout[stdout.index("B draft-same-model vs A baseline") :].splitlines()[1:10]
    rows = {cells[0]: cells for ln in draft_table if (cells := ln.split()) and cells[0] in ("1", "2", "4")}
    assert sorted(rows) == ["1", "2", "4"] and all("slower" in cells for cells in rows.values()), rows
    assert "Speculative accounting" in stdout
    assert "step cost" in stdout
    assert "demo finished in" in stdout
    for f in ("report.html", "report.md", "checklist.md", "comparison.md"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
        assert str(out / f) in stdout or f in ("checklist.md", "comparison.md")
    html = (out / "report.html").read_text()
    assert "<svg" in html and "ngram" in html
    assert "ngram vs baseline" in (out / "report.md").read_text()


def test_ngram_speedup_erodes_with_concurrency(demo_out: tuple[Path, str, float]) -> None:
    out, _, _ = demo_out
    base = read_result_json(out / "results" / "baseline.json")
    ngram = read_result_json(out / "results" / "ngram.json")
    levels = {d.concurrency: d for d in diagnose(base, ngram)}
    assert sorted(levels) == [1, 2, 4]
    for d in levels.values():
        assert d.acceptance is not None and d.acceptance.engaged
        assert d.length is not None and d.length > 1.0, d
    s = {c: d.speedup for c, d in levels.items()}
    r = {c: d.step_cost for c, d in levels.items()}
    assert all(v is not None for v in (*s.values(), *r.values())), levels
    assert s[1] > 1.1, f"ngram-simple speeds up C=1: S = {s[1]:.2f}"
    # Erosion as the diagnosis defines it: S at C=4 falls more than 5% below its best at a lower level (on
    # two cores the peak is at C=1 or C=2, and C=1 vs C=2 alone is within noise), because each speculative
    # step costs more plain steps as the batch grows.
    peak = max(s[1], s[2])  # type: ignore[type-var]
    assert s[4] < peak * 0.95, f"and less at C=4: S {s[1]:.2f}, {s[2]:.2f} -> {s[4]:.2f}"
    assert r[4] > r[1], f"step cost grows with concurrency: r {r[1]:.2f} -> {r[4]:.2f}"
    assert "erosion" in levels[4].checks, [f.message for f in levels[4].findings]


def test_same_model_draft_is_accepted_yet_slower(demo_out: tuple[Path, str, float]) -> None:
    out, _, _ = demo_out
    base = read_result_json(out / "results" / "baseline.json")
    draft = read_result_json(out / "results" / "draft-same-model.json")
    levels = diagnose(base, draft)
    for d in levels:
        acc = d.acceptance
        assert acc is not None and acc.acceptance_rate is not None
        assert acc.acceptance_rate >= 0.9, f"C={d.concurrency}: the model agrees with itself"
        assert d.speedup is not None and d.speedup < 1.0, f"C={d.concurrency}: yet slower, S = {d.speedup}"
    assert "step_cost" in levels[0].checks, [f.message for f in levels[0].findings]
    comparison = json.loads((out / "comparison.json").read_text())
    assert "draft-same-model" in json.dumps(comparison)
