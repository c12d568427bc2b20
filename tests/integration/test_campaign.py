"""Campaigns against real reference-server processes (`python -m tokbench.testing`): interleaved A/B with
results, comparison and checklist; a configuration that dies with an AssertionError at start; a server that
dies mid-level (one restart, only that cell re-run); the blocked design's closing run; Ctrl-C. Every test
checks that no process it launched is left behind.
"""

from __future__ import annotations

import io
import json
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from campaign_procs import assert_none_left
from rich.console import Console

from tokbench.campaign import run_campaign
from tokbench.config import plan_from_dict
from tokbench.server.diagnose import Triage
from tokbench.store import Store

SWEEP = {"concurrencies": [1, 2], "requests": 3, "max_tokens": 8, "warmup": 1, "same_prompts": True}


@pytest.fixture
def token() -> Iterator[str]:
    t = f"tokbench-camp-{uuid.uuid4().hex[:12]}"
    yield t
    assert_none_left(t)


def ref(token: str, *extra: str) -> list[str]:
    """The reference server's command line; `token` as its model name marks its processes (leak check)."""
    return [sys.executable, "-m", "tokbench.testing", "--port", "{port}", "--model", token, "--speed", "40",
            *extra]  # fmt: skip


def plan(configs: list[dict[str, Any]], **kw: Any) -> Any:
    return plan_from_dict({"configs": configs, "sweep": {**SWEEP, **kw.pop("sweep", {})}, **kw})


def test_interleaved_two_configurations(tmp_path: Path, token: str) -> None:
    events: list[str] = []
    p = plan(
        [
            {"name": "base", "engine": "sglang", "argv": ref(token, "--personality", "sglang"),
             "ready_marker": "The server is fired up and ready to roll!"},
            {"name": "spec", "engine": "sglang",
             "argv": ref(token, "--personality", "sglang", "--spec-accept", "0.8,0.5",
                         "--spec-step-cost", "1.2"),
             "ready_marker": "The server is fired up and ready to roll!"},
        ],
        trials=2,
    )  # fmt: skip
    with Store(tmp_path / "tokbench.db") as store:
        result = run_campaign(p, tmp_path / "out", store=store, on_event=events.append)
        stored = {m.label: m for m in store.list_runs()}
        assert set(stored) == {"base", "spec"} and all(m.complete for m in stored.values())
        assert len(store.verdicts()) == 2  # one per level, spec vs base
        out = tmp_path / "out"
        for name, m in stored.items():
            # the store holds what the result file holds: the model and load known once the server is up,
            # and every launch (one per round) rather than the first
            data = json.loads((out / "results" / f"{name}.json").read_text())
            kept = store.load_run(m.run_id).meta
            assert kept.model == data["meta"]["model"] == token
            assert kept.load == data["meta"]["load"] and kept.load["max_tokens"] == SWEEP["max_tokens"]
            assert kept.server["launches"] == data["meta"]["server"]["launches"]
            assert len(kept.server["launches"]) == 2

    # results per configuration: every (level, trial) once, nothing failed
    assert set(result.runs) == {"base", "spec"} and not result.failures
    for name in ("base", "spec"):
        data = json.loads((out / "results" / f"{name}.json").read_text())
        assert [(lv["concurrency"], len(lv["trials"])) for lv in data["levels"]] == [(1, 2), (2, 2)]
        assert data["meta"]["server"]["engine"] == "sglang"
        assert data["meta"]["server"]["resolved"]["server_info"]["model_path"] == token
    assert sorted(f.name for f in (out / "logs").iterdir()) == ["base-1.log", "base-2.log", "spec-1.log",
                                                               "spec-2.log"]  # fmt: skip

    # ABBA: base, spec in round 1, spec, base in round 2, told by the wall-clock anchors of the trials
    first = {(name, t.trial): t.started_at for name, run in result.runs.items() for t in run.levels[0].trials}
    assert first[("base", 0)] < first[("spec", 0)] < first[("spec", 1)] < first[("base", 1)]

    # comparison and checklist
    comp = json.loads((out / "comparison.json").read_text())
    assert comp["baseline"] == "base"
    verdicts = comp["configs"]["spec"]["verdicts"]
    assert [v["concurrency"] for v in verdicts] == [1, 2]
    assert all(v["verdict"] in ("faster", "slower", "no_difference", "inconclusive") for v in verdicts)
    diff = {d["key"]: d for d in comp["configs"]["spec"]["config_diff"]}
    assert diff["server_info.speculative_algorithm"] == {
        "key": "server_info.speculative_algorithm", "a": None, "b": "EAGLE", "expected": True,
    }  # fmt: skip
    assert not [
        d for d in diff.values() if not d["expected"]
    ]  # nothing changed that the flags do not explain
    checklist = (out / "checklist.md").read_text()
    assert checklist == result.checklist
    lines = [ln for ln in checklist.splitlines() if ln.startswith("- ")]
    assert lines[0] == "- base: baseline (sglang; C=1,2, 2 trials per level)"
    assert lines[1].startswith("- spec: tested, ") and "C=1 " in lines[1] and "C=2 " in lines[1]
    md = (out / "comparison.md").read_text()
    assert "## spec vs base" in md and "| C | A | B | Change | 95% CI | Verdict | Note |" in md
    assert any(e.startswith("spec: ready after") for e in events)


