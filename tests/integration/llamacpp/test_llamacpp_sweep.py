"""`tokbench sweep` against the real llama-server: the seed table's figures agree with what the engine itself
reports, and speculative counters are read from /metrics and per-request timings."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from llama_helpers import running_llama, tagged_processes, tokbench

from tokbench.records import RunResult, run_from_dict
from tokbench.server.install import EnginePaths
from tokbench.server.launch import ServerProcess
from tokbench.spec import level_acceptance, trial_acceptance

pytestmark = pytest.mark.llamacpp


def sweep(base_url: str, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = tokbench("sweep", "--base-url", base_url, "--out", str(out), "--no-store", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    return done, json.loads(out.read_text())


def test_sweep_figures_agree_with_the_engine(baseline_server: ServerProcess, tmp_path: Path) -> None:
    max_tokens = 32
    url = baseline_server.base_url
    done, data = sweep(url, tmp_path / "run.json", "-c", "1,4", "--max-tokens", str(max_tokens))
    assert "Agg tok/s" in done.stdout and "Per-req tok/s" in done.stdout

    levels = {lv["concurrency"]: lv for lv in data["levels"]}
    assert sorted(levels) == [1, 4]
    run: RunResult = run_from_dict(data)
    for c, requests in ((1, 4), (4, 8)):
        (trial,) = levels[c]["trials"]
        assert trial["ok"] == requests, trial
        assert not any(trial["errors"].values()) if isinstance(trial["errors"], dict) else not trial["errors"]
        # ignore_eos: every request generates exactly max_tokens, as the engine's own counters say
        assert trial["tokens"] == requests * max_tokens
        measured = run.level(c).trials[0].measured  # type: ignore[union-attr]
        for r in measured:
            timings = r.extras.get("timings")
            assert timings, "llama-server's per-request timings are kept raw"
            assert timings["predicted_n"] == r.completion_tokens == max_tokens
        # Agg tok/s is tokens / wall, by definition
        assert trial["agg_tok_s"] == pytest.approx(trial["tokens"] / trial["wall_s"], rel=1e-3)
        # a 270M model on CPU: slower than 2000 tok/s, faster than 1 tok/s even on a loaded machine
        assert 1.0 < trial["agg_tok_s"] < 2000.0
        assert 0.5 < trial["per_req_tok_s"] < 2000.0
        # the engine's own decode time bounds the client's view: a request cannot end before its tokens
        engine_rates = [max_tokens / (r.extras["timings"]["predicted_ms"] / 1e3) for r in measured]
        assert trial["per_req_tok_s"] <= sum(engine_rates) / len(engine_rates) * 1.05
    # four requests decoded together beat one at a time (continuous batching), by aggregate
    agg1 = levels[1]["trials"][0]["agg_tok_s"]
    agg4 = levels[4]["trials"][0]["agg_tok_s"]
    assert agg4 > agg1


def test_ngram_counters_are_read(llama_engine: EnginePaths, tmp_path: Path) -> None:
    with running_llama(llama_engine, tmp_path, "--spec-type", "ngram-simple", name="ngram") as server:
        # the leftover-process check can see this server (so it would see it left running)
        assert server.pid in {pid for pid, _ in tagged_processes()}
        out = tmp_path / "ngram.json"
        _, data = sweep(server.base_url, out, "-c", "1", "--requests", "2", "--max-tokens", "128")
    run = run_from_dict(data)
    level = run.level(1)
    assert level is not None
    (trial,) = level.trials
    assert trial.metrics_before and trial.metrics_after, "/metrics was scraped around the window"
    from_counters = trial_acceptance(trial)
    assert from_counters is not None and from_counters.engaged
    acc = level_acceptance(level)
    assert acc is not None and acc.drafts > 0 and acc.draft_tokens > 0
    assert acc.length is not None and acc.length > 1.0, acc
    # the per-request timings tell the same story as the counters
    drafted = sum(r.extras["timings"].get("draft_n", 0) for r in trial.measured)
    accepted = sum(r.extras["timings"].get("draft_n_accepted", 0) for r in trial.measured)
    assert drafted > 0 and 0 < accepted <= drafted