def test_assertion_at_start_is_named_and_the_campaign_goes_on(tmp_path: Path, token: str) -> None:
    p = plan(
        [
            {"name": "nextn", "argv": ref(token, "--fail-start", "speculative_eagle_topk must be None")},
            {"name": "base", "argv": ref(token), "baseline": True},
        ],
        trials=2,
    )
    shown = io.StringIO()
    result = run_campaign(p, tmp_path / "out", console=Console(file=shown, force_terminal=True, width=200))
    assert "root cause: AssertionError: speculative_eagle_topk must be None" in shown.getvalue()
    t = result.failures["nextn"]
    assert isinstance(t, Triage)
    assert t.root_cause == "AssertionError: speculative_eagle_topk must be None"
    assert t.exit_code == 1
    line = next(ln for ln in result.checklist.splitlines() if ln.startswith("- nextn"))
    assert line == (
        "- nextn: crashed at start: AssertionError: speculative_eagle_topk must be None "
        "(see logs/nextn-1.log)"
    )
    # the failure was recorded once; round 2 did not launch it again; the baseline ran both rounds
    logs = sorted(f.name for f in (tmp_path / "out" / "logs").iterdir())
    assert logs == ["base-1.log", "base-2.log", "nextn-1.log"]
    assert [len(lv.trials) for lv in result.runs["base"].levels] == [2, 2]
    comp = json.loads((tmp_path / "out" / "comparison.json").read_text())
    (failure,) = comp["configs"]["nextn"]["failures"]
    assert failure["kind"] == "start" and failure["tail"][-1] == t.tail[-1]


def test_server_dying_mid_level_is_restarted_once_and_only_that_cell_rerun(
    tmp_path: Path, token: str
) -> None:
    # The first launch exits hard after 4 finished requests (no warmup): C=1's 3, then 1 of C=2's 3, so the
    # C=2 cell is spoiled. The marker file makes the restarted server (same command line) live.
    marker = tmp_path / "died-once"
    live = shlex.join(ref(token)).replace("'{port}'", "{port}")
    line = f"if [ -e {marker} ]; then exec {live}; else touch {marker}; exec {live} --die-after 4; fi"
    p = plan([{"name": "flaky", "shell": True, "argv": [line]}], sweep={"warmup": 0})
    with Store(tmp_path / "tokbench.db") as store:
        result = run_campaign(p, tmp_path / "out", store=store)
        # the store keeps both attempts of the cell; figures (the default view) use the re-run, as the results
        run_id = result.runs["flaky"].meta.run_id
        every = store.load_run(run_id, superseded=True).levels[1].trials
        assert sorted((t.retry, t.interrupted) for t in every) == [(False, True), (True, False)]
        assert [t.retry for t in store.load_run(run_id).levels[1].trials] == [True]
    out = tmp_path / "out"

    run = result.runs["flaky"]
    by_level = {lv.concurrency: lv.trials for lv in run.levels}
    assert [(t.trial, t.retry) for t in by_level[1]] == [(0, False)]  # measured once, before the crash
    assert [(t.trial, t.retry) for t in by_level[2]] == [(0, True)]  # the spoiled cell, re-run
    assert all(r.ok for t in run.levels[1].trials for r in t.records)
    failed = json.loads((out / "results" / "flaky.failed-attempts.json").read_text())
    assert [(lv["concurrency"], len(lv["trials"])) for lv in failed["levels"]] == [(2, 1)]
    assert failed["levels"][0]["trials"][0]["interrupted"] is True
    assert sorted(f.name for f in (out / "logs").iterdir()) == ["flaky-1.log", "flaky-2.log"]  # one restart
    (crash,) = result.outcomes[0].failures
    assert crash.kind == "crash" and crash.cell == (2, 0) and crash.recovered
    assert "flaky" not in result.failures
    assert "server died at C=2 trial 1" in result.checklist and "that cell was re-run" in result.checklist


def test_blocked_design_with_closing_baseline_run(tmp_path: Path, token: str) -> None:
    p = plan(
        [
            {"name": "a", "engine": "llamacpp", "argv": ref(token, "--personality", "llamacpp")},
            {
                "name": "b",
                "engine": "llamacpp",
                "argv": ref(token, "--personality", "llamacpp", "--speed", "44"),
            },
        ],
        design="blocked",
        trials=2,
        sweep={"concurrencies": [2]},
    )
    result = run_campaign(p, tmp_path / "out")
    assert set(result.runs) == {"a", "b", "a-closing"}
    assert result.drift is not None and [v.concurrency for v in result.drift] == [2]
    assert "- drift: the baseline re-run at the end vs its first run: " in result.checklist
    resolved = json.loads((tmp_path / "out" / "resolved" / "a.json").read_text())
    assert resolved["props"]["model_path"] == token and resolved["slots"]["count"] >= 1
    # all trials of a launch come from one server: one log per run
    assert sorted(f.name for f in (tmp_path / "out" / "logs").iterdir()) == ["a-1.log", "a-2.log", "b-1.log"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_servers_and_keeps_what_was_measured(tmp_path: Path, token: str, sig: int) -> None:
    plan_file = tmp_path / "plan.yaml"
    slow = [a if a != "40" else "2" for a in ref(token)]  # slow enough to be caught mid-trial
    plan_file.write_text(
        json.dumps(
            {
                "configs": [
                    {"name": "a", "argv": slow, "ready_marker": "ready on"},
                    {"name": "b", "argv": slow},
                ],
                "sweep": {**SWEEP, "max_tokens": 200, "warmup": 0},
            }
        )
    )
    out = tmp_path / "out"
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tokbench",
            "campaign",
            "run",
            str(plan_file),
            "--out",
            str(out),
            "--no-store",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        log = out / "logs" / "a-1.log"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (log.exists() and "ready on" in log.read_text()):
            time.sleep(0.05)
        time.sleep(0.5)  # into the first trial
        cli.send_signal(sig)
        _, err = cli.communicate(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 130, err
    assert "interrupted" in err
    checklist = (out / "checklist.md").read_text()
    assert "**Interrupted**" in checklist
    comp = json.loads((out / "comparison.json").read_text())
    assert set(comp["configs"]) == {"a", "b"}
    # the trial cut short is kept as data, apart from the figures
    partial = json.loads((out / "results" / "a.failed-attempts.json").read_text())
    (trial,) = partial["levels"][0]["trials"]
    assert trial["interrupted"] is True and trial["records"]
